"""Tests for sfjax.data.validate: the first bad id / label / dense value, or None."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfjax.data import validate


def _reference_first(bad: np.ndarray):
  """(row, column) of the first True in row-major order, by a plain loop."""
  for r in range(bad.shape[0]):
    for c in range(bad.shape[1]):
      if bad[r, c]:
        return r, c
  return None


@settings(max_examples=120, deadline=None)
@given(n=st.integers(0, 300), rows=st.lists(st.integers(1, 2**31), min_size=1, max_size=5),
       dtype=st.sampled_from([np.int32, np.int64]), data=st.data())
def test_first_bad_id_matches_a_loop(n, rows, dtype, data):
  """Heterogeneous field rows (the blocked column max), both dtypes, any number of rows."""
  rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
  limits = np.asarray(rows, np.int64)
  ids = (rng.random((n, len(rows))) * limits).astype(np.int64)
  for _ in range(data.draw(st.integers(0, 3))):  # plant a few bad ids (or none)
    if n:
      r, c = rng.integers(n), rng.integers(len(rows))
      ids[r, c] = data.draw(st.sampled_from([-1, -7, int(limits[c]), int(limits[c]) + 5,
                                             -2**31]))
  if dtype == np.int32:
    ids = np.clip(ids, -2**31, 2**31 - 1)
  ids = ids.astype(dtype)
  want = _reference_first((ids < 0) | (ids >= limits[None, :]))
  got = validate.first_bad_id(ids, rows)
  if want is None:
    assert got is None
  else:
    assert (got.row, got.column) == want and got.value == ids[want]


def test_first_bad_id_names_the_first_in_row_major_order():
  ids = np.zeros((200, 3), np.int64)
  ids[150, 0] = 10  # rows 10: one past the end
  ids[70, 2] = -7
  ids[70, 1] = 4  # in range (rows 5)
  bad = validate.first_bad_id(ids, [10, 5, 3])
  assert bad == validate.BadValue(70, 2, -7)
  ids[70, 2] = 2
  assert validate.first_bad_id(ids, [10, 5, 3]) == validate.BadValue(150, 0, 10)
  ids[150, 0] = 9
  assert validate.first_bad_id(ids, [10, 5, 3]) is None
  assert validate.first_bad_id(ids[:0], [10, 5, 3]) is None


def test_first_bad_id_at_the_dtype_limits():
  int32 = np.array([[2**31 - 1, -2**31]], np.int32)
  assert validate.first_bad_id(int32, [2**31, 2**31]) == validate.BadValue(0, 1, -2**31)
  assert validate.first_bad_id(int32[:, :1], [2**31]) is None
  assert validate.first_bad_id(int32[:, :1], [2**31 - 1]) == validate.BadValue(0, 0, 2**31 - 1)
  int64 = np.array([[2**63 - 1]], np.int64)
  assert validate.first_bad_id(int64, [2**63 - 1]) == validate.BadValue(0, 0, 2**63 - 1)
  assert validate.first_bad_id(int64, [np.iinfo(np.int64).max]) == validate.BadValue(
      0, 0, 2**63 - 1)
  assert validate.first_bad_id(-int64, [np.iinfo(np.int64).max]) == validate.BadValue(
      0, 0, -(2**63 - 1))


def test_first_bad_id_rejects_other_dtypes_and_shapes():
  with pytest.raises(TypeError, match="signed integers"):
    validate.first_bad_id(np.zeros((2, 1), np.float32), [3])
  with pytest.raises(ValueError, match="one column per field"):
    validate.first_bad_id(np.zeros((2, 2), np.int64), [3])


@pytest.mark.parametrize("label", [7.0, -1.0, 0.5, np.nan, np.inf])
def test_first_bad_label(label):
  labels = np.array([0, 1, 1, 0, 1], np.float32)
  assert validate.first_bad_label(labels) is None
  labels[3] = label
  bad = validate.first_bad_label(labels)
  assert bad.row == 3 and bad.column == 0
  assert (np.isnan(bad.value) and np.isnan(label)) or bad.value == label
  assert validate.first_bad_label(labels[:0]) is None


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_first_bad_dense(value):
  dense = np.full((9, 4), 3e38, np.float32)  # finite, but its float32 sum is not
  assert validate.first_bad_dense(dense) is None
  dense[6, 1] = value
  dense[6, 3] = value
  bad = validate.first_bad_dense(dense)
  assert (bad.row, bad.column) == (6, 1)
  assert validate.first_bad_dense(np.zeros((5, 0), np.float32)) is None
