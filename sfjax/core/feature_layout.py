"""Feature and table specs: how a batch's id columns map onto tables and pooled fields.

A CTR example has features of three kinds (issue #22; TorchRec's
`EmbeddingBagCollection`, jax-tpu-embedding's `FeatureSpec`):

  one_hot    one id per example (capacity 1): today's field.
  multi_hot  a bag of up to `capacity` ids, pooled to one vector (sum, mean, sqrtn),
             each id optionally weighted (genres, tags, a basket's categories).
  sequence   up to `capacity` ids in time order, most recent last (a user's history);
             a sequence-aware model (DIN) reads them unpooled with their mask, any other
             model reads them mean-pooled.

Tables are declared apart from features: two features may share one (`item_id` and
`history_item_ids`). Every feature owns `capacity` consecutive id COLUMNS of the host
batch (`Batch.ids [B, S]`, S = sum of capacities); an unused column holds the padding
id -1 and weight 0. Padding never reaches a table: VSI gives it no unique row
(`sfjax.embedding.vsi`), so it has no gradient, no cache slot and no host traffic.

All tables live in one concatenated table of V rows (each table a row range), so
VSI deduplicates across features and tables before anything moves and both
embedding backends stay unchanged. Every table is stored at the model's row width E;
a table may declare a smaller embedding dim d (`TableSpec.dim`): the model then reads
only the first d of the D latent columns of its rows (the others are multiplied by 0
before pooling, so they get no gradient and never change; a first-order column stays),
and row-wise Adagrad averages over the row's own columns. This sets the model's
capacity per table; the host table stores such a table's rows at their own width
(`sfjax.embedding.packed_rows`), the device table and cache keep them E wide. Per-feature
widths of a composed model are its field groups (`models.field_layout`).
A table may set its own row optimizer, learning rate and initializer (issue #22
Deliver 1; ""/0 = the `embedding` block's): the step then learns each unique row's
table (`DeviceBatch.row_tables`, from `row_tables`) and applies
`row_optimizers.per_table`; initial rows take their table's stddev and slots.

The layout is static (frozen, hashable): the data set describes it
(`DatasetSpec.layout`), the model wrapper pools with it (`sfjax.models.behavior.pooling`).
None everywhere means today's layout: one one-hot feature per field, each its own table.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sfjax.core.errors import ConfigError

FEATURE_KINDS = ("one_hot", "multi_hot", "sequence")
POOLINGS = ("sum", "mean", "sqrtn")
PADDING_ID = -1  # an unused id column (host side); never looked up


@dataclasses.dataclass(frozen=True)
class TableSpec:
  """One embedding table: a row range of the concatenated table.

  Attributes:
    name: the table's name (features refer to it).
    num_rows: rows of the table.
    optimizer: the table's row optimizer (a `row_optimizers.ROW_OPTIMIZER_NAMES` name);
      "" = `embedding.optimizer`.
    learning_rate: its row learning rate (> 0); 0 = `embedding.learning_rate`.
    init_stddev: standard deviation of its initial rows (> 0); 0 = `embedding.init_stddev`.
    dim: its embedding dim d (1 <= d <= `model.embed_dim`): the model reads the first d
      latent columns of its rows; 0 = all of them.
  """

  name: str
  num_rows: int
  optimizer: str = ""
  learning_rate: float = 0.0
  init_stddev: float = 0.0
  dim: int = 0

  @property
  def overrides(self) -> bool:
    """True when the table sets its own optimizer, learning rate or initializer."""
    return bool(self.optimizer) or self.learning_rate != 0 or self.init_stddev != 0


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """One input feature: the table it reads, how many ids an example holds, how they pool.

  Attributes:
    name: the feature's name (a column of the input).
    table: name of the table it reads.
    kind: 'one_hot' | 'multi_hot' | 'sequence'.
    capacity: ids per example at most (1 for one_hot); longer inputs are truncated
      (a sequence keeps its most recent ids) and counted by the reader.
    pooling: 'sum' | 'mean' | 'sqrtn' (multi_hot; sequences pool by 'mean' for models
      that do not read them unpooled).
    weighted: the input carries a weight per id (multi_hot only); else every id weighs 1.
  """

  name: str
  table: str
  kind: str = "one_hot"
  capacity: int = 1
  pooling: str = "sum"
  weighted: bool = False


@dataclasses.dataclass(frozen=True)
class FeatureLayout:
  """Tables and features of a data set; the static map from id columns to fields.

  Attributes:
    tables: the tables, in row order of the concatenated table.
    features: the features, in field order (F = len(features)); feature f owns the
      id columns `columns(f)`.
  """

  tables: tuple[TableSpec, ...]
  features: tuple[FeatureSpec, ...]

  def __post_init__(self):
    check_layout(self)

  @property
  def num_features(self) -> int:
    """F, the pooled fields a model sees."""
    return len(self.features)

  @property
  def num_columns(self) -> int:
    """S, id columns of a batch (sum of the features' capacities)."""
    return int(sum(f.capacity for f in self.features))

  @property
  def total_rows(self) -> int:
    """V, rows of the concatenated table."""
    return int(sum(t.num_rows for t in self.tables))

  @property
  def has_padding(self) -> bool:
    """True when some feature holds more than one id (its columns may be padded)."""
    return any(f.capacity > 1 for f in self.features)

  def table_index(self, name: str) -> int:
    """Index of the table called `name`."""
    for i, t in enumerate(self.tables):
      if t.name == name:
        return i
    raise KeyError(name)

  @property
  def table_offsets(self) -> np.ndarray:
    """[T] int64 start of each table in the concatenated table."""
    rows = [t.num_rows for t in self.tables]
    return np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)

  @property
  def feature_tables(self) -> tuple[int, ...]:
    """[F] the table index each feature reads."""
    return tuple(self.table_index(f.table) for f in self.features)

  @property
  def feature_starts(self) -> tuple[int, ...]:
    """[F] first id column of each feature."""
    caps = [f.capacity for f in self.features]
    return tuple(int(x) for x in np.concatenate([[0], np.cumsum(caps)[:-1]]))

  def columns(self, feature: int) -> slice:
    """The id columns of feature `feature`."""
    start = self.feature_starts[feature]
    return slice(start, start + self.features[feature].capacity)

  @property
  def column_features(self) -> np.ndarray:
    """[S] int32 feature index of each id column."""
    return np.repeat(np.arange(self.num_features, dtype=np.int32),
                     [f.capacity for f in self.features])

  @property
  def column_offsets(self) -> np.ndarray:
    """[S] int64 start row (its table's) of each id column."""
    per_feature = self.table_offsets[list(self.feature_tables)]
    return np.repeat(per_feature, [f.capacity for f in self.features]).astype(np.int64)

  @property
  def column_rows(self) -> np.ndarray:
    """[S] int64 rows of each id column's table."""
    rows = np.asarray([self.tables[t].num_rows for t in self.feature_tables], np.int64)
    return np.repeat(rows, [f.capacity for f in self.features])

  @property
  def has_table_settings(self) -> bool:
    """True when some table overrides the `embedding` optimizer, rate or initializer."""
    return any(t.overrides for t in self.tables)

  @property
  def column_dims(self) -> np.ndarray:
    """[S] int64 embedding dim of each id column's table (0: the model's)."""
    dims = np.asarray([self.tables[t].dim for t in self.feature_tables], np.int64)
    return np.repeat(dims, [f.capacity for f in self.features])

  def sequence_features(self) -> tuple[int, ...]:
    """Indices of the sequence features."""
    return tuple(i for i, f in enumerate(self.features) if f.kind == "sequence")


def row_tables(table_starts: np.ndarray, rows: np.ndarray) -> np.ndarray:
  """[N] int32 table index of each row `rows [N]` of the concatenated table.

  Args:
    table_starts: [T] ascending first row of each table (`FeatureLayout.table_offsets`).
    rows: [N] rows; a negative (padding) row reads as table 0, a row past the end as the
      last table (padding entries are never written, so any table will do).
  """
  index = np.searchsorted(np.asarray(table_starts, np.int64), np.asarray(rows, np.int64),
                          side="right") - 1
  return np.maximum(index, 0).astype(np.int32)


def one_hot_layout(field_names, field_rows) -> FeatureLayout:
  """Today's layout: one one-hot feature per field, each reading its own table."""
  names = tuple(str(n) for n in field_names)
  tables = tuple(TableSpec(n, int(r)) for n, r in zip(names, field_rows, strict=True))
  return FeatureLayout(tables, tuple(FeatureSpec(n, n) for n in names))


def layout_to_json(layout: FeatureLayout) -> dict:
  """A JSON-ready dict of the layout (checkpoints, exports, serving bundles)."""
  return {"tables": [dataclasses.asdict(t) for t in layout.tables],
          "features": [dataclasses.asdict(f) for f in layout.features]}


def layout_from_json(data: dict) -> FeatureLayout:
  """The layout `layout_to_json` wrote (checked like any layout)."""
  return FeatureLayout(tuple(TableSpec(**t) for t in data["tables"]),
                       tuple(FeatureSpec(**f) for f in data["features"]))


def live_columns(layout: FeatureLayout, latent_dim: int, width: int) -> np.ndarray | None:
  """[S, width] float32 1/0: the row columns the model reads through each id column
  (`TableSpec.dim`); None when every table reads all of them.

  Columns `[d, latent_dim)` of a table of dim d are 0; the latent columns come first in a
  row and any after them (a first-order weight) stay 1.

  Raises:
    ConfigError: naming `features.tables.<name>.dim`, for a dim above `latent_dim`.
  """
  if not any(t.dim for t in layout.tables):
    return None
  check_table_dims(layout, latent_dim)
  return live_mask(layout.column_dims, latent_dim, width).astype(np.float32)


def live_mask(column_dims, latent_dim: int, width: int):
  """`[S, width]` bool: column j of id column s's rows is read when `j < column_dims[s]`
  (0: `latent_dim`, every latent column) or `j >= latent_dim` (a first-order weight).

  `column_dims [S]` is a numpy array (a numpy mask comes back) or a jax array, traced or
  not (a jax mask: a search trial's dims, `sfjax.cohorts.table_choices.table_dims`).
  """
  dims = column_dims + (column_dims == 0) * latent_dim
  col = np.arange(width)
  return (col[None, :] < dims[:, None]) | (col[None, :] >= latent_dim)


def check_table_dims(layout: FeatureLayout, latent_dim: int) -> None:
  """Raises ConfigError naming `features.tables.<name>.dim` of the first table whose dim
  is above the model's `latent_dim`."""
  for t in layout.tables:
    if t.dim > latent_dim:
      raise _bad(f"features.tables.{t.name}.dim", f"{t.dim} is above the model's embedding "
                 f"dim {latent_dim} (model.embed_dim)")


def table_row_widths(layout: FeatureLayout, latent_dim: int, width: int
                     ) -> tuple[int | None, ...]:
  """[T] the columns each table's rows train (`dim` plus those after the latent ones:
  row-wise Adagrad's `row_width`); None for a table of the model's dim."""
  return tuple(None if not t.dim else int(t.dim) + width - latent_dim for t in layout.tables)


def table_ranges(layout: FeatureLayout) -> list[dict]:
  """`[{"name", "rows"}]` per table, in row order: the concatenated table's row ranges."""
  return [{"name": t.name, "rows": int(t.num_rows)} for t in layout.tables]


def _bad(field: str, message: str) -> ConfigError:
  return ConfigError(f"config field {field}: {message}")


def _check_table(t: TableSpec) -> None:
  """Raises ConfigError naming the table's first bad field.

  An unknown optimizer name is refused where the optimizer is built
  (`row_optimizers.make(..., field="features.tables.<name>.optimizer")`): the name
  registry lives in `embedding`, above `core`.
  """
  where = f"features.tables.{t.name}"
  if int(t.num_rows) < 1:
    raise _bad(f"{where}.num_rows", f"must be >= 1, got {t.num_rows}")
  if not isinstance(t.optimizer, str):
    raise _bad(f"{where}.optimizer", f"must be a row optimizer name, got {t.optimizer!r}")
  if isinstance(t.dim, bool) or not isinstance(t.dim, (int, np.integer)) or t.dim < 0:
    raise _bad(f"{where}.dim", f"must be an integer >= 1 (0: model.embed_dim), got {t.dim!r}")
  for name in ("learning_rate", "init_stddev"):
    value = getattr(t, name)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
        or not math.isfinite(value) or value < 0):
      raise _bad(f"{where}.{name}", f"must be a finite number >= 0 (0: embedding.{name}), "
                 f"got {value!r}")


def check_layout(layout: FeatureLayout) -> None:
  """Raises ConfigError naming the first bad table or feature field."""
  seen = set()
  for t in layout.tables:
    if t.name in seen:
      raise _bad(f"features.tables.{t.name}", "declared twice")
    seen.add(t.name)
    _check_table(t)
  if not layout.features:
    raise _bad("features", "declares no feature")
  names = set()
  for f in layout.features:
    where = f"features.inputs.{f.name}"
    if f.name in names:
      raise _bad(where, "declared twice")
    names.add(f.name)
    if f.table not in seen:
      raise _bad(f"{where}.table", f"unknown table {f.table!r}; tables: {sorted(seen)}")
    if f.kind not in FEATURE_KINDS:
      raise _bad(f"{where}.kind", f"must be one of {FEATURE_KINDS}, got {f.kind!r}")
    if f.kind == "one_hot" and int(f.capacity) != 1:
      raise _bad(f"{where}.capacity", f"a one_hot feature holds 1 id, got {f.capacity}")
    if int(f.capacity) < 1:
      raise _bad(f"{where}.capacity", f"must be >= 1, got {f.capacity}")
    if f.pooling not in POOLINGS:
      raise _bad(f"{where}.pooling", f"must be one of {POOLINGS}, got {f.pooling!r}")
    if f.weighted and f.kind != "multi_hot":
      raise _bad(f"{where}.weighted", f"per-id weights need kind multi_hot, not {f.kind}")
