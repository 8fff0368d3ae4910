"""A bounded background stage: runs a producer iterator on a thread, ahead of the consumer.

This is the building block of the host pipeline (Data-Loader -> Host-Manager ->
Device-Worker). An exception in the producer stops it and is re-raised in the
consumer with the original traceback; `close()` (or leaving a `with` block)
stops the thread without leaving it hanging on a full queue.

A stage may run at a lower CPU priority (`nice`, Linux): a host-preparation thread
then takes the cores when XLA's step threads leave them idle instead of preempting
them mid-matmul (issue #27: on 2 cores the end-to-end step gained ~2-4% at nice 10).
`nice=IDLE` puts it under SCHED_IDLE instead: any other thread that wakes takes its core
at once (nice 19 still lets it finish a slice first). That hides more host work behind
XLA on a dedicated machine, but the thread all but stops while other processes keep
every core busy, so it is an opt-in (`train.loader_idle`).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")

_DONE = object()
IDLE = 20  # `nice` value of a stage under SCHED_IDLE (below every niceness; Linux)


class _Failure:

  def __init__(self, exc: BaseException):
    self.exc = exc


class BackgroundIterator(Iterator[T]):
  """Iterates `source` on a daemon thread, keeping at most `maxsize` items ready.

  Args:
    source: an iterable; iterated only on the background thread.
    maxsize: queue bound (>= 1): how far the producer may run ahead.
    name: thread name, shown in tracebacks and debuggers.
    nice: the producer thread's niceness (0-19, or `IDLE`; `lower_thread_priority`), 0: as
      created.
  """

  def __init__(self, source: Iterable[T], maxsize: int = 2, name: str = "sfjax-stage",
               nice: int = 0):
    if maxsize < 1:
      raise ValueError(f"maxsize must be >= 1, got {maxsize}")
    if not 0 <= nice <= IDLE:
      raise ValueError(f"nice must be in [0, 19] or IDLE ({IDLE}), got {nice}")
    self._nice = nice
    self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
    self._stop = threading.Event()
    self._finished = False
    self._thread = threading.Thread(target=self._run, args=(iter(source),), name=name, daemon=True)
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.05)
        return True
      except queue.Full:
        continue
    return False

  def _run(self, it: Iterator[T]) -> None:
    if self._nice:
      lower_thread_priority(self._nice)
    try:
      for item in it:
        if not self._put(item):
          return
      self._put(_DONE)
    except BaseException as exc:  # pylint: disable=broad-except
      self._put(_Failure(exc))
    finally:
      close = getattr(it, "close", None)
      if close is not None:
        try:
          close()
        except Exception:  # pylint: disable=broad-except
          pass

  def __next__(self) -> T:
    if self._finished:
      raise StopIteration
    while True:
      try:
        item = self._queue.get(timeout=0.1)
        break
      except queue.Empty:
        if not self._thread.is_alive() and self._queue.empty():
          self._finished = True
          raise StopIteration from None
    if item is _DONE:
      self._finished = True
      self._thread.join()
      raise StopIteration
    if isinstance(item, _Failure):
      self._finished = True
      self.close()
      raise item.exc.with_traceback(item.exc.__traceback__)
    return item

  def close(self) -> None:
    """Stops the producer thread and waits for it to exit."""
    self._stop.set()
    while True:  # unblock a producer waiting on a full queue
      try:
        self._queue.get_nowait()
      except queue.Empty:
        break
    if self._thread is not threading.current_thread():
      self._thread.join(timeout=10.0)
    self._finished = True

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()


def map_in_background(fn: Callable[[T], U], source: Iterable[T], maxsize: int = 2,
                      name: str = "sfjax-stage", nice: int = 0) -> BackgroundIterator[U]:
  """`BackgroundIterator` over `fn(x) for x in source`."""
  return BackgroundIterator((fn(x) for x in source), maxsize=maxsize, name=name, nice=nice)


def lower_thread_priority(nice: int) -> bool:
  """Raises the calling thread's niceness to at least `nice` (Linux schedules threads
  apart: the rest of the process keeps its priority); `nice=IDLE`: puts it under
  SCHED_IDLE (it runs only on a core no other thread wants; it cannot come back).

  Returns:
    Whether the priority was set (False off Linux, or if the system refused).
  """
  if not sys.platform.startswith("linux"):
    return False
  tid = threading.get_native_id()
  try:
    if nice >= IDLE:
      os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    else:
      os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
  except OSError:
    return False
  return True
