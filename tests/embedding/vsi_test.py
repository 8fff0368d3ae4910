"""Virtual Sparse Ids."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfjax.embedding import vsi


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=60), st.integers(0, 5))
def test_dedup_reconstructs_ids(values, extra):
  ids = np.array(values, np.int64).reshape(-1, 1)
  out = vsi.dedup_ids(ids, capacity=len(set(values)) + extra, pad_id=-1)
  assert out.num_unique == len(set(values))
  assert out.vids.dtype == np.int32
  np.testing.assert_array_equal(out.uniq[out.vids], ids)  # 64-bit ids survive on the host
  assert (out.uniq[out.num_unique:] == -1).all()
  assert len(set(out.uniq[:out.num_unique].tolist())) == out.num_unique


def test_global_row_ids_and_capacity_error():
  ids = np.array([[0, 1], [2, 1]])
  g = vsi.global_row_ids(ids, np.array([0, 10]))
  np.testing.assert_array_equal(g, [[0, 11], [2, 11]])
  with pytest.raises(ValueError, match="unique_capacity"):
    vsi.dedup_ids(g, capacity=2, pad_id=99)
