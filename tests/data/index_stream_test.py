"""Tests for sfjax.data.index_stream: the index orders equal the data sets' example streams
batch for batch, and a saved position restarts the stream exactly (in constant time)."""

import itertools
import json
import time

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import batching, index_stream, preprocessed
from sfjax.data.generated import synthetic
from sfjax.data.types import Batch, concat_batches, make_batch


def _same(a: Batch, b: Batch) -> None:
  for x, y in zip(a, b, strict=True):
    if x is None or y is None:
      assert x is y
      continue
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(x, y)


def _synthetic(num_train=40_000):
  cfg = ctr.get_config("smoke").data.synthetic
  cfg.num_train, cfg.num_eval = num_train, 100
  return synthetic.SyntheticCTR(cfg, seed=3)


@pytest.mark.parametrize("batch_size", [1000, 7000])
def test_chunked_order_reads_the_synthetic_stream(batch_size):
  data = _synthetic()  # 40,000 rows: 3 chunks of 16,384, the last partial; epochs straddled
  order = data.train_order(batch_size, seed=5)
  for batch in itertools.islice(data.train_batches(batch_size, seed=5), 14):
    _same(data.read_train(order.next_batch()), batch)


def test_read_train_counts_and_splits_disjointly():
  data = _synthetic()
  idx = data.train_order(64, seed=1).next_batch()
  whole = data.read_train(idx)
  before = data.rows_read
  parts = [data.read_train(idx[p * 16:(p + 1) * 16]) for p in range(4)]
  assert data.rows_read - before == 64
  _same(concat_batches(parts), whole)


def _resume_equal(make, steps_before=9, steps_after=12):
  first = make(None)
  for _ in range(steps_before):
    first.next_batch()
  saved = json.loads(json.dumps(first.position()))  # survives the checkpoint's JSON
  assert saved["batches"] == steps_before
  again = make(saved)
  for _ in range(steps_after):
    np.testing.assert_array_equal(again.next_batch(), first.next_batch())
  assert again.position() == first.position()


def test_chunked_order_resumes_from_its_position():
  _resume_equal(lambda pos: index_stream.ChunkedOrder(7, 11, 1000, 300, 128, pos))


@pytest.mark.parametrize("buffer", [0, 1, 50, 700, 5000])
def test_shard_order_resumes_from_its_position(buffer):
  sizes = [120, 0, 333, 90, 250]
  _resume_equal(lambda pos: index_stream.ShardOrder(sizes, 64, buffer, 4, 100, pos), 11, 25)


@pytest.mark.parametrize("buffer", [0, 50, 700, 5000])
def test_shard_order_is_the_preprocessed_stream(buffer, tmp_path):
  gen = _synthetic(num_train=1000)
  text = tmp_path / "train.tsv"
  gen.write_criteo(str(text), "train", 950)
  gen.write_criteo(str(tmp_path / "eval.tsv"), "eval", 50)
  d = ctr.get_config().data
  d.format, d.train_path, d.eval_path = "criteo", str(text), str(tmp_path / "eval.tsv")
  d.hash_rows, d.shuffle_buffer = 300, 0
  preprocessed.preprocess_files(d, str(tmp_path / "pre"), rows_per_shard=200)
  d.format, d.train_path, d.shuffle_buffer = "preprocessed", str(tmp_path / "pre"), buffer
  data = preprocessed.PreprocessedDataset(d, read_chunk=64)
  order = data.train_order(128, seed=9)
  for batch in itertools.islice(data.train_batches(128, seed=9), 20):  # 2.7 epochs
    _same(data.read_train(order.next_batch()), batch)
  assert data.stats["rows_read"] == 20 * 128


def test_seeking_takes_constant_time():
  """Restarting after 10 batches and after 10^4 (many epochs later) costs the same."""
  def make(pos=None):
    return index_stream.ShardOrder([300] * 10, 64, 500, 0, 32, pos)

  def seek_seconds(steps):
    order = make()
    for _ in range(steps):
      order.next_batch()
    position = json.loads(json.dumps(order.position()))
    start = time.perf_counter()
    for _ in range(20):
      make(position).next_batch()
    return (time.perf_counter() - start) / 20
  assert seek_seconds(10**4) < 5 * seek_seconds(10) + 1e-3


def test_a_position_of_another_kind_is_refused():
  position = index_stream.ChunkedOrder(0, 1, 100, 10, 8).position()
  with pytest.raises(ValueError, match="input position: expected kind 'shards'"):
    index_stream.ShardOrder([100], 10, 0, 0, 8, position)


def test_shard_order_counts_epochs_and_batches_in_int64():
  order = index_stream.ShardOrder([6, 0, 4], 3, 0, 0, 4)  # no shuffling: the files' order
  assert order.position()["epoch"] == 0
  got = [order.next_batch() for _ in range(3)]
  assert [b.tolist() for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
  assert all(b.dtype == np.int64 for b in got)
  assert order.position()["epoch"] == 1 and order.position()["batches"] == 3
  alone = index_stream.ShardOrder([1], 1, 0, 0, 1)  # one example is enough
  assert alone.next_batch().tolist() == [0] == alone.next_batch().tolist()


@pytest.mark.parametrize("buffer", [0, 1, 2, 7])
def test_shard_order_shuffles_from_a_buffer_of_two_on(buffer):
  order = index_stream.ShardOrder([5, 9, 4], 2, buffer, 3, 6)
  stream = np.concatenate([order.next_batch() for _ in range(6)])  # two epochs
  assert stream.dtype == np.int64
  for epoch in (stream[:18], stream[18:]):
    assert sorted(epoch.tolist()) == list(range(18))
  assert (stream.tolist() == list(range(18)) * 2) == (buffer <= 1)


def test_index_shuffler_draws_as_the_streaming_shuffle():
  sizes = [0, 1, 3, 1, 8, 0, 2, 9, 1, 1, 4, 12, 1, 0, 5]
  starts = np.cumsum([0] + sizes)
  chunks = [np.arange(a, a + n, dtype=np.int64) for a, n in zip(starts, sizes, strict=False)]
  for buffer in (2, 5, 8):
    want = np.concatenate([b.ids[:, 0] for b in batching._shuffle_stream(
        (make_batch(c[:, None], np.zeros((c.size, 0)), np.zeros(c.size)) for c in chunks),
        buffer, np.random.default_rng(buffer))])
    shuffler = index_stream.IndexShuffler(buffer, np.random.default_rng(buffer))
    pieces = [shuffler.push(c) for c in chunks] + [shuffler.finish()]
    assert all(p.dtype == np.int64 for p in pieces)
    np.testing.assert_array_equal(np.concatenate(pieces), want)
    assert shuffler.buffer is None and shuffler.pending.size == 0


def test_orders_refuse_empty_data_and_bad_positions_naming_the_field():
  with pytest.raises(ValueError, match=r"^training data has no examples \(epoch 0 was empty\)$"):
    index_stream.ShardOrder([0, 0], 3, 0, 0, 4)
  with pytest.raises(ValueError, match=r"^training data has no examples \(num_rows=0\)$"):
    index_stream.ChunkedOrder(0, 1, 0, 10, 4)
  with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
    index_stream.ChunkedOrder(0, 1, 10, 10, 0)
  one = index_stream.ChunkedOrder(0, 1, 1, 10, 1)  # one example, batches of one
  assert one.next_batch().tolist() == [0] and one.next_batch().dtype == np.int64
  with pytest.raises(ValueError, match=r"^input position: expected kind 'chunked', got 'list'$"):
    index_stream.ChunkedOrder(0, 1, 10, 10, 2, [])
  shards = index_stream.ShardOrder([10], 3, 0, 0, 4).position()
  with pytest.raises(ValueError, match=r"^input position: expected kind 'chunked', got 'shards'$"):
    index_stream.ChunkedOrder(0, 1, 10, 10, 2, shards)
  del shards["blocks"]
  with pytest.raises(ValueError, match=r"^input position: field 'blocks' is missing$"):
    index_stream.ShardOrder([10], 3, 0, 0, 4, shards)
  assert index_stream.encode_indices(np.array([1, 2], np.int32)) == index_stream.encode_indices(
      np.array([1, 2], np.int64))


def _restored(shuffler):
  """A shuffler built from `shuffler`'s saved state (buffer, pending, rng)."""
  copy = index_stream.IndexShuffler(
      shuffler.buffer_size, np.random.default_rng(),
      buffer=None if shuffler.buffer is None else shuffler.buffer.copy(),
      pending=shuffler.pending.copy())
  copy.rng.bit_generator.state = shuffler.rng.bit_generator.state
  return copy


@pytest.mark.parametrize("pushed", [1, 2])  # a pending part, then a full buffer
def test_an_index_shuffler_restored_from_its_state_draws_on_alike(pushed):
  chunks = [np.arange(a, a + n, dtype=np.int64) for a, n in ((0, 2), (2, 3), (5, 1), (6, 4))]
  first = index_stream.IndexShuffler(4, np.random.default_rng(1))
  for c in chunks[:pushed]:
    first.push(c)
  assert (first.buffer is None) == (pushed == 1) and (first.pending.size > 0) == (pushed == 1)
  again = _restored(first)
  for c in chunks[pushed:]:
    np.testing.assert_array_equal(again.push(c), first.push(c))
  np.testing.assert_array_equal(again.finish(), first.finish())
