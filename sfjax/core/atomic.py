"""Atomic file writes: a crash leaves the old file or the new one, never a torn one.

The data goes to a temporary file in the same directory, is flushed and fsynced,
renamed over the target (`os.replace` is atomic on POSIX), and the directory is
fsynced so the rename itself survives a power loss.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import IO


def fsync_directory(path: str) -> None:
  """fsyncs directory `path` (makes a rename or a new file in it durable)."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def atomic_write(path: str, data: str | bytes | Callable[[IO], None]) -> None:
  """Writes `data` to `path` atomically.

  Args:
    path: the target file; its directory is created if missing.
    data: text (written as UTF-8), bytes, or a function that writes to the open
      binary file object (e.g. `lambda f: np.savez(f, ...)`).
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = f"{path}.tmp.{os.getpid()}"
  try:
    with open(tmp, "wb") as f:
      if callable(data):
        data(f)
      else:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  fsync_directory(directory)
