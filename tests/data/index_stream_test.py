"""Tests for sfjax.data.index_stream: the index orders equal the data sets' example streams
batch for batch, and a saved position restarts the stream exactly (in constant time)."""

import itertools
import json
import time

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import index_stream, preprocessed
from sfjax.data.generated import synthetic
from sfjax.data.types import Batch, concat_batches


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
