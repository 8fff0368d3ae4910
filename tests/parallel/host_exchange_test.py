"""Tests for sfjax.parallel.host_exchange (one process here; the exchange between processes
is exercised by tests/train/process_input_test.py's 2- and 4-process runs)."""

import numpy as np

from sfjax.data.types import Batch
from sfjax.parallel import host_exchange


def _batch(n, weights=False):
  rng = np.random.default_rng(n)
  return Batch(rng.integers(0, 100, (n, 3)), rng.random((n, 2), np.float32),
               rng.random(n).astype(np.float32), np.ones(n, np.float32),
               rng.random((n, 3)).astype(np.float32) if weights else None)


def test_rows_survive_the_bytes_round_trip_with_absent_fields():
  for weights in (False, True):
    b = _batch(5, weights)
    back = host_exchange.rows_from_bytes(host_exchange.rows_to_bytes(b), b)
    assert isinstance(back, Batch)
    for x, y in zip(b, back, strict=True):
      if x is None:
        assert y is None
      else:
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_plain_tuples_round_trip():
  rows = (np.arange(4), None, np.ones((4, 2)))
  back = host_exchange.rows_from_bytes(host_exchange.rows_to_bytes(rows), rows)
  assert type(back) is tuple and back[1] is None
  np.testing.assert_array_equal(back[2], rows[2])


def test_one_process_gathers_its_own_rows():
  b = _batch(4)
  assert host_exchange.gather_batch(0, b) is b
