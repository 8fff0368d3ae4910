"""The static description of a host table (`HostTableSpec`) and the row stores it implies.

A spec is what `meta.json` records and what every write is validated against: rows V, row
width E, slot columns S, the lazy initializer (seed, stddev, initial slot row; per-table
values when a feature layout sets its own), the stored dtype, and each table's own embedding
dim. A table of dim d < the model's latent dim is *packed*: its rows are stored at their own
width (`sfjax.embedding.packed_rows`), so the arrays behind a spec are `[V, E]` / `[V, S]`,
or flat buffers (`array_shapes`), read and written through one interface (`row_stores`).
`sfjax.embedding.host_table.HostTable` holds the arrays.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sfjax.embedding import host_table_files, packed_rows, row_dtype
from sfjax.embedding.initializers import TableInits


@dataclasses.dataclass(frozen=True)
class HostTableSpec:
  """Static description of a host table.

  Attributes:
    num_rows: V, number of rows (global ids are in [0, V)).
    width: E, embedding row width.
    slot_width: S, optimizer slot columns per row (0 for SGD).
    seed: seed of the deterministic row initialiser.
    init_stddev: standard deviation of `init_rows`.
    initial_slot_row: the S slot values of a never-written row.
    tables: None (every row alike), or per-table `(starts [T], stddevs [T], slot rows
      [T][S])` of a never-written row, which then override the two above.
    dtype: the dtype rows are stored in ('float32', 'bfloat16', 'float16'; slots stay
      float32); initial rows are rounded to it (nearest even), like the device table's.
    table_dims: None, or [T] each table's embedding dim (0: `latent_dim`), with `tables`:
      a table of dim d < `latent_dim` STORES only its kept columns (`packed_rows`: the
      first d, and those past `latent_dim`), and its per-element slots likewise.
    latent_dim: the model's latent columns D (used with `table_dims`).
  """

  num_rows: int
  width: int
  slot_width: int
  seed: int
  init_stddev: float
  initial_slot_row: tuple[float, ...]
  tables: tuple[tuple[int, ...], tuple[float, ...], tuple[tuple[float, ...], ...]] | None = None
  dtype: str = "float32"
  table_dims: tuple[int, ...] | None = None
  latent_dim: int = 0

  def table_inits(self) -> TableInits | None:
    """`tables` as the initializer's arrays (None when every row is alike)."""
    if self.tables is None:
      return None
    starts, stddevs, slot_rows = self.tables
    dims = None if self.table_dims is None else np.asarray(self.table_dims, np.int64)
    return TableInits(np.asarray(starts, np.int64), np.asarray(stddevs, np.float64),
                      np.asarray(slot_rows, np.float32).reshape(len(starts), self.slot_width),
                      dims, int(self.latent_dim))

  @property
  def packed(self) -> bool:
    """True when some table stores fewer columns than the row's (`table_dims`)."""
    return self.table_dims is not None and any(0 < d < self.latent_dim for d in self.table_dims)

  def packing(self) -> tuple[packed_rows.PackedLayout, packed_rows.PackedLayout | None]:
    """(values, slots) `PackedLayout`s of a `packed` table; slots None when they are not
    per-element (a row-wise accumulator: every table keeps its column)."""
    assert self.tables is not None and self.table_dims is not None
    starts = self.tables[0]
    e, s, d = self.width, self.slot_width, self.latent_dim
    values = packed_rows.packed_layout(
        starts, self.num_rows, e, tuple(packed_rows.column_ranges(t, d, e) for t in self.table_dims))
    groups = packed_rows.slot_groups(s, e)
    if not groups:
      return values, None
    slots = packed_rows.packed_layout(
        starts, self.num_rows, s,
        tuple(packed_rows.column_ranges(t, d, e, groups) for t in self.table_dims))
    return values, slots

  def __post_init__(self):
    row_dtype.row_dtype(self.dtype, "HostTableSpec.dtype")
    for name, low in (("num_rows", 1), ("width", 1), ("slot_width", 0)):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"HostTableSpec.{name} must be an int >= {low}, got {value!r}")
    if not (math.isfinite(self.init_stddev) and self.init_stddev >= 0):
      raise ValueError(f"HostTableSpec.init_stddev must be finite and >= 0, got {self.init_stddev}")
    if len(self.initial_slot_row) != self.slot_width:
      raise ValueError(f"HostTableSpec.initial_slot_row has {len(self.initial_slot_row)} values, "
                       f"slot_width is {self.slot_width}")
    if not all(math.isfinite(v) for v in self.initial_slot_row):
      raise ValueError(f"HostTableSpec.initial_slot_row must be finite, got {self.initial_slot_row}")
    if self.tables is not None:
      starts, stddevs, slot_rows = self.tables
      ok = (len(starts) == len(stddevs) == len(slot_rows) > 0 and starts[0] == 0
            and all(len(r) == self.slot_width for r in slot_rows)
            and all(math.isfinite(v) and v >= 0 for v in stddevs))
      if not ok:
        raise ValueError(f"HostTableSpec.tables must be T starts (from 0), T finite stddevs "
                         f">= 0 and T slot rows of {self.slot_width}, got {self.tables}")
    if self.table_dims is not None:
      if self.tables is None or len(self.table_dims) != len(self.tables[0]):
        raise ValueError(f"HostTableSpec.table_dims must give one dim per table of `tables`, "
                         f"got {self.table_dims}")
      if not (0 < self.latent_dim <= self.width and all(d >= 0 for d in self.table_dims)):
        raise ValueError(f"HostTableSpec.table_dims {self.table_dims} need dims >= 0 and a "
                         f"latent_dim in [1, {self.width}], got {self.latent_dim}")


def spec_from_args(num_rows, width, slot_width, seed, init_stddev, initial_slot_row,
                   tables: TableInits | None = None, dtype="float32") -> HostTableSpec:
  """A validated `HostTableSpec` from constructor arguments (or meta.json's): the slot row
  flattened and rounded to float32, `tables` as tuples, `dtype` by name."""
  row = tuple(float(v) for v in np.asarray(initial_slot_row, np.float32).reshape(-1))
  per_table, dims, latent = None, None, 0
  if tables is not None:
    slot_rows = np.asarray(tables.slot_rows, np.float32).reshape(len(tables.starts), -1)
    per_table = (tuple(int(x) for x in tables.starts),
                 tuple(float(x) for x in tables.stddevs),
                 tuple(tuple(float(v) for v in r) for r in slot_rows))
    if tables.dims is not None:
      dims, latent = tuple(int(d) for d in tables.dims), int(tables.latent_dim)
  return HostTableSpec(int(num_rows), int(width), int(slot_width), int(seed), float(init_stddev),
                       row, per_table, dtype if isinstance(dtype, str) else row_dtype.dtype_name(dtype),
                       dims, latent)


def spec_from_meta(meta: dict) -> HostTableSpec:
  """The spec a host table's meta.json records (a table checkpoint's manifest records the
  same keys).

  Raises:
    KeyError, TypeError, ValueError: a missing or bad field.
  """
  return spec_from_args(meta["num_rows"], meta["width"], meta["slot_width"], meta["seed"],
                        meta["init_stddev"], meta["initial_slot_row"],
                        host_table_files.meta_tables(meta), meta.get("dtype", "float32"))


def row_stores(spec: HostTableSpec, values, slots):
  """The table's stored `values` / `slots` as `PackedRows` (flat buffers of a packed table)
  or `DenseRows`."""
  if not spec.packed:
    return packed_rows.DenseRows(values), packed_rows.DenseRows(slots)
  value_layout, slot_layout = spec.packing()
  inits = spec.table_inits()
  assert inits is not None
  values = packed_rows.PackedRows(value_layout, values,
                                  np.zeros((value_layout.starts.size, spec.width)))
  slots = (packed_rows.DenseRows(slots) if slot_layout is None
           else packed_rows.PackedRows(slot_layout, slots, inits.slot_rows))
  return values, slots


def array_shapes(spec: HostTableSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Shapes of the stored values and slots: `[V, E]`, `[V, S]`, or flat when packed."""
  values: tuple[int, ...] = (spec.num_rows, spec.width)
  slots: tuple[int, ...] = (spec.num_rows, spec.slot_width)
  if spec.packed:
    value_layout, slot_layout = spec.packing()
    values = (value_layout.size,)
    slots = slots if slot_layout is None else (slot_layout.size,)
  return values, slots
