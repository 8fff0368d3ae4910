"""One owner per workdir: an exclusive `flock` on a file in the directory.

  with hold_workdir(workdir, "train_ctr"):
    ...  # only this process writes workdir's files

The lock is `fcntl.flock(LOCK_EX | LOCK_NB)` on `<workdir>/.sfjax.lock` (a rank p > 0 of a
run over several processes locks `.sfjax.lock.process_<p>`: its own files). The OS
releases it when the process dies, however it dies (SIGKILL included), so a crashed
run never leaves a stale lock; the file itself stays and is reused. The holder writes
its pid, host, start time and command line into the file, so a second run on the same
workdir fails at once with one line naming them (`WorkdirLockedError`).

A flock belongs to an open file: a second `hold_workdir` of the same workdir fails even in the
same process (two trainers on one workdir in a notebook are as unsafe as two
processes). Issue #25, item 1.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

LOCK_FILE = ".sfjax.lock"
_UNNAMED = "a process that has not yet written its name"
_NAME_WAITS = 25  # x 20 ms: how long a loser waits for the holder's name


class WorkdirLockedError(RuntimeError):
  """Another process (or handle) owns the workdir; the message names the holder."""


def lock_path(workdir: str, process_index: int = 0) -> str:
  """The lock file of `workdir` for process `process_index` (0: the workdir's own files)."""
  name = LOCK_FILE if process_index == 0 else f"{LOCK_FILE}.process_{process_index}"
  return os.path.join(workdir, name)


def _holder_record(what: str) -> dict[str, Any]:
  """Who holds the lock: pid, host, start time (UTC, ISO 8601), what and the command line."""
  return {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
          "what": what, "command": " ".join(sys.argv)}


def describe_holder(path: str) -> str:
  """`pid P on HOST since TIME (COMMAND)` from the lock file at `path` (or what is known)."""
  try:
    with open(path, encoding="utf-8") as f:
      holder = json.loads(f.read() or "{}")
  except (OSError, ValueError):
    holder = {}
  if not isinstance(holder, dict) or "pid" not in holder:
    return _UNNAMED
  command = holder.get("command") or holder.get("what") or "?"
  return (f"pid {holder['pid']} on {holder.get('host', '?')} since {holder.get('started', '?')} "
          f"({command})")


class WorkdirLock:
  """A held workdir lock; `release()` (or leaving `hold_workdir`'s block) frees it."""

  def __init__(self, path: str, handle: IO[str]):
    self.path = path
    self._handle: IO[str] | None = handle

  @property
  def held(self) -> bool:
    """True until `release`."""
    return self._handle is not None

  def release(self) -> None:
    """Unlocks (idempotent). The file stays: deleting it could race with a new owner."""
    if self._handle is not None:
      self._handle.close()  # closing the last descriptor drops the flock
      self._handle = None


def acquire(workdir: str, what: str = "", process_index: int = 0) -> WorkdirLock:
  """Takes `workdir`'s lock (creating the directory), or fails at once.

  Args:
    workdir: the directory owned.
    what: what the holder is doing (e.g. 'train_ctr'), written into the lock file.
    process_index: this process's rank in a run over several processes (its own lock).

  Raises:
    WorkdirLockedError: another process or handle holds it; the message names its pid,
      host, start time and command.
    NotADirectoryError: `workdir` is a file.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise NotADirectoryError(f"{workdir}: the workdir is a file, not a directory")
  os.makedirs(workdir, exist_ok=True)
  path = lock_path(workdir, process_index)
  handle = open(path, "a+", encoding="utf-8")  # pylint: disable=consider-using-with
  try:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.close()
    holder = describe_holder(path)
    for _ in range(_NAME_WAITS):  # the holder writes its name right after locking
      if holder != _UNNAMED:
        break
      time.sleep(0.02)
      holder = describe_holder(path)
    raise WorkdirLockedError(f"{workdir} is in use by {holder}; wait for it to end or use "
                             "another workdir") from None
  try:
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(_holder_record(what)))
    handle.flush()
  except BaseException:
    handle.close()
    raise
  return WorkdirLock(path, handle)


@contextlib.contextmanager
def hold_workdir(workdir: str | None, what: str = "", process_index: int = 0) -> Iterator[
    WorkdirLock | None]:
  """`acquire` for the block, released after it (whatever happens); None workdir: no lock."""
  if not workdir:
    yield None
    return
  lock = acquire(workdir, what, process_index)
  try:
    yield lock
  finally:
    lock.release()
