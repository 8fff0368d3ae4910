"""Host-table row blocks: record-wise writes equal numpy's row assignment; writes are checked."""

import ml_dtypes
import numpy as np
import pytest

from sfjax.embedding import host_rows


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("width", [1, 3, 17])
def test_put_rows_equals_row_assignment(dtype, width):
  rng = np.random.default_rng(width)
  table = rng.normal(size=(50, width)).astype(dtype)
  want = table.copy()
  at = rng.choice(50, size=12, replace=False)
  rows = rng.normal(size=(12, width)).astype(np.float32)  # cast to the table's dtype
  want[at] = rows.astype(dtype)
  host_rows.put_rows(table, at, rows)
  np.testing.assert_array_equal(table.view(np.uint8), want.view(np.uint8))


def test_put_rows_without_rows_or_columns_changes_nothing():
  table = np.arange(6, dtype=np.float32).reshape(3, 2)
  host_rows.put_rows(table, np.zeros(0, np.int64), np.zeros((0, 2), np.float32))
  np.testing.assert_array_equal(table, np.arange(6).reshape(3, 2))
  empty = np.zeros((3, 0), np.float32)
  host_rows.put_rows(empty, np.array([1]), np.zeros((1, 0), np.float32))
  assert empty.shape == (3, 0)


def test_put_rows_writes_an_mmap_table(tmp_path):
  table = np.lib.format.open_memmap(tmp_path / "t.npy", "w+", np.float32, (10, 4))
  host_rows.put_rows(table, np.array([7, 2]), np.array([[1, 2, 3, 4], [5, 6, 7, 8]]))
  np.testing.assert_array_equal(table[[2, 7]], [[5, 6, 7, 8], [1, 2, 3, 4]])
  assert not table[[0, 1, 3, 4, 5, 6, 8, 9]].any()


def test_check_rows_names_the_write_and_the_entry():
  good = host_rows.check_rows(np.ones((2, 3), np.float64), (2, 3), "scatter", "values")
  assert good.dtype == np.float32
  with pytest.raises(ValueError, match=r"scatter: values must have shape \(2, 3\), got \(3, 2\)"):
    host_rows.check_rows(np.ones((3, 2)), (2, 3), "scatter", "values")
  with pytest.raises(ValueError, match="load_rows: slots must be floating point, got dtype int64"):
    host_rows.check_rows(np.ones((2, 1), np.int64), (2, 1), "load_rows", "slots")
  bad = np.ones((2, 3), np.float32)
  bad[1, 2] = np.nan
  with pytest.raises(ValueError, match=r"scatter: values\[1, 2\] is nan \(not finite\)"):
    host_rows.check_rows(bad, (2, 3), "scatter", "values")
  with pytest.raises(ValueError, match=r"values\[0, 0\] is inf"):  # beyond float16's range
    host_rows.check_rows(np.array([[1e6]]), (1, 1), "scatter", "values", np.float16)
