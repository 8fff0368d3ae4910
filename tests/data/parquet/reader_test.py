"""ParquetReader by chunk number: chunk c is the c-th record batch of `chunk_rows` rows within
a row group; a chunk or some of its rows read alone equal what a pass reads."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sfjax.core.errors import DataFormatError
from sfjax.data.parquet.dataset import ParquetDataset
from sfjax.data.parquet.reader import ParquetReader, open_parquet_file
from sfjax.train import defaults


def _write_and_read(tmp_path, table, chunk_rows=3, row_group_size=4, skip=False,
                    name="b.parquet", **parquet):
  """The train reader of `table` written as one file (`data.parquet` fields from `parquet`)."""
  path = tmp_path / name
  pq.write_table(table, path, row_group_size=row_group_size)
  c = defaults.ctr_defaults().data
  c.format, c.train_path, c.hash_rows, c.skip_bad_lines = "parquet", str(path), 1000, skip
  for key, value in parquet.items():
    c.parquet[key] = value
  return ParquetDataset(c, chunk_rows=chunk_rows).train_reader, str(path)


def _labels_items(labels):
  """Columns 'label' (`labels`) and 'item' (ids 100..)."""
  return {"label": pa.array(labels, pa.int64()),
          "item": pa.array(100 + np.arange(len(labels)), pa.int64())}


def _reader(tmp_path, rows=10, row_group_size=4, chunk_rows=3):
  """A reader over one file of `rows` rows (item ids 100.., a 2-id bag per row)."""
  table = pa.table({**_labels_items(np.arange(rows) % 2),
                    "tags": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int64()))})
  return _write_and_read(tmp_path, table, chunk_rows, row_group_size, name="a.parquet",
                         bags="tags:multi_hot:2")


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
  with pytest.raises(DataFormatError, match=r"x\.parquet:1: not a readable Parquet file "
                     r"\(ArrowInvalid: Parquet magic bytes not found"):
    open_parquet_file(str(bad))


def test_reader_defaults_and_chunk_rows_bounds(tmp_path):
  reader, path = _reader(tmp_path)
  fresh = ParquetReader([path], reader.parser)
  assert (fresh.skip_bad_lines, fresh.chunk_rows, fresh.rows_parsed, fresh.bad_rows) == (
      False, 8192, 0, 0)
  assert ParquetReader([path], reader.parser, chunk_rows=1).num_chunks(path) == 10
  with pytest.raises(ValueError, match="^chunk_rows must be >= 1, got 0$"):
    ParquetReader([path], reader.parser, chunk_rows=0)


def test_a_pass_opens_each_row_group_once_reading_only_the_named_columns(tmp_path, monkeypatch):
  reader, path = _reader(tmp_path)  # row groups of 4, 4, 2 rows; chunks of 3
  calls = []
  real = pq.ParquetFile.iter_batches

  def counting(self, *args, **kwargs):
    calls.append(kwargs.get("columns"))
    return real(self, *args, **kwargs)

  monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
  assert [c.size for c in reader] == [3, 1, 3, 1, 2]
  assert calls == [["label", "item", "tags"]] * 3


def test_a_bad_row_past_a_chunk_boundary_names_its_row_of_the_file(tmp_path):
  labels = [0, 1, 0, 1, 0, 1, 7, 0]  # file row 7 (1-based): row group 1, its 3rd row, chunk 1
  reader, path = _write_and_read(tmp_path, pa.table(_labels_items(labels)), chunk_rows=2)
  with pytest.raises(DataFormatError) as err:
    list(reader)
  assert (err.value.path, err.value.line) == (path, 7)
  assert "row group 1, column 'label': label must be 0 or 1" in str(err.value)


def test_an_unreadable_row_group_is_named():
  with pytest.raises(DataFormatError) as err:
    ParquetReader._read_on(iter([]), 1, "p.parquet", 2, 40)
  assert (err.value.path, err.value.line) == ("p.parquet", 41)
  assert str(err.value).endswith("row group 2: cannot read it (StopIteration: )")


def test_read_rows_of_a_chunk_that_dropped_rows_and_past_the_end(tmp_path):
  labels = [0, 1, 5, 1, 0, 1]  # row 2 is bad: chunk 0 (rows 0-2) keeps 2 examples
  reader, path = _write_and_read(tmp_path, pa.table(_labels_items(labels)), skip=True,
                                 row_group_size=6)
  passed = list(reader)
  assert [c.size for c in passed] == [2, 3] and reader.bad_rows == 1
  before = reader.rows_parsed
  part = reader.read_rows(path, 0, 2, np.asarray([1]))
  assert reader.rows_parsed - before == 3 + 1  # the chunk checked, then the one row parsed
  np.testing.assert_array_equal(part.keys[0], passed[0].keys[0][[1]])
  with pytest.raises(ValueError, match="chunk 9 of .* held 1 examples when saved, now 0"):
    reader.read_rows(path, 9, 1, np.asarray([0]))


def test_read_rows_names_a_row_that_became_bad(tmp_path):
  reader, path = _write_and_read(tmp_path, pa.table(_labels_items([0, 1, 3, 1, 0, 1])),
                                 row_group_size=3)
  with pytest.raises(DataFormatError) as err:
    reader.read_rows(path, 0, 3, np.asarray([2]))
  assert err.value.path == path and "row group 0, column 'label'" in str(err.value)


def test_bad_rows_keep_a_full_pass_count_across_epochs(tmp_path):
  labels = [0, 1, 0, 1, 0, 9]  # the bad row is in the last chunk
  reader, path = _write_and_read(tmp_path, pa.table(_labels_items(labels)), skip=True)
  clean, _ = _reader(tmp_path)
  list(clean)
  assert clean.bad_rows == 0 and clean.truncated_ids == 0
  list(reader)
  assert reader.bad_rows == 1 and reader.bad_rows_by_file == {path: 1}
  next(iter(reader))  # a second epoch, first chunk only
  assert reader.bad_rows == 1
  table = pa.table({**_labels_items([0, 1, 0, 1]),
                    "tags": pa.array([[1], [2], [3], [4, 5, 6]], pa.list_(pa.int64()))})
  truncating, path = _write_and_read(tmp_path, table, chunk_rows=2, bags="tags:multi_hot:2")
  list(truncating)
  assert truncating.truncated_ids == 1 and truncating.truncated_by_file == {path: 1}
  next(iter(truncating))
  assert truncating.truncated_ids == 1


def test_a_row_group_that_cannot_be_read_is_named_with_its_first_row(tmp_path, monkeypatch):
  reader, path = _reader(tmp_path)  # row groups of 4, 4, 2 rows
  real = pq.ParquetFile.iter_batches

  def failing(self, *args, **kwargs):
    if kwargs.get("row_groups") == [1]:
      return iter(())
    return real(self, *args, **kwargs)

  monkeypatch.setattr(pq.ParquetFile, "iter_batches", failing)
  with pytest.raises(DataFormatError) as err:
    list(reader)
  assert (err.value.path, err.value.line) == (path, 5)
  assert str(err.value).endswith("row group 1: cannot read it (StopIteration: )")


def test_missing_column_error_names_file_and_columns(tmp_path):
  table = pa.table({"label": pa.array([0, 1], pa.int64()), "other": pa.array([1, 2])})
  reader, path = _write_and_read(tmp_path, table, categorical="item")
  with pytest.raises(DataFormatError) as err:
    list(reader)
  assert (err.value.path, err.value.line) == (path, 1)
  assert str(err.value).endswith("row group 0, column 'item': missing (data.parquet categorical; "
                                 "the file has label, other)")
  table = pa.table({"label": pa.array([0, 1], pa.int64()), "item": pa.array([1.5, 2.0])})
  reader, path = _write_and_read(tmp_path, table)
  with pytest.raises(DataFormatError) as err:
    list(reader)
  assert (err.value.path, err.value.line) == (path, 1)


def test_chunk_dtypes_bool_labels_and_no_dense_columns(tmp_path):
  table = pa.table({"label": pa.array([True, False, True]),
                    "item": pa.array(["a", "b", "a"]).dictionary_encode(),
                    "code": pa.array([b"x", b"y", b"z"], pa.binary()),
                    "tags": pa.array([[], ["p"], ["q", "r"]]),
                    "w": pa.array([[], [0.5], [1.0, 2.0]], pa.list_(pa.float64()))})
  reader, _ = _write_and_read(tmp_path, table, bags="tags:multi_hot:2:sum:w")
  (chunk,) = list(reader)
  np.testing.assert_array_equal(chunk.labels, [1, 0, 1])
  assert chunk.labels.dtype == np.float32
  assert chunk.dense.shape == (3, 0) and chunk.dense.dtype == np.float32
  assert chunk.keys[0][0] == chunk.keys[0][2] != chunk.keys[0][1]  # dictionary-encoded strings
  assert len(set(chunk.keys[1].tolist())) == 3  # binary ids
  assert [x.dtype for x in chunk.lengths] == [np.int64] * 3
  np.testing.assert_array_equal(chunk.lengths[2], [0, 1, 2])
  assert chunk.weights[2].dtype == np.float32 and chunk.weights[2].tolist() == [0.5, 1.0, 2.0]
  first, *_ = list(_write_and_read(tmp_path, table.slice(0, 1), bags="tags:multi_hot:2:sum:w")[0])
  assert first.keys[2].shape == (0,) and first.lengths[2].tolist() == [0]  # no string id at all
