"""Tests for sfjax.data.batching: fixed shapes, padding, streaming shuffle, epochs."""

import itertools

import numpy as np
import pytest

from sfjax.data import batching
from sfjax.data.types import Batch, make_batch


def _chunk(start, stop):
  """Examples start..stop-1; example i has ids [i, i+1000], dense [i/2], label i % 2."""
  i = np.arange(start, stop)
  if not i.size:  # make_batch cannot infer the dense width of an empty batch.
    return Batch(np.zeros((0, 2), np.int64), np.zeros((0, 1), np.float32),
                 np.zeros(0, np.float32), np.zeros(0, np.float32))
  return make_batch(np.stack([i, i + 1000], 1), i[:, None] / 2, i % 2)


def _chunks(sizes):
  bounds = np.cumsum([0] + list(sizes))
  return [_chunk(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def test_rebatch_keeps_order_across_variable_chunks():
  out = list(batching.rebatch(_chunks([3, 0, 7, 1, 5]), 4, pad_last=False))
  assert [b.size for b in out] == [4, 4, 4, 4]
  np.testing.assert_array_equal(np.concatenate([b.ids[:, 0] for b in out]), np.arange(16))
  assert all(b.mask.tolist() == [1] * 4 for b in out)


def test_eval_batches_pad_the_last_batch_with_mask_zero():
  out = list(batching.eval_batches(_chunks([4, 6]), 4))
  assert [b.size for b in out] == [4, 4, 4]
  last = out[-1]
  np.testing.assert_array_equal(last.mask, [1, 1, 0, 0])
  np.testing.assert_array_equal(last.ids, [[8, 1008], [9, 1009], [0, 0], [0, 0]])
  np.testing.assert_array_equal(last.dense[:, 0], [4, 4.5, 0, 0])
  np.testing.assert_array_equal(last.labels, [0, 1, 0, 0])
  assert last.ids.dtype == np.int64 and last.mask.dtype == np.float32
  assert sum(b.mask.sum() for b in out) == 10  # Nothing dropped.


def test_eval_batches_exact_multiple_has_no_padding_batch():
  out = list(batching.eval_batches(_chunks([8]), 4))
  assert len(out) == 2 and all(b.mask.all() for b in out)


def test_pad_batch_rejects_oversized():
  with pytest.raises(ValueError, match="exceeds batch_size"):
    batching._pad_batch(_chunk(0, 5), 4)


@pytest.mark.parametrize("sizes, buffer", [([5] * 20, 16), ([3, 40, 1, 9, 0, 30], 8), ([7], 32)])
def test_shuffle_stream_emits_every_example_once(sizes, buffer):
  chunks = _chunks(sizes)
  out = list(batching._shuffle_stream(iter(chunks), buffer, np.random.default_rng(0)))
  ids = np.concatenate([b.ids for b in out])
  n = sum(sizes)
  np.testing.assert_array_equal(np.sort(ids[:, 0]), np.arange(n))
  np.testing.assert_array_equal(ids[:, 1], ids[:, 0] + 1000)  # Rows stay intact.
  np.testing.assert_array_equal(np.concatenate([b.labels for b in out]), ids[:, 0] % 2)
  assert not np.array_equal(ids[:, 0], np.arange(n))


def test_shuffle_stream_is_seeded_and_buffer_one_keeps_order():
  def run(seed):
    out = batching._shuffle_stream(iter(_chunks([5] * 10)), 16, np.random.default_rng(seed))
    return np.concatenate([b.ids[:, 0] for b in out])
  np.testing.assert_array_equal(run(3), run(3))
  assert not np.array_equal(run(3), run(4))
  same = batching._shuffle_stream(iter(_chunks([5] * 4)), 1, np.random.default_rng(0))
  np.testing.assert_array_equal(np.concatenate([b.ids[:, 0] for b in same]), np.arange(20))


def test_train_batches_are_infinite_full_and_deterministic():
  def take(seed, n):
    it = batching.train_batches(lambda: iter(_chunks([7, 6])), 8, shuffle_buffer=5, seed=seed)
    return list(itertools.islice(it, n))
  out = take(0, 20)  # 160 examples from epochs of 13: many epochs.
  assert all(b.size == 8 and b.mask.all() for b in out)
  ids = np.concatenate([b.ids[:, 0] for b in out])
  for k in range(1, 12):  # Each epoch holds every example exactly once.
    np.testing.assert_array_equal(np.bincount(ids[:13 * k], minlength=13), np.full(13, k))
  np.testing.assert_array_equal(ids, np.concatenate([b.ids[:, 0] for b in take(0, 20)]))
  assert not np.array_equal(ids, np.concatenate([b.ids[:, 0] for b in take(1, 20)]))


def test_yielded_batches_are_never_mutated_later():
  it = batching.train_batches(lambda: iter(_chunks([3] * 10)), 4, shuffle_buffer=8, seed=0)
  first = [next(it) for _ in range(5)]
  snapshot = [b.ids.copy() for b in first]
  for _ in range(50):
    next(it)
  for b, ids in zip(first, snapshot, strict=True):
    np.testing.assert_array_equal(b.ids, ids)


def test_empty_training_data_raises():
  it = batching.train_batches(lambda: iter([]), 4, shuffle_buffer=8, seed=0)
  with pytest.raises(ValueError, match="training data has no examples"):
    next(it)


def test_rebatch_rejects_bad_batch_size():
  with pytest.raises(ValueError, match="batch_size must be >= 1"):
    list(batching.rebatch(_chunks([3]), 0, pad_last=True))


def test_weights_stay_with_their_examples_through_shuffle_and_padding():
  def chunk(start, stop):
    ids = np.arange(start, stop)[:, None] * np.array([[1, -1]])
    return make_batch(ids, np.zeros((stop - start, 0)), np.zeros(stop - start),
                      weights=(ids >= 0) * (ids + 0.5))

  chunks = [chunk(0, 5), chunk(5, 7), chunk(7, 20)]
  out = list(batching._shuffle_stream(chunks, 4, np.random.default_rng(0)))
  ids = np.concatenate([b.ids for b in out])
  weights = np.concatenate([b.weights for b in out])
  assert sorted(ids[:, 0].tolist()) == list(range(20))
  np.testing.assert_array_equal(weights, (ids >= 0) * (ids + 0.5))
  padded = list(batching.eval_batches([chunk(0, 3)], 4))[0]
  np.testing.assert_array_equal(padded.weights[3], [0, 0])  # a padding example weighs 0
