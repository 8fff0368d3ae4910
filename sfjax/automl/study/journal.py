"""Append-only JSON-lines journal: one event per line, flushed and fsynced.

Why a journal rather than SQLite: a study's writes are a single stream of small
events from one process; a text journal is readable with `head`/`jq`, diffable,
needs no schema migration, and its crash story is simple. Each event is one
`write()` of a complete line ending in '\\n', followed by `fsync`, so a crash
(SIGKILL, power loss) can only leave the *last* line incomplete. On open such a
torn last line is dropped with a warning and cut off the file, so the next append
starts on a fresh line; an unparsable line anywhere else is corruption and raises
`JournalError` naming the file and line. An exclusive `flock` keeps a second
process (or a second open in this one) from interleaving writes; the kernel
releases it when the holder dies.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from typing import Any

from sfjax.core.atomic import fsync_directory
from sfjax.core.errors import DataFormatError


class JournalError(DataFormatError):
  """A corrupt or inconsistent journal; the message names the file and 1-based line."""


class JournalLockedError(RuntimeError):
  """The journal is open in another process (or another handle in this one)."""


class Journal:
  """An open, locked journal file. Use `Journal.open`; close with `close()`."""

  def __init__(self, path: str, handle):
    self.path = path
    self._handle = handle

  @classmethod
  def open(cls, path: str) -> tuple[Journal, list[tuple[int, dict[str, Any]]]]:
    """Opens (creating if needed) and locks `path`; returns it with its records.

    Returns:
      The journal, and `(line_number, record)` for every complete line.

    Raises:
      JournalLockedError: another handle holds the lock.
      JournalError: a line other than the last is not a JSON object.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    created = not os.path.exists(path)
    handle = open(path, "a+b")  # pylint: disable=consider-using-with
    try:
      fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.close()
      raise JournalLockedError(f"{path} is open in another study (process or handle)") from None
    try:
      if created:
        fsync_directory(directory)
      handle.seek(0)
      records, valid_bytes = _parse(path, handle.read())
      if valid_bytes != handle.tell():
        handle.truncate(valid_bytes)
        os.fsync(handle.fileno())
      handle.seek(0, os.SEEK_END)
    except BaseException:
      handle.close()  # a corrupt journal must not stay locked by the failed open
      raise
    return cls(path, handle), records

  def append(self, record: dict[str, Any]) -> None:
    """Writes `record` as one line and makes it durable before returning."""
    line = json.dumps(record, sort_keys=True) + "\n"
    self._handle.write(line.encode("utf-8"))
    self._handle.flush()
    os.fsync(self._handle.fileno())

  def close(self) -> None:
    """Releases the lock and closes the file (idempotent)."""
    if not self._handle.closed:
      self._handle.close()


def _parse(path: str, data: bytes) -> tuple[list[tuple[int, dict]], int]:
  """Complete records and the byte length of the valid prefix of `data`."""
  records: list[tuple[int, dict]] = []
  offset = 0
  lines = data.split(b"\n")
  # `lines[-1]` is what follows the last newline: b'' for a cleanly ended file.
  for number, raw in enumerate(lines, start=1):
    is_last = number == len(lines) or (number == len(lines) - 1 and not lines[-1])
    if number == len(lines) and not raw:
      break
    try:
      if number == len(lines):
        raise ValueError("no newline at end of line")
      record = json.loads(raw.decode("utf-8"))
      if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    except (ValueError, UnicodeDecodeError) as e:
      if is_last:
        warnings.warn(f"{path}:{number}: ignoring a torn last line ({len(raw)} bytes, {e}); "
                      "the process probably died while writing it", RuntimeWarning, stacklevel=3)
        return records, offset
      raise JournalError(path, number, f"corrupt journal line: {e}") from None
    records.append((number, record))
    offset += len(raw) + 1
  return records, offset
