"""The `parquet` format: Parquet files read with pyarrow, streamed by row group.

`data.format=parquet` reads `data.train_path` / `eval_path` / `test_path` (comma-separated
globs) and the columns `data.parquet` names (`columns`): a label, dense float
columns, scalar int/string categorical columns (one id each) and `list<int|string>`
columns read as bags or sequences. Every file is read one row group at a time, in
record batches of at most `chunk_rows` rows; nothing holds a whole file.

Values map to rows exactly as in the text formats (`feature_map`): the value's bytes (an
integer's decimal digits, a string's UTF-8 bytes) keyed per TABLE with the table's salt,
then hashed (`data.hash_rows`) or looked up in a vocabulary built in one pass over the
train files (`data.min_count`). Without list columns or shared tables table t is field t,
so Parquet and text files holding the same rows give the same ids, batches and metrics.
Dense values are taken as given floats (`data.parquet.dense_transform='log1p'` applies the
Criteo reader's sign(x) * log(1 + |x|)).

With bags the data set has a `FeatureLayout` and every batch carries `weights`
(`sfjax.data.types.Batch`): a bag keeps its first `capacity` ids, a sequence its last
(most recent) ones, left-aligned; the ids dropped are counted in `stats['truncated_ids']`.

Bad input: a missing column or a column of the wrong type is a `DataFormatError` naming
the file, row group and column, always. A null (a null scalar, list or list element), a
label other than 0/1, a non-finite dense value or weight, or a weight list whose length
differs from its bag's names file, row group, column and the 1-based row of the file (the
error's `line`); with `data.skip_bad_lines` such rows are dropped and counted.
"""

from __future__ import annotations

from collections.abc import Iterator

import ml_collections
import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.data import batching, feature_map, text_io
from sfjax.data.parquet import columns as pcols
from sfjax.data.parquet.reader import (
  ParquetChunk,
  ParquetReader,
  RowGroupParser,
  open_parquet_file,
)
from sfjax.data.types import Batch, DatasetSpec, FieldSpec, make_batch


def chunk_batch(chunk: ParquetChunk, mapper: feature_map.FeatureMapper,
                layout: fl.FeatureLayout, feature_tables: tuple[int, ...],
                with_layout: bool) -> Batch:
  """Maps a chunk's keys to rows and lays them out as a `Batch`.

  Args:
    chunk: the parsed rows.
    mapper: keys -> rows, one mapper field per table.
    layout: the features (capacities, kinds).
    feature_tables: [F] the table (mapper field) of each feature.
    with_layout: False: one id per feature, ids [n, F] and weights None (the text
      formats' batch); True: ids [n, S] with -1 padding and weights [n, S].
  """
  n = chunk.size
  rows = [mapper.rows_of_keys(k, t) for k, t in zip(chunk.keys, feature_tables, strict=True)]
  if not with_layout:
    ids = np.stack(rows, axis=1) if rows else np.zeros((n, 0), np.int64)
    return make_batch(ids, chunk.dense, chunk.labels)
  ids = np.full((n, layout.num_columns), fl.PADDING_ID, np.int64)
  weights = np.zeros((n, layout.num_columns), np.float32)
  for f, spec in enumerate(layout.features):
    length = chunk.lengths[f]
    row_of = np.repeat(np.arange(n), length)
    position = np.arange(row_of.shape[0]) - np.repeat(np.cumsum(length) - length, length)
    if spec.kind == "sequence":  # keep the most recent (last) ids, left-aligned
      position = position - np.repeat(np.maximum(length - spec.capacity, 0), length)
    keep = (position >= 0) & (position < spec.capacity)
    column = layout.feature_starts[f] + position[keep]
    ids[row_of[keep], column] = rows[f][keep]
    w = chunk.weights[f]
    weights[row_of[keep], column] = 1.0 if w is None else w[keep]
  return make_batch(ids, chunk.dense, chunk.labels, weights=weights)


def _table_keys(chunk: ParquetChunk, feature_tables: tuple[int, ...], num_tables: int):
  """Per table, the keys of every feature reading it (a vocabulary key chunk)."""
  return [np.concatenate([np.zeros((0,), np.uint64)] +
                         [k for k, t in zip(chunk.keys, feature_tables, strict=True) if t == table])
          for table in range(num_tables)]


class ParquetDataset:
  """`CTRDataset` over Parquet files (`data.format=parquet`; see the module docstring).

  Args:
    data_cfg: the `data` block: train/eval/test paths, hash_rows / min_count,
      skip_bad_lines, shuffle_buffer and the `parquet` block.
    chunk_rows: rows per record batch read.

  Raises:
    ConfigError: a bad `data.parquet` field.
    ValueError: an empty path setting or a split without rows.
    DataFormatError: a missing column or a wrong type (and, unless skip_bad_lines, a bad
      row) met while reading.
  """

  def __init__(self, data_cfg: ml_collections.ConfigDict, chunk_rows: int = 8192):
    if not str(data_cfg.train_path).strip():
      raise ValueError("data.train_path is empty: data.format='parquet' reads files "
                       "(comma-separated globs)")
    if int(data_cfg.shuffle_buffer) < 0:
      raise ValueError(f"data.shuffle_buffer must be >= 0, got {data_cfg.shuffle_buffer}")
    self.format_name = "parquet"
    self.shuffle_buffer = int(data_cfg.shuffle_buffer)
    split_paths = {"train": ("data.train_path", data_cfg.train_path),
                   "eval": ("data.eval_path", data_cfg.eval_path),
                   "test": ("data.test_path", data_cfg.test_path)}
    self._keys = {name: key for name, (key, spec) in split_paths.items() if str(spec).strip()}
    paths = {name: text_io.expand_paths(str(split_paths[name][1]), key)
             for name, key in self._keys.items()}
    columns = pcols.parse_columns(data_cfg.get("parquet", ml_collections.ConfigDict()))
    columns = columns.with_categorical(open_parquet_file(paths["train"][0]).schema_arrow.names)
    pcols.check_features(columns)
    self.columns = columns
    self.table_names = pcols.table_names(columns)
    features = pcols.feature_specs(columns)
    self.feature_tables = tuple(self.table_names.index(f.table) for f in features)
    parser = RowGroupParser(columns, self.feature_tables, len(self.table_names))
    skip = bool(data_cfg.skip_bad_lines)
    self._readers = {name: ParquetReader(p, parser, skip, chunk_rows) for name, p in paths.items()}
    for name, reader in self._readers.items():
      if not reader.num_rows():  # fail now, not at the first evaluation
        raise ValueError(f"{self._keys[name]}: split {name!r} has no examples: no row in "
                         f"{', '.join(reader.paths)}")
    self.eval_splits = tuple(name for name in ("eval", "test") if name in self._readers)
    train, num_tables = self._readers["train"], len(self.table_names)
    self.mapper = feature_map.make_mapper(
        data_cfg.hash_rows, data_cfg.min_count,
        lambda: (_table_keys(c, self.feature_tables, num_tables) for c in train), num_tables,
        chunks_are_keys=True)
    self.has_layout = columns.has_layout
    table_rows = _table_rows(self.mapper, num_tables)
    self.layout = fl.FeatureLayout(
        tuple(fl.TableSpec(n, r) for n, r in zip(self.table_names, table_rows, strict=True)), features)
    fields = tuple(FieldSpec(f.name, table_rows[t]) for f, t in zip(features, self.feature_tables,
                                                                     strict=True))
    self.spec = DatasetSpec(fields, len(columns.dense), self.layout if self.has_layout else None)
    self.oracle = None

  @property
  def stats(self) -> dict:
    """'bad_lines' (rows dropped, all splits), 'truncated_ids', and both per split."""
    bad = {name: r.bad_rows for name, r in self._readers.items()}
    truncated = {name: r.truncated_ids for name, r in self._readers.items()}
    return {"bad_lines": sum(bad.values()), "bad_lines_by_split": bad,
            "truncated_ids": sum(truncated.values()), "truncated_ids_by_split": truncated}

  @property
  def paths(self) -> dict[str, tuple[str, ...]]:
    """Per split, the files read (globs expanded, in reading order)."""
    return {name: r.paths for name, r in self._readers.items()}

  @property
  def train_reader(self) -> ParquetReader:
    """The training files' reader (`read_chunk`: per-process input, `train/chunk_feed`)."""
    return self._readers["train"]

  def map_chunk(self, chunk: ParquetChunk) -> Batch:
    """A parsed chunk as the batch `chunks` yields for it (ids mapped, bags laid out)."""
    return chunk_batch(chunk, self.mapper, self.layout, self.feature_tables, self.has_layout)

  def chunks(self, split: str) -> Iterator[Batch]:
    """One pass over a split as mapped, variable-size batches (file and row order)."""
    if split not in self._readers:
      raise ValueError(f"unknown split {split!r} (known: {', '.join(self._readers)})")
    reader = self._readers[split]
    examples = 0
    for chunk in reader:
      examples += chunk.size
      yield self.map_chunk(chunk)
    if not examples:  # every row was bad and skipped (data.skip_bad_lines)
      raise ValueError(f"{self._keys[split]}: split {split!r} has no examples: all "
                       f"{reader.bad_rows} rows of {', '.join(reader.paths)} were bad and skipped")

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite full batches: epochs through a seeded streaming shuffle buffer."""
    return batching.train_batches(lambda: self.chunks("train"), batch_size, self.shuffle_buffer,
                                  seed)

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite batches in file order, the last one padded with mask 0."""
    if split not in self.eval_splits:
      known = ", ".join(self.eval_splits) or "none: set data.eval_path / data.test_path"
      raise ValueError(f"unknown eval split {split!r} (known: {known})")
    return batching.eval_batches(self.chunks(split), batch_size)


def _table_rows(mapper: feature_map.FeatureMapper, num_tables: int) -> tuple[int, ...]:
  """Rows of each table (mapper field)."""
  if isinstance(mapper, feature_map.HashingMapper):
    return (int(mapper.num_rows),) * num_tables
  assert isinstance(mapper, feature_map.Vocabulary)
  return tuple(mapper.field_rows)
