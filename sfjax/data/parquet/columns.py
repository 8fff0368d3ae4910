"""Which Parquet columns a data set reads, and how: the `data.parquet` config block, parsed.

  label            the label column (int, float or bool; every value 0 or 1).
  dense            comma-separated float/int columns, taken as given floats, or through
                   `dense_transform='log1p'` (sign(x) * log(1 + |x|), the Criteo reader's).
  categorical      comma-separated scalar int/string columns, one one-hot feature each;
                   '' = every scalar column of the first train file that is not the label,
                   dense, a bag or a weight column (in file order).
  bags             list<int|string> columns, comma-separated entries
                   `name:kind:capacity[:pooling][:weight column]`, kind multi_hot|sequence,
                   pooling sum|mean|sqrtn (multi_hot; default sum; a sequence takes none),
                   the weight column a list<float> holding one weight per id (multi_hot).
                   E.g. 'genres:multi_hot:8:mean,history:sequence:20,tags:multi_hot:16:sum:w'.
  shared_tables    comma-separated `feature=owner`: `feature` reads the table of `owner`
                   (a feature that owns its table), e.g. 'history=item_id'.

Without bags and shared tables the data set has no feature layout: one id per field,
`Batch.weights` None, exactly like the text formats. Every feature owns a table named
after it unless it is shared.
"""

from __future__ import annotations

import dataclasses

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError

DENSE_TRANSFORMS = ("none", "log1p")
_BAG_KINDS = ("multi_hot", "sequence")


def _bad(field: str, message: str) -> ConfigError:
  return ConfigError(f"config field data.parquet.{field}: {message}")


@dataclasses.dataclass(frozen=True)
class BagColumn:
  """One list column read as a bag or a sequence.

  Attributes:
    name: the column (and feature) name.
    kind: 'multi_hot' | 'sequence'.
    capacity: ids kept per example (bags keep the first, sequences the last ones).
    pooling: 'sum' | 'mean' | 'sqrtn' ('mean' for a sequence).
    weight_column: a list<float> column of per-id weights, or '' (every id weighs 1).
  """

  name: str
  kind: str
  capacity: int
  pooling: str = "sum"
  weight_column: str = ""


@dataclasses.dataclass(frozen=True)
class ParquetColumns:
  """The parsed `data.parquet` block.

  Attributes:
    label: the label column.
    dense: dense columns, in order.
    categorical: scalar categorical columns, in order; () = every other scalar column.
    bags: list columns.
    shared: (feature, owner) pairs: `feature` reads `owner`'s table.
    dense_transform: 'none' | 'log1p'.
  """

  label: str
  dense: tuple[str, ...]
  categorical: tuple[str, ...]
  bags: tuple[BagColumn, ...]
  shared: tuple[tuple[str, str], ...]
  dense_transform: str

  @property
  def has_layout(self) -> bool:
    """Bags or shared tables: the data set needs a `FeatureLayout`."""
    return bool(self.bags or self.shared)

  @property
  def weight_columns(self) -> tuple[str, ...]:
    """The per-id weight columns of the bags."""
    return tuple(b.weight_column for b in self.bags if b.weight_column)

  def reserved(self) -> set[str]:
    """Columns that are not scalar categorical features."""
    return {self.label, *self.dense, *(b.name for b in self.bags), *self.weight_columns}

  def with_categorical(self, schema_names) -> ParquetColumns:
    """`categorical` resolved: the given names, or every unreserved column of `schema_names`."""
    if self.categorical:
      return self
    reserved = self.reserved()
    return dataclasses.replace(
        self, categorical=tuple(n for n in schema_names if n not in reserved))


def _names(text: str) -> tuple[str, ...]:
  return tuple(n.strip() for n in str(text).split(",") if n.strip())


def _parse_bag(entry: str) -> BagColumn:
  parts = [p.strip() for p in entry.split(":")]
  where = f"bags: entry {entry!r}"
  if not 3 <= len(parts) <= 5 or not parts[0]:
    raise _bad("bags", f"entry {entry!r}: want name:kind:capacity[:pooling][:weight column]")
  name, kind, capacity = parts[:3]
  if kind not in _BAG_KINDS:
    raise ConfigError(f"config field data.parquet.{where}: kind must be one of {_BAG_KINDS}, "
                      f"got {kind!r}")
  try:
    cap = int(capacity)
  except ValueError:
    cap = 0
  if cap < 1:
    raise ConfigError(f"config field data.parquet.{where}: capacity must be an integer >= 1, "
                      f"got {capacity!r}")
  pooling = parts[3] if len(parts) > 3 and parts[3] else ("mean" if kind == "sequence" else "sum")
  if pooling not in fl.POOLINGS:
    raise ConfigError(f"config field data.parquet.{where}: pooling must be one of "
                      f"{fl.POOLINGS}, got {pooling!r}")
  if kind == "sequence" and (pooling != "mean" or len(parts) > 4):
    raise ConfigError(f"config field data.parquet.{where}: a sequence takes no pooling and no "
                      "weight column (models read it unpooled, or mean-pooled)")
  weight = parts[4] if len(parts) > 4 else ""
  return BagColumn(name, kind, cap, pooling, weight)


def _parse_shared(text: str) -> tuple[tuple[str, str], ...]:
  pairs = []
  for entry in _names(text):
    feature, sep, owner = (p.strip() for p in entry.partition("="))
    if not sep or not feature or not owner:
      raise _bad("shared_tables", f"entry {entry!r}: want feature=owner (e.g. history=item_id)")
    if feature == owner:
      raise _bad("shared_tables", f"entry {entry!r}: a feature cannot share its own table")
    pairs.append((feature, owner))
  return tuple(pairs)


def _check_unique(columns: ParquetColumns) -> None:
  """Each column plays one role."""
  roles: dict[str, str] = {}
  uses = ([(columns.label, "label")] + [(n, "dense") for n in columns.dense]
          + [(n, "categorical") for n in columns.categorical] + [(b.name, "bags") for b in columns.bags]
          + [(n, "bags") for n in columns.weight_columns])
  for name, role in uses:
    if name in roles:
      raise _bad(role, f"column {name!r} is already used as {roles[name]}")
    roles[name] = role


def parse_columns(cfg) -> ParquetColumns:
  """Parses and validates the `data.parquet` block (a ConfigDict or a mapping).

  Raises:
    ConfigError: naming the bad `data.parquet.<field>`.
  """
  get = cfg.get if hasattr(cfg, "get") else lambda k, d=None: getattr(cfg, k, d)
  label = str(get("label", "label")).strip()
  if not label:
    raise _bad("label", "must name the label column")
  transform = str(get("dense_transform", "none"))
  if transform not in DENSE_TRANSFORMS:
    raise _bad("dense_transform", f"must be one of {DENSE_TRANSFORMS}, got {transform!r}")
  bags = tuple(_parse_bag(e) for e in str(get("bags", "")).split(",") if e.strip())
  columns = ParquetColumns(label, _names(get("dense", "")), _names(get("categorical", "")), bags,
                           _parse_shared(get("shared_tables", "")), transform)
  _check_unique(columns)
  shared = dict(columns.shared)
  if len(shared) != len(columns.shared):
    raise _bad("shared_tables", "a feature is listed twice")
  for feature, owner in columns.shared:
    if owner in shared:
      raise _bad("shared_tables", f"{feature}={owner}: {owner!r} reads another table itself "
                 f"({owner}={shared[owner]}); name the owner")
  return columns


def check_features(columns: ParquetColumns) -> None:
  """Checks the shared tables against the resolved features (after `with_categorical`).

  Raises:
    ConfigError: a shared feature or owner is not a feature of the data set.
  """
  features = set(columns.categorical) | {b.name for b in columns.bags}
  if not features:
    raise _bad("categorical", "the files hold no categorical column and data.parquet.bags is "
               "empty: nothing to embed")
  for feature, owner in columns.shared:
    for name in (feature, owner):
      if name not in features:
        raise _bad("shared_tables", f"{feature}={owner}: {name!r} is not a categorical or bag "
                   f"column (features: {', '.join(sorted(features))})")


def feature_specs(columns: ParquetColumns) -> tuple[fl.FeatureSpec, ...]:
  """The features, in field order: the categorical columns, then the bags."""
  owner = dict(columns.shared)
  specs = [fl.FeatureSpec(n, owner.get(n, n)) for n in columns.categorical]
  specs += [fl.FeatureSpec(b.name, owner.get(b.name, b.name), b.kind, b.capacity, b.pooling,
                           bool(b.weight_column)) for b in columns.bags]
  return tuple(specs)


def table_names(columns: ParquetColumns) -> tuple[str, ...]:
  """The tables, in feature order: every feature that is not shared owns one."""
  shared = dict(columns.shared)
  return tuple(f.name for f in feature_specs(columns) if f.name not in shared)
