"""Errors that name the bad place: a file and line, or a dotted config field."""

from __future__ import annotations


class DataFormatError(ValueError):
  """Malformed input. The message always names the file and the 1-based line."""

  def __init__(self, path: str, line: int, reason: str):
    self.path = path
    self.line = line
    self.reason = reason
    super().__init__(f"{path}:{line}: {reason}")


class ConfigError(ValueError):
  """A config value is invalid; the message names the dotted field (`config field a.b: ...`)."""
