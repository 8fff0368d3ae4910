"""Errors that name the bad place: a file and line, or a dotted config field.

`ConfigError` is the one base of every config error: the search's
(`sfjax.ctr_search.search_config.SearchConfigError`), the pipeline's
(`sfjax.automl.pipeline.PipelineConfigError`) and the space language's
(`sfjax.automl.space.SpaceConfigError`, a point that does not fit its space)
subclass it, so `except ConfigError` catches each of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DataFormatError(ValueError):
  """Malformed input. The message always names the file and the 1-based line."""

  def __init__(self, path: str, line: int, reason: str):
    self.path = path
    self.line = line
    self.reason = reason
    super().__init__(f"{path}:{line}: {reason}")


class ConfigError(ValueError):
  """A config value is invalid; the message names the dotted field (`config field a.b: ...`)."""


def closest_name(name: str, known: Iterable[str]) -> str | None:
  """The name of `known` closest to a misspelt `name` (difflib's ratio >= 0.6), else None."""
  matches = difflib.get_close_matches(name, [str(k) for k in known], n=1)
  return matches[0] if matches else None


def unknown_key_error(field: str, key: str, known: Iterable[str], what: str = "key") -> ConfigError:
  """`config field <field>.<key>: unknown <what>; did you mean '<closest>'? (known: ...)`.

  Args:
    field: the dotted field holding the key ('' at the top level).
    key: the unknown key.
    known: the keys that field takes.
    what: what the key is, for the message (e.g. 'study setting').
  """
  known = sorted(str(k) for k in known)
  guess = closest_name(key, known)
  hint = f"; did you mean {f'{field}.' if field else ''}{guess}?" if guess else ""
  return ConfigError(f"config field {f'{field}.' if field else ''}{key}: unknown {what}{hint} "
                     f"(known: {', '.join(known)})")
