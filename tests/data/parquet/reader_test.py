"""ParquetReader by chunk number: chunk c is the c-th record batch of `chunk_rows` rows within
a row group; a chunk or some of its rows read alone equal what a pass reads."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sfjax.core.errors import DataFormatError
from sfjax.data.parquet.dataset import ParquetDataset
from sfjax.data.parquet.reader import open_parquet_file
from sfjax.train import defaults


def _reader(tmp_path, rows=10, row_group_size=4, chunk_rows=3):
  """A reader over one file of `rows` rows (item ids 100.., a 2-id bag per row)."""
  path = tmp_path / "a.parquet"
  table = pa.table({"label": pa.array(np.arange(rows) % 2, pa.int64()),
                    "item": pa.array(100 + np.arange(rows), pa.int64()),
                    "tags": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int64()))})
  pq.write_table(table, path, row_group_size=row_group_size)
  c = defaults.ctr_defaults().data
  c.format, c.train_path, c.hash_rows = "parquet", str(path), 1000
  c.parquet.bags = "tags:multi_hot:2"
  return ParquetDataset(c, chunk_rows=chunk_rows).train_reader, str(path)


def _same(a, b):
  assert a.size == b.size
  for x, y in zip(a.keys + (a.labels,), b.keys + (b.labels,), strict=True):
    np.testing.assert_array_equal(x, y)


def test_chunks_are_record_batches_within_row_groups_read_alone_as_in_a_pass(tmp_path):
  reader, path = _reader(tmp_path)  # row groups of 4, 4, 2 rows; chunks of 3: 3+1, 3+1, 2
  assert reader.num_chunks(path) == 5
  passed = list(reader)
  assert [c.size for c in passed] == [3, 1, 3, 1, 2]
  for k in reversed(range(5)):  # out of order: the reader reopens the row group
    chunk, bad, truncated = reader.read_chunk(path, k)
    _same(chunk, passed[k])
    assert (bad, truncated) == (0, 0)
  assert reader.read_chunk(path, 5) is None and reader.read_chunk(path, -1) is None


def test_some_rows_of_a_chunk_parse_only_those_rows(tmp_path):
  reader, path = _reader(tmp_path)
  whole = reader.read_chunk(path, 2)[0]
  before = reader.rows_parsed
  part = reader.read_rows(path, 2, 3, np.asarray([2, 0]))
  assert reader.rows_parsed - before == 2
  assert part.size == 2
  np.testing.assert_array_equal(part.labels, whole.labels[[2, 0]])
  np.testing.assert_array_equal(part.keys[0], whole.keys[0][[2, 0]])  # the item column
  with pytest.raises(ValueError, match="held 4 examples when saved, now 3: the training files"):
    reader.read_rows(path, 2, 4, np.asarray([0]))


def test_a_file_that_is_not_parquet_is_named(tmp_path):
  bad = tmp_path / "x.parquet"
  bad.write_bytes(b"not parquet at all")
  with pytest.raises(DataFormatError, match=r"x\.parquet:1: not a readable Parquet file"):
    open_parquet_file(str(bad))
