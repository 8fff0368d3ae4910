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


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("width", [1, 3, 17])
def test_rows_of_records_read_and_write_as_rows_of_an_array(dtype, width):
  """Values viewed in a record file's rows (strided, `host_table_files`) read and write as a
  contiguous table; the bytes around them stay as they were."""
  rng = np.random.default_rng(width)
  itemsize = np.dtype(dtype).itemsize
  records = rng.integers(0, 256, (40, width * itemsize + 6), dtype=np.uint8)
  table = records[:, 2:2 + width * itemsize].view(dtype)  # [40, width], rows 6 bytes apart
  assert not table.flags.c_contiguous
  dense = np.ascontiguousarray(table)
  ids = rng.integers(0, 40, 25)  # repeats allowed
  got = host_rows.take_rows(table, ids)
  assert got.dtype == table.dtype and got.shape == (25, width)
  np.testing.assert_array_equal(got.view(np.uint8), dense[ids].view(np.uint8))
  out = np.empty((25, width), dtype)
  assert host_rows.take_rows(table, ids, out) is out
  np.testing.assert_array_equal(out.view(np.uint8), dense[ids].view(np.uint8))
  np.testing.assert_array_equal(host_rows.take_rows(dense, ids, np.empty((25, width), dtype)),
                                dense[ids])
  at = rng.choice(40, 9, replace=False)
  rows = rng.normal(size=(9, width)).astype(dtype)
  before = records.copy()
  host_rows.put_rows(table, at, rows)
  dense[at] = rows
  np.testing.assert_array_equal(table.view(np.uint8), dense.view(np.uint8))
  outside = np.ones(records.shape, bool)
  outside[:, 2:2 + width * itemsize] = False
  np.testing.assert_array_equal(records[outside], before[outside])


def test_take_rows_never_copies_a_strided_table():
  """3 rows of a strided 1e9-row table (every row aliasing one record: nothing allocated);
  `np.take` would first copy all 68 GB of it."""
  record = np.arange(20, dtype=np.float32).reshape(1, 20)
  table = np.lib.stride_tricks.as_strided(record[:, :17], shape=(10**9, 17), strides=(0, 4))
  got = host_rows.take_rows(table, np.array([0, 5, 10**9 - 1]))
  np.testing.assert_array_equal(got, np.tile(np.arange(17, dtype=np.float32), (3, 1)))
  empty = np.lib.stride_tricks.as_strided(record[:, :0], shape=(10**9, 0), strides=(0, 4))
  assert host_rows.take_rows(empty, np.array([1, 2])).shape == (2, 0)


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
