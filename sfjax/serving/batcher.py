"""Dynamic batching: many small requests, one predictor call per batch (issue #23 item 5).

Requests (a pytree of host arrays with the examples on the leading axis, e.g.
`sfjax.serving.Features`) wait in one bounded queue. A single worker thread takes the
oldest request and closes its batch when the batch holds `max_batch` examples or when
`max_delay_ms` have passed since that request arrived, whichever comes first; it merges
the requests (`np.concatenate` of each field, or the caller's `merge_fn`: the HTTP
endpoint merges lists of raw records), calls `predict_fn` once and hands each request
its slice of the scores through its own future. A merged call that raises is run again
request by request, so a bad request fails alone and its batch-mates get their scores.

Why one worker thread: XLA:CPU already spreads one call over every core, so a second
caller would only make two calls fight for the same cores; the event loop stays free to
parse requests while the worker waits on XLA (which releases the GIL). Padding to a
compiled batch size is the predictor's job, never the batcher's.

While the worker runs a batch, the queue does the batching by itself: a batch whose
oldest request already waited `max_delay_ms` closes at once with everything queued (up
to `max_batch` examples), so the batch size grows with the load. The default delay is
0: a batch closes as soon as the worker is free. Measured with `experiments.bench_serving`
on 2 cores (1 example per request, 16 connections, the HTTP endpoint parsing each batch's
records in one call): waiting 2 ms grew the mean batch from 9 to 15 examples but left the
server's CPU per request where it was (0.23 vs 0.24 ms), while it adds up to 2 ms to
every request at low load. A positive delay pays where a call's fixed cost dominates (an
accelerator). A full queue refuses a request (`QueueFull`, HTTP 503) instead of growing
without bound.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np


class QueueFull(RuntimeError):
  """The batcher's queue holds `max_queue` examples already; try again later."""


@dataclasses.dataclass(frozen=True)
class BatcherSettings:
  """How requests are grouped.

  Attributes:
    max_batch: a batch closes once it holds this many examples (a request larger than
      this runs alone; the predictor splits it).
    max_delay_ms: ... or once its oldest request waited this long.
    max_queue: examples allowed to wait; a request beyond them is refused (`QueueFull`).
  """

  max_batch: int = 256
  max_delay_ms: float = 0.0
  max_queue: int = 16384

  def __post_init__(self):
    for name in ("max_batch", "max_queue"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"BatcherSettings.{name}: must be an int >= 1, got {value!r}")
    if not self.max_delay_ms >= 0:
      raise ValueError(f"BatcherSettings.max_delay_ms: must be >= 0, got {self.max_delay_ms!r}")


class BatcherStats(NamedTuple):
  """Cumulative counters of a batcher (`examples / batches` is the mean batch size)."""

  requests: int  # requests answered (results or errors)
  examples: int  # examples in them
  batches: int  # predictor calls (a failed merged call too)
  largest_batch: int  # most examples in one call
  rejected: int  # requests refused because the queue was full
  failed_batches: int  # predictor calls that raised (a merged one, then each alone)


class _Request(NamedTuple):
  features: Any  # a pytree of arrays [n, ...]
  size: int  # n
  arrived: float  # time.monotonic() at submit
  future: concurrent.futures.Future


def num_examples(features: Any) -> int:
  """The examples in `features`: the leading size of its first field."""
  return len(features[0])


def merge(parts: Sequence[Any]) -> Any:
  """One request of the same type from `parts`, each field concatenated along examples (an
  absent field, None in every part, stays None)."""
  if len(parts) == 1:
    return parts[0]
  fields = [None if column[0] is None else np.concatenate(column)
            for column in zip(*parts, strict=True)]
  kind = type(parts[0])
  return kind(*fields) if hasattr(kind, "_fields") else kind(fields)


def take_batch(queue: collections.deque, max_batch: int) -> list[_Request]:
  """Pops the oldest requests whose examples fit in `max_batch` (always at least one)."""
  batch = [queue.popleft()]
  total = batch[0].size
  while queue and total + queue[0].size <= max_batch:
    total += queue[0].size
    batch.append(queue.popleft())
  return batch


class DynamicBatcher:
  """Groups requests for `predict_fn` on one worker thread (see the module docstring).

  Usage:
    batcher = DynamicBatcher(predictor.predict_features, BatcherSettings(max_batch=256))
    scores = batcher.submit(features).result()      # from a thread
    scores = await batcher.predict_async(features)  # from an event loop
    batcher.close()
  """

  def __init__(self, predict_fn: Callable[[Any], np.ndarray],
               settings: BatcherSettings = BatcherSettings(), *,
               merge_fn: Callable[[list[Any]], Any] = merge,
               size_fn: Callable[[Any], int] = num_examples):
    """Starts the worker thread.

    Args:
      predict_fn: `features [n, ...] -> scores [n]` (or `[n, ...]`: each request gets its
        rows), called by the worker thread only.
      settings: the batch and queue bounds.
      merge_fn: requests -> one request of their examples in order (default `merge`: a
        pytree of arrays; `lambda parts: sum(parts, [])` for lists of records).
      size_fn: a request's number of examples (default `num_examples`; `len` for a list).
    """
    self.settings = settings
    self._predict_fn = predict_fn
    self._merge_fn, self._size_fn = merge_fn, size_fn
    self._queue: collections.deque[_Request] = collections.deque()
    self._queued_examples = 0
    self._cond = threading.Condition()
    self._closed = False
    self._counts = dict.fromkeys(BatcherStats._fields, 0)
    self._worker = threading.Thread(target=self._run, name="sfjax-batcher", daemon=True)
    self._worker.start()

  def submit(self, features: Any) -> concurrent.futures.Future:
    """Queues one request; its future resolves to its scores `[n]` (or the error).

    Raises:
      QueueFull: the queue already holds `max_queue` examples.
      RuntimeError: the batcher is closed.
    """
    size = self._size_fn(features)
    future: concurrent.futures.Future = concurrent.futures.Future()
    if size == 0:
      future.set_result(np.zeros((0,), np.float32))
      return future
    with self._cond:
      if self._closed:
        raise RuntimeError("DynamicBatcher.submit: the batcher is closed")
      if self._queued_examples + size > self.settings.max_queue:
        self._counts["rejected"] += 1
        raise QueueFull(f"queue full: {self._queued_examples} examples waiting, this request "
                        f"adds {size}, max_queue={self.settings.max_queue}")
      self._queue.append(_Request(features, size, time.monotonic(), future))
      self._queued_examples += size
      self._cond.notify()
    return future

  async def predict_async(self, features: Any) -> np.ndarray:
    """`submit(features)`, awaited on the running event loop; scores `[n]`."""
    return await asyncio.wrap_future(self.submit(features))

  def stats(self) -> BatcherStats:
    """The counters so far."""
    with self._cond:
      return BatcherStats(**self._counts)

  def close(self, timeout: float | None = 30.0) -> None:
    """Refuses new requests, answers the queued ones, stops the worker."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()
    self._worker.join(timeout)

  def __enter__(self) -> DynamicBatcher:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _next_batch(self) -> list[_Request] | None:
    """Blocks until a batch closes (full, or its oldest request's delay is up)."""
    max_batch, delay = self.settings.max_batch, self.settings.max_delay_ms * 1e-3
    with self._cond:
      while not self._queue:
        if self._closed:
          return None
        self._cond.wait()
      deadline = self._queue[0].arrived + delay
      while self._queued_examples < max_batch and not self._closed:
        left = deadline - time.monotonic()
        if left <= 0:
          break
        self._cond.wait(left)
      batch = take_batch(self._queue, max_batch)
      self._queued_examples -= sum(r.size for r in batch)
    return [r for r in batch if r.future.set_running_or_notify_cancel()]

  def _run(self) -> None:
    while (batch := self._next_batch()) is not None:
      if batch:
        self._execute(batch)

  def _execute(self, batch: list[_Request]) -> None:
    sizes = [r.size for r in batch]
    total = sum(sizes)
    try:
      scores = np.asarray(self._predict_fn(self._merge_fn([r.features for r in batch])))
      if scores.shape[:1] != (total,):
        raise ValueError(f"DynamicBatcher: predict_fn returned shape {scores.shape} for "
                         f"{total} examples")
    except Exception as err:  # the worker lives; a bad request fails alone
      if len(batch) > 1:
        self._count([], 0, failed=1)
        for r in batch:
          self._execute([r])
        return
      self._count(batch, total, failed=1)
      batch[0].future.set_exception(err)
    else:
      # Counted before any answer goes out: a caller that reads stats() after its answer
      # sees its own batch.
      self._count(batch, total, failed=0)
      ends = np.cumsum(sizes)
      for r, end, size in zip(batch, ends, sizes, strict=True):
        r.future.set_result(scores[end - size:end])

  def _count(self, batch: list[_Request], total: int, failed: int) -> None:
    """Adds one executed batch to the counters."""
    with self._cond:
      c = self._counts
      c["requests"] += len(batch)
      c["examples"] += total
      c["batches"] += 1
      c["largest_batch"] = max(c["largest_batch"], total)
      c["failed_batches"] += failed
