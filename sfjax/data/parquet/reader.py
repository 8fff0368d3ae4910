"""Parquet files read with pyarrow, one row group at a time: the row parser and the reader.

`RowGroupParser` checks a file's schema and turns a record batch into a `ParquetChunk`
(labels, dense values, per-feature keys, lengths and weights) or names its bad rows;
`ParquetReader` streams the files of a split in record batches of at most `chunk_rows`
rows (also by chunk number, for per-process input) and counts bad rows and truncated ids.
The data set over them is `sfjax.data.parquet.dataset`; see its docstring for the format.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sfjax.core.errors import DataFormatError
from sfjax.data import feature_map, text_io
from sfjax.data.parquet import columns as pcols


class ParquetChunk(NamedTuple):
  """Rows of one record batch before the key -> row mapping.

  Attributes:
    keys: per feature, [n_f] uint64 value keys (`feature_map.value_keys` with the salt of
      the feature's table), all of the feature's ids in row order.
    lengths: per feature, [n] int64 ids of each row (1 for a scalar column).
    weights: per feature, [n_f] float32 per-id weights, or None (every id weighs 1).
    dense: [n, Nd] float32, transformed.
    labels: [n] float32 in {0, 1}.
  """

  keys: tuple[np.ndarray, ...]
  lengths: tuple[np.ndarray, ...]
  weights: tuple[np.ndarray | None, ...]
  dense: np.ndarray
  labels: np.ndarray

  @property
  def size(self) -> int:
    """n, rows in the chunk."""
    return int(self.labels.shape[0])


def _is_id_type(t: pa.DataType) -> bool:
  if pa.types.is_dictionary(t):
    t = t.value_type
  return (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
          or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _is_list(t: pa.DataType) -> bool:
  return pa.types.is_list(t) or pa.types.is_large_list(t)


def _is_number(t: pa.DataType) -> bool:
  return pa.types.is_integer(t) or pa.types.is_floating(t)


# role -> (type test, what the role wants, for errors)
_ROLE_TYPES = {
    "label": (lambda t: _is_number(t) or pa.types.is_boolean(t), "an int, float or bool"),
    "dense": (_is_number, "an int or float"),
    "categorical": (_is_id_type, "a scalar int or string"),
    "bag": (lambda t: _is_list(t) and _is_id_type(t.value_type), "a list<int|string>"),
    "weight": (lambda t: _is_list(t) and _is_number(t.value_type), "a list<float>"),
}


def _id_bytes(arr: pa.Array) -> np.ndarray:
  """[n] ids (no nulls) -> [n] bytes: an integer's decimal digits, a string's UTF-8 bytes."""
  if pa.types.is_dictionary(arr.type):
    arr = arr.dictionary_decode()
  if pa.types.is_integer(arr.type):
    return np.asarray(arr.to_numpy(zero_copy_only=False)).astype("S")
  if len(arr) == 0:
    return np.zeros((0,), "S1")
  return np.asarray(arr.cast(pa.large_binary()).to_numpy(zero_copy_only=False)).astype("S")


def _floats(arr: pa.Array) -> np.ndarray:
  return np.asarray(arr.cast(pa.float64()).to_numpy(zero_copy_only=False), np.float64)


def _first_rows(mask: np.ndarray, problems: dict[int, str], reason: str) -> None:
  for i in np.flatnonzero(mask):
    problems.setdefault(int(i), reason)


def _null_rows(arr: pa.Array) -> np.ndarray:
  return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)


def _list_problems(arr: pa.Array) -> np.ndarray:
  """[n] bool rows whose list is null or holds a null."""
  bad = _null_rows(arr)
  flat = arr.flatten()
  if flat.null_count:
    parents = np.asarray(pc.list_parent_indices(arr).to_numpy(zero_copy_only=False))
    bad[parents[_null_rows(flat)]] = True
  return bad


class RowGroupParser:
  """Checks and converts the record batches of one file's row group."""

  def __init__(self, columns: pcols.ParquetColumns, feature_tables: tuple[int, ...],
               num_tables: int):
    self.columns = columns
    self.features = pcols.feature_specs(columns)
    self.feature_tables = feature_tables
    self.salts = feature_map.field_salts(num_tables)
    self.weight_of = {b.name: b.weight_column for b in columns.bags}

  def roles(self) -> list[tuple[str, str]]:
    """(column, role) of every column read, in reading order."""
    c = self.columns
    return ([(c.label, "label")] + [(n, "dense") for n in c.dense]
            + [(n, "categorical") for n in c.categorical] + [(b.name, "bag") for b in c.bags]
            + [(n, "weight") for n in c.weight_columns])

  def check_schema(self, schema: pa.Schema, path: str) -> None:
    """Raises DataFormatError for a missing column or one of the wrong type."""
    for name, role in self.roles():
      if name not in schema.names:
        raise DataFormatError(path, 1, f"row group 0, column {name!r}: missing (data.parquet "
                              f"{role}; the file has {', '.join(schema.names)})")
      test, want = _ROLE_TYPES[role]
      t = schema.field(name).type
      if not test(t):
        raise DataFormatError(path, 1, f"row group 0, column {name!r}: type {t}, want {want} "
                              f"(data.parquet {role})")

  def problems(self, rb: pa.RecordBatch) -> dict[int, tuple[str, str]]:
    """Row in `rb` -> (column, reason) of its first problem, in column order."""
    found: dict[int, tuple[str, str]] = {}

    def flag(mask, name, reason):
      _first_rows(mask, found, (name, reason))  # type: ignore[arg-type]

    c = self.columns
    label = rb.column(c.label)
    flag(_null_rows(label), c.label, "null value")
    values = _floats(pc.fill_null(label, 0) if label.type != pa.bool_() else label.fill_null(False))
    flag((values != 0) & (values != 1), c.label, "label must be 0 or 1")
    for name in c.dense:
      arr = rb.column(name)
      flag(_null_rows(arr), name, "null value")
      flag(~np.isfinite(_floats(arr.fill_null(0))), name, "dense value is not finite")
    for name in c.categorical:
      flag(_null_rows(rb.column(name)), name, "null value")
    for bag in c.bags:
      flag(_list_problems(rb.column(bag.name)), bag.name, "null list or null id in the list")
    for bag in c.bags:
      if not bag.weight_column:
        continue
      w = rb.column(bag.weight_column)
      flag(_list_problems(w), bag.weight_column, "null list or null weight in the list")
      lengths = pc.list_value_length(w).fill_null(0).to_numpy(zero_copy_only=False)
      ids = pc.list_value_length(rb.column(bag.name)).fill_null(0).to_numpy(zero_copy_only=False)
      flag(lengths != ids, bag.weight_column, f"number of weights differs from the ids of "
           f"{bag.name!r}")
      flat = _floats(w.flatten().fill_null(0.0))
      if flat.size and not np.isfinite(flat).all():
        parents = pc.list_parent_indices(w).to_numpy(zero_copy_only=False)
        flag(np.isin(np.arange(rb.num_rows), parents[~np.isfinite(flat)]), bag.weight_column,
             "weight is not finite")
    return found

  def convert(self, rb: pa.RecordBatch) -> tuple[ParquetChunk, int]:
    """A problem-free record batch -> (chunk, ids dropped by truncation)."""
    c = self.columns
    n = rb.num_rows
    keys, lengths, weights, truncated = [], [], [], 0
    for f, spec in enumerate(self.features):
      arr = rb.column(spec.name)
      t = self.feature_tables[f]
      if spec.kind == "one_hot":
        flat, length = arr, np.ones((n,), np.int64)
      else:
        flat = arr.flatten()
        length = np.asarray(pc.list_value_length(arr).to_numpy(zero_copy_only=False), np.int64)
        truncated += int(np.maximum(length - spec.capacity, 0).sum())
      keys.append(feature_map.value_keys(_id_bytes(flat)[:, None], self.salts[t:t + 1])[:, 0])
      lengths.append(length)
      wcol = self.weight_of.get(spec.name, "")
      weights.append(_floats(rb.column(wcol).flatten()).astype(np.float32) if wcol else None)
    dense = (np.stack([_floats(rb.column(d)) for d in c.dense], axis=1) if c.dense
             else np.zeros((n, 0), np.float64))
    dense = text_io.signed_log1p(dense) if c.dense_transform == "log1p" else dense.astype(np.float32)
    label = rb.column(c.label)
    labels = _floats(label.cast(pa.int8()) if label.type == pa.bool_() else label).astype(np.float32)
    return ParquetChunk(tuple(keys), tuple(lengths), tuple(weights), dense, labels), truncated


class ParquetReader:
  """Re-iterable stream of `ParquetChunk`s over Parquet files, one row group at a time.

  Chunk c of a file is its c-th record batch: row group g's rows in pieces of `chunk_rows`
  (the metadata says how many), read alone by `read_chunk` / `read_rows` (per-process
  input: `train/chunk_feed`). `bad_rows_by_file` / `truncated_by_file` hold the rows
  dropped and the ids truncated per file in one pass (repeated epochs do not double
  count); `rows_parsed` counts the rows checked and converted.
  """

  def __init__(self, paths, parser: RowGroupParser, skip_bad_lines: bool = False,
               chunk_rows: int = 8192):
    if chunk_rows < 1:
      raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    self.paths = tuple(paths)
    self.parser = parser
    self.skip_bad_lines = bool(skip_bad_lines)
    self.chunk_rows = int(chunk_rows)
    self.bad_rows_by_file: dict[str, int] = {}
    self.truncated_by_file: dict[str, int] = {}
    self.rows_parsed = 0
    self._index: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    self._cursor: tuple[str, int, int, Iterator[pa.RecordBatch]] | None = None
    self._lock = threading.Lock()

  @property
  def bad_rows(self) -> int:
    """Rows dropped, summed over files (latest full pass of each)."""
    return sum(self.bad_rows_by_file.values())

  @property
  def truncated_ids(self) -> int:
    """Ids dropped by truncation, summed over files."""
    return sum(self.truncated_by_file.values())

  def num_rows(self) -> int:
    """Rows in the files' metadata (before dropping bad ones)."""
    return sum(open_parquet_file(p).metadata.num_rows for p in self.paths)

  def __iter__(self) -> Iterator[ParquetChunk]:
    for path in self.paths:
      bad = truncated = 0
      for c in range(self.num_chunks(path)):
        got = self.read_chunk(path, c)
        assert got is not None  # c < num_chunks
        chunk, num_bad, num_truncated = got
        bad, truncated = bad + num_bad, truncated + num_truncated
        self.record(path, bad, truncated)
        if chunk.size:
          yield chunk
      self.record(path, bad, truncated)

  def num_chunks(self, path: str) -> int:
    """Chunks (record batches of at most `chunk_rows` rows) of `path`, from its metadata."""
    return int(self._chunk_index(path)[0][-1])

  def _chunk_index(self, path: str) -> tuple[np.ndarray, np.ndarray]:
    """([G+1] first chunk of each row group, [G] rows of the file before each), once."""
    if (path, self.chunk_rows) not in self._index:
      pf = open_parquet_file(path)
      self.parser.check_schema(pf.schema_arrow, path)
      rows = np.asarray([pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)],
                        np.int64)
      chunks = np.concatenate([[0], np.cumsum(-(-rows // self.chunk_rows))])
      self._index[(path, self.chunk_rows)] = (chunks, np.cumsum(rows) - rows)
    return self._index[(path, self.chunk_rows)]

  def _record_batch(self, path: str, chunk: int) -> tuple[pa.RecordBatch, int, int] | None:
    """Chunk `chunk` of `path` unparsed: (record batch, row group, rows of the file before
    it), None past the end. Reads on in a row group (the next chunk costs one batch)."""
    starts, before = self._chunk_index(path)
    if not 0 <= chunk < starts[-1]:
      return None
    group = int(np.searchsorted(starts, chunk, side="right")) - 1
    at = chunk - int(starts[group])
    row = int(before[group]) + at * self.chunk_rows
    with self._lock:  # one cursor: a pass and a feed in two threads take turns
      cursor = self._cursor
      if cursor is None or cursor[:2] != (path, group) or cursor[2] > at:
        names = [name for name, _ in self.parser.roles()]
        cursor = (path, group, 0, open_parquet_file(path).iter_batches(self.chunk_rows, row_groups=[group],
                                                           columns=names))
      rb = self._read_on(cursor[3], at - cursor[2] + 1, path, group, row)
      self._cursor = (path, group, at + 1, cursor[3])
    return rb, group, row

  @staticmethod
  def _read_on(batches, count: int, path: str, group: int, row: int) -> pa.RecordBatch:
    """The `count`-th next record batch (the ones between read, not parsed)."""
    try:
      for _ in range(count):
        rb = next(batches)
    except (OSError, pa.ArrowException, StopIteration) as e:
      raise DataFormatError(path, row + 1, f"row group {group}: cannot read it "
                            f"({type(e).__name__}: {e})") from e
    return rb

  def read_chunk(self, path: str, chunk: int) -> tuple[ParquetChunk, int, int] | None:
    """Chunk `chunk` of `path` parsed alone, as a pass parses it: (chunk, rows dropped, ids
    truncated), None past the file's end. Raises `DataFormatError` as a pass would."""
    got = self._record_batch(path, chunk)
    return None if got is None else self._parse(got[0], path, got[1], got[2])

  def read_rows(self, path: str, chunk: int, size: int, at: np.ndarray) -> ParquetChunk:
    """Examples `at` [m] of chunk `chunk`, which held `size` examples in a pass: only those m
    rows are parsed when the pass dropped none of the chunk (example r is row r).

    Raises:
      ValueError: the chunk no longer holds `size` examples (the file changed).
    """
    rb, group, row = self._record_batch(path, chunk) or (None, 0, 0)
    kept = np.arange(0 if rb is None else rb.num_rows)
    if rb is not None and rb.num_rows != size:  # rows were dropped: find which
      self.rows_parsed += rb.num_rows
      kept = np.delete(kept, list(self.parser.problems(rb)))
    if rb is None or kept.size != size:
      raise ValueError(f"input position: chunk {chunk} of {path} held {size} examples when "
                       f"saved, now {kept.size}: the training files changed")
    return self._parse(rb.take(pa.array(kept[at])), path, group, row)[0]

  def _parse(self, rb: pa.RecordBatch, path: str, group: int,
             row: int) -> tuple[ParquetChunk, int, int]:
    self.rows_parsed += rb.num_rows
    problems = self.parser.problems(rb)
    if problems and not self.skip_bad_lines:
      first = min(problems)
      name, reason = problems[first]
      raise DataFormatError(path, row + first + 1, f"row group {group}, column {name!r}: {reason}")
    if problems:
      keep = np.ones((rb.num_rows,), bool)
      keep[list(problems)] = False
      rb = rb.filter(pa.array(keep))
    chunk, truncated = self.parser.convert(rb)
    return chunk, len(problems), truncated

  def record(self, path: str, bad: int, truncated: int) -> None:
    """Records rows dropped and ids truncated of `path` in the current pass."""
    # Every pass drops the same rows: the max is a full pass's count.
    self.bad_rows_by_file[path] = max(bad, self.bad_rows_by_file.get(path, 0))
    self.truncated_by_file[path] = max(truncated, self.truncated_by_file.get(path, 0))


def open_parquet_file(path: str) -> pq.ParquetFile:
  """The Parquet file at `path`; a `DataFormatError` naming it when it cannot be read."""
  try:
    return pq.ParquetFile(path)
  except (OSError, pa.ArrowException) as e:
    raise DataFormatError(path, 1, f"not a readable Parquet file ({type(e).__name__}: {e})") from e
