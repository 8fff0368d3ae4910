"""sfjax/serving/batcher.py: requests merged into batches, each answered with its own scores."""

import asyncio
import collections
import threading
import time
from typing import NamedTuple

import numpy as np
import pytest

from sfjax.serving import Features
from sfjax.serving.batcher import (
  BatcherSettings,
  DynamicBatcher,
  QueueFull,
  _Request,
  merge,
  take_batch,
)


class Rows(NamedTuple):
  """A request of the predictor's shape: ids [n, F] and dense [n, Nd]."""

  ids: np.ndarray
  dense: np.ndarray


def _rows(start: int, n: int) -> Rows:
  ids = np.arange(start, start + n, dtype=np.int64)[:, None] * np.array([[1, 10]])
  return Rows(ids, np.full((n, 1), 0.5, np.float32) * ids[:, :1])


def _score(rows: Rows) -> np.ndarray:
  """A real function of every field: ids[:, 0] + ids[:, 1] + dense[:, 0] (= 11.5 x start)."""
  return (rows.ids.sum(1) + rows.dense[:, 0]).astype(np.float32)


class Recorder:
  """`_score`, recording each call's batch size; `gate` (if set) holds calls until released."""

  def __init__(self, gate: threading.Event | None = None):
    self.sizes, self.gate = [], gate

  def __call__(self, rows: Rows) -> np.ndarray:
    if self.gate is not None:
      self.gate.wait(10)
    self.sizes.append(len(rows.ids))
    return _score(rows)


def test_merge_concatenates_each_field_and_keeps_the_type():
  merged = merge([_rows(0, 2), _rows(5, 3)])
  assert isinstance(merged, Rows)
  np.testing.assert_array_equal(merged.ids[:, 0], [0, 1, 5, 6, 7])
  np.testing.assert_array_equal(merged.dense[:, 0], [0, 0.5, 2.5, 3, 3.5])


def test_merge_of_plain_tuples_and_lists_keeps_their_type():
  for kind in (tuple, list):
    merged = merge([kind(_rows(0, 2)), kind(_rows(5, 1))])
    assert type(merged) is kind and len(merged) == 2
    np.testing.assert_array_equal(merged[0][:, 1], [0, 10, 50])
    np.testing.assert_array_equal(merged[1][:, 0], [0, 0.5, 2.5])
  single = (np.arange(3),)
  assert merge([single]) is single  # one part: itself, no copy


def test_merge_keeps_an_absent_field_absent_and_concatenates_a_present_one():
  a, b = _rows(0, 2), _rows(5, 3)
  merged = merge([Features(a.ids, a.dense), Features(b.ids, b.dense)])
  assert merged.weights is None and merged.ids.shape == (5, 2)
  merged = merge([Features(a.ids, a.dense, np.ones((2, 2), np.float32)),
                  Features(b.ids, b.dense, np.zeros((3, 2), np.float32))])
  np.testing.assert_array_equal(merged.weights[:, 0], [1, 1, 0, 0, 0])


def test_take_batch_stops_before_max_batch_but_takes_one_oversized_request():
  queue = collections.deque(_Request(None, n, 0.0, None) for n in (3, 4, 2, 9))
  assert [r.size for r in take_batch(queue, 8)] == [3, 4]  # 3 + 4 + 2 > 8
  assert [r.size for r in take_batch(queue, 8)] == [2]
  assert [r.size for r in take_batch(queue, 8)] == [9]  # alone, the predictor splits it
  assert not queue


def test_concurrent_requests_share_batches_and_each_gets_its_own_scores():
  fn = Recorder()
  with DynamicBatcher(fn, BatcherSettings(max_batch=64, max_delay_ms=20)) as batcher:
    results = {}

    def client(k):
      for j in range(5):
        start = 100 * k + 10 * j
        results[start] = (batcher.submit(_rows(start, 1 + (k % 3))).result(10), 1 + (k % 3))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    stats = batcher.stats()
  for start, (scores, n) in results.items():
    np.testing.assert_array_equal(scores, _score(_rows(start, n)))
  assert stats.requests == 80 and stats.examples == sum(n for _, n in results.values())
  assert stats.batches == len(fn.sizes) < 80  # requests shared predictor calls
  assert max(fn.sizes) == stats.largest_batch <= 64
  assert stats.rejected == stats.failed_batches == 0


def test_a_batch_closes_at_max_batch_examples():
  fn = Recorder()
  start = time.monotonic()
  with DynamicBatcher(fn, BatcherSettings(max_batch=8, max_delay_ms=10_000)) as batcher:
    futures = [batcher.submit(_rows(i, 1)) for i in range(16)]
    for i, f in enumerate(futures):
      np.testing.assert_array_equal(f.result(5), _score(_rows(i, 1)))
  # Two full batches closed at 8 examples each, long before the 10 s delay.
  assert fn.sizes == [8, 8] and time.monotonic() - start < 5.0


def test_a_lone_request_waits_for_max_delay_and_no_longer():
  fn = Recorder()
  with DynamicBatcher(fn, BatcherSettings(max_batch=64, max_delay_ms=150)) as batcher:
    t = time.monotonic()
    batcher.submit(_rows(0, 1)).result(10)
    waited = time.monotonic() - t
  assert 0.14 <= waited < 2.0, waited
  with DynamicBatcher(fn, BatcherSettings(max_batch=1, max_delay_ms=10_000)) as batcher:
    t = time.monotonic()
    batcher.submit(_rows(0, 1)).result(10)  # full at one example: no waiting
    assert time.monotonic() - t < 2.0


def test_a_full_queue_refuses_then_accepts_again():
  gate = threading.Event()
  with DynamicBatcher(Recorder(gate), BatcherSettings(max_batch=4, max_delay_ms=0,
                                                      max_queue=6)) as batcher:
    first = batcher.submit(_rows(0, 4))
    deadline = time.monotonic() + 10
    while batcher._queued_examples and time.monotonic() < deadline:  # the worker took it
      time.sleep(0.001)
    waiting = batcher.submit(_rows(4, 6))  # 6 queued: the queue is full
    with pytest.raises(QueueFull, match="queue full: 6 examples waiting.*max_queue=6"):
      batcher.submit(_rows(10, 1))
    gate.set()
    np.testing.assert_array_equal(first.result(10), _score(_rows(0, 4)))
    np.testing.assert_array_equal(waiting.result(10), _score(_rows(4, 6)))
    np.testing.assert_array_equal(batcher.submit(_rows(10, 1)).result(10), _score(_rows(10, 1)))
    assert batcher.stats().rejected == 1


def test_each_refused_request_is_counted():
  gate = threading.Event()
  with DynamicBatcher(Recorder(gate), BatcherSettings(max_batch=1, max_queue=2)) as batcher:
    futures = [batcher.submit(_rows(0, 1))]
    deadline = time.monotonic() + 10
    while batcher._queued_examples and time.monotonic() < deadline:  # the worker took it
      time.sleep(0.001)
    futures.append(batcher.submit(_rows(1, 2)))  # the queue is full now
    for _ in range(3):
      with pytest.raises(QueueFull):
        batcher.submit(_rows(3, 1))
    assert batcher.stats().rejected == 3
    gate.set()
    for i, (f, n) in enumerate(zip(futures, (1, 2), strict=True)):
      np.testing.assert_array_equal(f.result(10), _score(_rows(i, n)))


def test_a_failing_call_fails_its_requests_and_the_worker_keeps_serving():
  calls = []

  def flaky(rows):
    calls.append(len(rows.ids))
    if len(calls) == 1:
      raise FloatingPointError("boom")
    return _score(rows)

  with DynamicBatcher(flaky, BatcherSettings(max_batch=4, max_delay_ms=0)) as batcher:
    with pytest.raises(FloatingPointError, match="boom"):
      batcher.submit(_rows(0, 2)).result(10)
    np.testing.assert_array_equal(batcher.submit(_rows(3, 2)).result(10), _score(_rows(3, 2)))
    assert batcher.stats().failed_batches == 1


def test_a_bad_request_fails_alone_and_its_batch_mates_get_their_scores():
  """Lists of records merged by `merge_fn`; a merged call that raises runs each request
  alone, so only the request holding the bad record gets the error."""
  calls = []

  def score(records: list) -> np.ndarray:
    calls.append(list(records))
    if "bad" in records:
      raise KeyError(f"record {records.index('bad')}: bad")
    return np.asarray([len(r) for r in records], np.float32)

  settings = BatcherSettings(max_batch=16, max_delay_ms=10_000)
  with DynamicBatcher(score, settings, merge_fn=lambda parts: sum(parts, []),
                      size_fn=len) as batcher:
    parts = [["a", "bb"], ["c", "bad"], ["dddd"], [], ["eeeee"] * 11]  # 16 examples in all
    futures = [batcher.submit(p) for p in parts]
    np.testing.assert_array_equal(futures[0].result(10), [1, 2])
    with pytest.raises(KeyError, match="record 1: bad"):  # its own index, not the batch's
      futures[1].result(10)
    np.testing.assert_array_equal(futures[2].result(10), [4])
    np.testing.assert_array_equal(futures[3].result(10), np.zeros(0))  # answered at once
    np.testing.assert_array_equal(futures[4].result(10), [5] * 11)
    stats = batcher.stats()
  assert calls[0] == ["a", "bb", "c", "bad", "dddd"] + ["eeeee"] * 11  # one merged call
  assert calls[1:] == [p for p in parts if p]  # then each request alone
  assert (stats.requests, stats.examples, stats.batches, stats.failed_batches) == (4, 16, 5, 2)


def test_a_failing_batch_of_two_runs_each_request_alone():
  def score(records: list) -> np.ndarray:
    if "bad" in records:
      raise KeyError("bad")
    return np.ones(len(records), np.float32)

  with DynamicBatcher(score, BatcherSettings(max_batch=8, max_delay_ms=10_000),
                      merge_fn=lambda parts: sum(parts, []), size_fn=len) as batcher:
    good, bad = batcher.submit(["a"] * 4), batcher.submit(["bad"] * 4)  # 8: one batch of two
    np.testing.assert_array_equal(good.result(10), np.ones(4))
    with pytest.raises(KeyError, match="bad"):
      bad.result(10)
  assert batcher.stats().batches == 3  # the merged call, then each request alone


def test_scores_with_more_axes_are_split_by_example():
  def two_columns(rows: Rows) -> np.ndarray:
    return np.stack([_score(rows), -_score(rows)], axis=1)  # [n, 2]

  with DynamicBatcher(two_columns, BatcherSettings(max_batch=8, max_delay_ms=10_000)) as batcher:
    first, second = batcher.submit(_rows(0, 3)), batcher.submit(_rows(7, 5))  # one batch
    np.testing.assert_array_equal(first.result(10), two_columns(_rows(0, 3)))
    np.testing.assert_array_equal(second.result(10), two_columns(_rows(7, 5)))
  assert batcher.stats().batches == 1


def test_scores_of_the_wrong_length_are_an_error_naming_the_shapes():
  with DynamicBatcher(lambda rows: np.zeros(3), BatcherSettings(max_delay_ms=0)) as batcher:
    with pytest.raises(ValueError, match=r"returned shape \(3,\) for 2 examples"):
      batcher.submit(_rows(0, 2)).result(10)


def test_predict_async_from_an_event_loop():
  with DynamicBatcher(Recorder(), BatcherSettings(max_batch=32, max_delay_ms=5)) as batcher:

    async def main():
      return await asyncio.gather(*(batcher.predict_async(_rows(i, 2)) for i in range(10)))

    results = asyncio.run(main())
  for i, scores in enumerate(results):
    np.testing.assert_array_equal(scores, _score(_rows(i, 2)))
  assert batcher.stats().batches < 10


def test_close_answers_the_queued_requests_then_refuses():
  fn = Recorder()
  batcher = DynamicBatcher(fn, BatcherSettings(max_batch=64, max_delay_ms=10_000))
  futures = [batcher.submit(_rows(i, 1)) for i in range(3)]
  batcher.close()
  for i, f in enumerate(futures):
    np.testing.assert_array_equal(f.result(0), _score(_rows(i, 1)))
  with pytest.raises(RuntimeError, match=r"^DynamicBatcher\.submit: the batcher is closed$"):
    batcher.submit(_rows(0, 1))


def test_an_empty_request_is_answered_without_a_call():
  fn = Recorder()
  with DynamicBatcher(fn) as batcher:
    empty = batcher.submit(_rows(0, 0)).result(1)
  assert empty.shape == (0,) and empty.dtype == np.float32  # as a predictor's scores
  assert fn.sizes == []


def test_the_worker_is_a_named_daemon_thread():
  """Named for thread dumps; a daemon, so a batcher left open does not hold the process."""
  with DynamicBatcher(Recorder()) as batcher:
    workers = [t for t in threading.enumerate() if t is batcher._worker]
    assert [(t.name, t.daemon) for t in workers] == [("sfjax-batcher", True)]


@pytest.mark.parametrize("field,value", [("max_batch", 0), ("max_queue", 2.5),
                                         ("max_delay_ms", -1.0)])
def test_bad_settings_are_named(field, value):
  with pytest.raises(ValueError, match=f"BatcherSettings.{field}:"):
    BatcherSettings(**{field: value})
