"""Checkpoint reads that retry a transient `OSError` before anything is declared corrupt.

A checkpoint file that fails to read is not necessarily damaged: a network file system's
hiccup, `EIO` from a busy disk, `EINTR`, `EMFILE`. Declaring it corrupt moves the
checkpoint aside and resumes from an older one, losing the work since (issue #25). So a
missing path (or a directory where a file belongs) is damage, and any other `OSError` is
retried `ATTEMPTS` times with a doubling pause; if it persists, `CheckpointReadError` (an
`OSError` naming the file) stops the caller and nothing is moved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from absl import logging

ATTEMPTS = 4
_FIRST_PAUSE_S = 0.05  # then 0.1, 0.2 s: about a third of a second in all
MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)  # damage, never retried

T = TypeVar("T")


class CheckpointReadError(OSError):
  """A checkpoint file stayed unreadable through every retry (not evidence of corruption)."""


def read_retrying(read: Callable[[], T], path: str, *, attempts: int = ATTEMPTS,
                  sleep: Callable[[float], None] = time.sleep) -> T:
  """`read()`, retried while it raises an `OSError` other than a missing file.

  Args:
    read: reads (part of) the file `path`; called up to `attempts` times.
    path: the file, for the messages.
    attempts: calls before giving up (>= 1).
    sleep: the pause between calls (seconds; tests pass a recorder).

  Returns:
    What `read` returned.

  Raises:
    FileNotFoundError / IsADirectoryError / NotADirectoryError: at once, from `read`.
    CheckpointReadError: every call raised another `OSError`; same errno, names `path`.
  """
  if attempts < 1:
    raise ValueError(f"read_retrying: attempts must be >= 1, got {attempts}")
  pause = _FIRST_PAUSE_S
  for attempt in range(1, attempts + 1):
    try:
      return read()
    except MISSING:
      raise
    except OSError as err:
      if attempt == attempts:
        raise CheckpointReadError(err.errno, f"{path}: still unreadable after {attempts} "
                                  f"attempts ({err.strerror or err}); the checkpoint is kept, "
                                  "not declared corrupt: retry when the storage recovers") from err
      logging.warning("%s: read failed (%s); retrying in %.2f s", path, err, pause)
      sleep(pause)
      pause *= 2
  raise AssertionError("unreachable")
