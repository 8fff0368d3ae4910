"""The device row cache returns exactly the source's rows, however it hits and evicts."""

import numpy as np
import pytest

from sfjax.serving import row_source
from sfjax.serving.row_cache import CachedRows


class _Counting:
  """A RAM source that counts the rows read from it."""

  def __init__(self, values):
    self.values, self.num_rows, self.width, self.read = values, *values.shape, 0

  def gather(self, rows):
    self.read += len(rows)
    return self.values[rows]


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_cached_rows_equal_the_source_rows(policy):
  rng = np.random.default_rng(0)
  values = rng.normal(size=(1000, 6)).astype(np.float32)
  source = _Counting(values)
  cache = CachedRows(source, capacity=40, unique_capacity=20, policy=policy)
  hot = np.arange(5)
  for _ in range(30):
    rows = np.concatenate([hot, rng.integers(0, 1000, 15)])  # 20 rows, repeats allowed
    np.testing.assert_array_equal(np.asarray(cache.gather(rows)), values[rows])
  stats = cache.stats()
  assert stats["requests"] == 30 and stats["evictions"] > 0  # 40 slots, ~450 distinct rows
  assert 0.2 < stats["hit_rate"] < 1.0  # the 5 hot rows hit after the first request
  assert stats["h2d_bytes_per_request"] == source.read * 6 * 4 / 30
  assert stats["h2d_bytes"] == source.read * 6 * 4  # only misses are read, each once
  assert stats["lookups"] == stats["hits"] + source.read
  assert stats["hit_rate"] == stats["hits"] / stats["lookups"]
  assert source.read < 30 * 20  # only misses are read


def test_padding_rows_read_zeros_and_take_no_slot():
  values = np.random.default_rng(1).normal(size=(50, 3)).astype(np.float32) + 5.0
  source = _Counting(values)
  cache = CachedRows(source, capacity=8, unique_capacity=8)
  rows = np.asarray([4, -1, 4, 7, -1, -1, 0, -1], np.int64)
  got = np.asarray(cache.gather(rows))
  np.testing.assert_array_equal(got[rows >= 0], values[rows[rows >= 0]])
  assert not got[rows < 0].any() and source.read == 3  # three unique real rows
  got = np.asarray(cache.gather(np.full((8,), -1, np.int64)))
  assert not got.any() and source.read == 3


def test_a_cache_smaller_than_one_request_is_refused(tmp_path):
  values = np.zeros((10, 2), np.float32)
  np.save(tmp_path / "r.npy", values)
  table = {"rows": 10, "dim": 2, "chunk_rows": 10, "chunks": [{"rows": [0, 10],
                                                               "values": "r.npy"}]}
  with pytest.raises(ValueError, match="cache_rows: 4 rows cannot hold one request's 8 rows"):
    row_source.open_rows(str(tmp_path), table, "cache", unique_capacity=8, cache_rows=4)
  rows = row_source.open_rows(str(tmp_path), table, "cache", unique_capacity=8)
  assert rows.capacity == 32 and np.asarray(rows.gather(np.arange(8))).shape == (8, 2)
