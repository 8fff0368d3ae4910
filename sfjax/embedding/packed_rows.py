"""Rows of a concatenated table stored at each table's own width (issue #22).

A table of embedding dim d below the model's D is read through its rows' first d latent
columns (and any columns after the D latent ones, e.g. a first-order weight): columns
`[d, D)` start at 0 and stay 0 (`initializers.TableInits.dims`), and their per-element
optimizer slots stay at the table's initial slot values. `PackedRows` keeps a logical
`[V, W]` array (host-table values or slots) with only each table's KEPT columns stored:
table t's rows `[starts[t], starts[t+1])` as a `[rows_t, width_t]` block of one flat
buffer (a numpy array or a memory map), so a table of dim 4 in a model of dim 64 stores
5 of 65 columns. Reads fill the other columns with the table's constant row (`fill`);
writes check that those columns still hold it, so no value is ever dropped silently (a
-0.0 there equals the constant 0.0 and reads back as 0.0).

`column_ranges` gives the kept columns of a table of dim d; `PackedLayout` the blocks'
geometry (`PackedLayout.size` elements in all); `DenseRows` is a plain `[V, W]` array
behind the same interface (every column stored), so a host table reads and writes either
alike. `pack_sorted` / `unpack_sorted` store the rows of a sorted set of ids at their
tables' own widths, row after row (a table checkpoint's chunk and delta files,
`sfjax.checkpoint.table_format.RowCodec`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sfjax.embedding import host_rows

Ranges = tuple[tuple[int, int], ...]  # kept columns [lo, hi) of a logical row, ascending


def column_ranges(dim: int, latent_dim: int, width: int, slot_groups: int = 0) -> Ranges:
  """The kept columns of a table of embedding dim `dim` (0: all) in rows of `width`.

  Args:
    dim: the table's dim d (0, or >= `latent_dim`: every column is kept).
    latent_dim: D, the model's latent columns (the first D of a value row).
    width: E, columns of a value row.
    slot_groups: 0 for value rows; k >= 1 for optimizer slots of k * E columns, one value
      row's layout per group (adagrad: 1; adam, ftrl: 2); their kept columns are the
      value row's, group by group.

  Returns:
    ascending `(lo, hi)` column ranges; `[(0, columns)]` when every column is kept.
  """
  if not 0 < dim < latent_dim:
    return ((0, width * max(1, slot_groups)),)
  value = [(0, dim)] + ([(latent_dim, width)] if width > latent_dim else [])
  ranges: list[tuple[int, int]] = []
  for g in range(max(1, slot_groups)):
    for lo, hi in value:
      lo, hi = lo + g * width, hi + g * width
      if ranges and ranges[-1][1] == lo:
        ranges[-1] = (ranges[-1][0], hi)
      else:
        ranges.append((lo, hi))
  return tuple(ranges)


def slot_groups(slot_width: int, width: int) -> int:
  """k when optimizer slots are per-element, `k * width` columns (adagrad 1; adam, ftrl 2),
  whose columns then pack like the value row's; 0 otherwise (none, or a row-wise
  accumulator: every table keeps them all)."""
  return slot_width // width if slot_width and not slot_width % width else 0


class PackedLayout(NamedTuple):
  """Where each table's rows live in the flat buffer.

  Attributes:
    starts: [T] int64 first logical row of each table (ascending, from 0).
    num_rows: V, logical rows.
    columns: W, logical columns.
    ranges: [T] each table's kept column ranges (`column_ranges`).
    offsets: [T] int64 each table's first element in the buffer.
  """

  starts: np.ndarray
  num_rows: int
  columns: int
  ranges: tuple[Ranges, ...]
  offsets: np.ndarray

  @property
  def widths(self) -> np.ndarray:
    """[T] int64 kept columns per table."""
    return np.asarray([sum(hi - lo for lo, hi in r) for r in self.ranges], np.int64)

  @property
  def rows(self) -> np.ndarray:
    """[T] int64 rows per table."""
    return np.diff(np.append(self.starts, self.num_rows))

  @property
  def size(self) -> int:
    """Elements of the flat buffer."""
    return int((self.rows * self.widths).sum())


def packed_layout(starts, num_rows: int, columns: int, ranges: tuple[Ranges, ...]
                  ) -> PackedLayout:
  """The `PackedLayout` of tables starting at `starts` with kept column `ranges`.

  Raises:
    ValueError: starts not ascending from 0 inside `[0, num_rows)`, or a range outside
      `[0, columns)`.
  """
  starts = np.asarray(starts, np.int64).reshape(-1)
  if (not starts.size or starts[0] != 0 or (np.diff(starts) < 0).any()
      or starts[-1] >= max(int(num_rows), 1)):
    raise ValueError(f"packed rows: table starts must ascend from 0 below {num_rows}, "
                     f"got {starts.tolist()}")
  if len(ranges) != starts.size:
    raise ValueError(f"packed rows: {len(ranges)} column ranges for {starts.size} tables")
  for t, rs in enumerate(ranges):
    if any(not 0 <= lo < hi <= columns for lo, hi in rs):
      raise ValueError(f"packed rows: table {t}'s columns {rs} are outside [0, {columns})")
  rows = np.diff(np.append(starts, int(num_rows)))
  widths = np.asarray([sum(hi - lo for lo, hi in r) for r in ranges], np.int64)
  offsets = np.concatenate([[0], np.cumsum(rows * widths)[:-1]]).astype(np.int64)
  return PackedLayout(starts, int(num_rows), int(columns), tuple(ranges), offsets)


def _dropped(columns: int, ranges: Ranges) -> np.ndarray:
  """bool [columns]: the columns outside `ranges` (a table's unkept ones)."""
  dropped = np.ones(columns, bool)
  for lo, hi in ranges:
    dropped[lo:hi] = False
  return dropped


def _kept(rows: np.ndarray, ranges: Ranges) -> np.ndarray:
  """[N, kept] the columns `ranges` of `rows` [N, W], in order (`rows` itself when they are
  every column)."""
  if len(ranges) == 1 and ranges[0] == (0, rows.shape[1]):
    return rows
  return np.concatenate([rows[:, lo:hi] for lo, hi in ranges], axis=1)


def _spread(out: np.ndarray, kept: np.ndarray, ranges: Ranges) -> None:
  """Writes `kept` [N, kept] into the columns `ranges` of `out` [N, W] (`_kept`'s inverse)."""
  p = 0
  for lo, hi in ranges:
    out[:, lo:hi] = kept[:, p:p + hi - lo]
    p += hi - lo


class PackedRows:
  """A logical `[V, W]` array whose tables store only their kept columns.

  Consecutive tables that keep the same columns and share a constant row are one block of
  the buffer (`runs`): a layout whose tables all have one dim reads and writes with one
  `np.take` and one scatter, as a dense array would.

  Args:
    layout: the blocks' geometry.
    buffer: [layout.size] the flat storage (zeros, a memory map, ...); viewed, not copied.
    fill: [T, W] each table's constant row: the value of every column it does not keep.
  """

  def __init__(self, layout: PackedLayout, buffer: np.ndarray, fill: np.ndarray):
    if buffer.ndim != 1 or buffer.size != layout.size:
      raise ValueError(f"packed rows: the buffer must be 1-D of {layout.size} elements, got "
                       f"shape {buffer.shape}")
    fill = np.asarray(fill)
    if fill.shape != (layout.starts.size, layout.columns):
      raise ValueError(f"packed rows: fill must be [{layout.starts.size}, {layout.columns}], "
                       f"got {fill.shape}")
    self.layout, self.buffer = layout, buffer
    self.dtype = buffer.dtype
    self.fill = fill.astype(buffer.dtype)
    # Runs of tables [first, last] keeping the same columns with the same constant row.
    firsts = [0] + [t for t in range(1, layout.starts.size)
                    if layout.ranges[t] != layout.ranges[t - 1]
                    or not np.array_equal(self.fill[t], self.fill[t - 1])]
    self.runs = np.asarray(firsts, np.int64)
    self._run_starts = layout.starts[self.runs]  # first logical row of each run
    ends = list(layout.offsets[self.runs[1:]]) + [layout.size]
    self._blocks = []
    for r, t in enumerate(firsts):
      width = int(layout.widths[t])
      self._blocks.append(buffer[layout.offsets[t]:ends[r]].reshape(-1, width))
    # per run: bool [W], the columns it does not keep
    self._dropped = [_dropped(layout.columns, layout.ranges[t]) for t in firsts]

  @property
  def nbytes(self) -> int:
    """Bytes stored (the buffer's)."""
    return int(self.buffer.nbytes)

  def _by_run(self, ids: np.ndarray):
    """(run, positions in `ids`, rows local to the run) for each run `ids` [N] touches."""
    if self.runs.size == 1:
      yield 0, slice(None), ids
      return
    runs = np.searchsorted(self._run_starts, ids, side="right") - 1
    order = np.argsort(runs, kind="stable")
    bounds = np.searchsorted(runs[order], np.arange(self.runs.size + 1))
    for r in range(self.runs.size):
      lo, hi = int(bounds[r]), int(bounds[r + 1])
      if lo < hi:
        at = order[lo:hi]
        yield r, at, ids[at] - self._run_starts[r]

  def take(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Rows `ids` [N] (int64 in [0, V)) as [N, W] (into `out` when given)."""
    if out is None:
      out = np.empty((ids.shape[0], self.layout.columns), self.dtype)
    for r, at, local in self._by_run(ids):
      rows = np.take(self._blocks[r], local, axis=0)
      ranges = self.layout.ranges[int(self.runs[r])]
      whole = isinstance(at, slice)
      block = out if whole else np.empty((rows.shape[0], self.layout.columns), self.dtype)
      block[:, self._dropped[r]] = self.fill[int(self.runs[r])][self._dropped[r]]
      _spread(block, rows, ranges)
      if not whole:
        out[at] = block
    return out

  def check(self, ids: np.ndarray, rows: np.ndarray, where: str, name: str) -> None:
    """Raises ValueError naming the first row of `rows` [N, W] (for `ids`) whose unkept
    column differs from its table's constant (it would be lost)."""
    if self.runs.size == 1:
      if not self._dropped[0].any():
        return
      bad = (rows != self.fill[0]) & self._dropped[0]
    else:
      run = np.searchsorted(self._run_starts, ids, side="right") - 1
      bad = (rows != self.fill[self.runs[run]]) & np.asarray(self._dropped)[run]
    if not bad.any():
      return
    row, col = (int(x) for x in np.argwhere(bad)[0])
    table = int(np.searchsorted(self.layout.starts, ids[row], side="right") - 1)
    raise ValueError(
        f"{where}: {name}[{row}, {col}] (row id {int(ids[row])}, table {table}) is "
        f"{rows[row, col]}, but that table stores {int(self.layout.widths[table])} of "
        f"{self.layout.columns} columns and column {col} must stay {self.fill[table][col]} "
        f"(a column past the table's dim)")

  def put(self, ids: np.ndarray, rows: np.ndarray) -> None:
    """Writes rows `rows` [N, W] at `ids` [N] (distinct; `check` them first)."""
    for r, at, local in self._by_run(ids):
      host_rows.put_rows(self._blocks[r], local,
                         _kept(rows[at], self.layout.ranges[int(self.runs[r])]))

  def read(self, lo: int, hi: int) -> np.ndarray:
    """Rows `[lo, hi)` as a fresh [hi - lo, W] array."""
    return self.take(np.arange(lo, hi, dtype=np.int64))


class DenseRows:
  """A `[V, W]` array behind `PackedRows`' interface: every column stored, nothing to check.

  Args:
    buffer: the `[V, W]` storage (zeros, a memory map, ...); used, not copied.
  """

  def __init__(self, buffer: np.ndarray):
    self.buffer, self.dtype = buffer, buffer.dtype

  @property
  def nbytes(self) -> int:
    """Bytes stored (the buffer's)."""
    return int(self.buffer.nbytes)

  def take(self, ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Rows `ids` [N] as [N, W] (np.take: ~4x faster than fancy indexing on [V, E] tables)."""
    return np.take(self.buffer, ids, axis=0, out=out)

  def check(self, ids: np.ndarray, rows: np.ndarray, where: str, name: str) -> None:
    """Nothing: every column is stored."""
    del ids, rows, where, name

  def put(self, ids: np.ndarray, rows: np.ndarray) -> None:
    """Writes rows `rows` [N, W] at `ids` [N] (distinct), one record per row."""
    host_rows.put_rows(self.buffer, ids, rows)

  def read(self, lo: int, hi: int) -> np.ndarray:
    """Rows `[lo, hi)` as a fresh [hi - lo, W] array."""
    return np.array(self.buffer[lo:hi])


def _sorted_ids(layout: PackedLayout, ids, where: str) -> np.ndarray:
  """`ids` as int64, checked strictly ascending inside `[0, V)` (ValueError naming `where`)."""
  ids = np.asarray(ids, np.int64).reshape(-1)
  if ids.size and (ids[0] < 0 or ids[-1] >= layout.num_rows or np.any(np.diff(ids) <= 0)):
    raise ValueError(f"{where}: row ids must ascend strictly inside [0, {layout.num_rows})")
  return ids


def _bounds(layout: PackedLayout, ids: np.ndarray) -> np.ndarray:
  """[T + 1]: table t's rows are `ids[bounds[t]:bounds[t + 1]]` of the ascending `ids`."""
  return np.searchsorted(ids, np.append(layout.starts, layout.num_rows))


def _segments(layout: PackedLayout, ids: np.ndarray):
  """(table, lo, hi) for each table with rows in the ascending `ids`: `ids[lo:hi]`."""
  bounds = _bounds(layout, ids)
  for t in range(layout.starts.size):
    lo, hi = int(bounds[t]), int(bounds[t + 1])
    if lo < hi:
      yield t, lo, hi


def packed_size(layout: PackedLayout, ids: np.ndarray) -> int:
  """Elements `pack_sorted` stores for the ascending row ids `ids` [N]."""
  return int((np.diff(_bounds(layout, ids)) * layout.widths).sum())


def pack_sorted(layout: PackedLayout, fill: np.ndarray, ids: np.ndarray, rows: np.ndarray,
                where: str) -> np.ndarray:
  """The kept columns of rows `rows` [N, W] at the strictly ascending ids `ids` [N], row
  after row, as one flat array of `packed_size(layout, ids)` elements (a checkpoint's
  rows at each table's own width; `unpack_sorted` reverses it).

  Raises:
    ValueError: naming `where`, the row id, its table and the column, when an unkept
      column differs from its table's constant `fill` [T, W] (it would be lost).
  """
  ids = _sorted_ids(layout, ids, where)
  parts = []
  for t, lo, hi in _segments(layout, ids):
    block, ranges = rows[lo:hi], layout.ranges[t]
    bad = (block != fill[t]) & _dropped(layout.columns, ranges)
    if bad.any():
      row, col = (int(x) for x in np.argwhere(bad)[0])
      raise ValueError(f"{where}: row id {int(ids[lo + row])} (table {t}) holds "
                       f"{block[row, col]} in column {col}, past the table's "
                       f"{int(layout.widths[t])} stored columns (must be {fill[t][col]})")
    parts.append(_kept(block, ranges).reshape(-1))
  return np.concatenate(parts) if parts else np.zeros((0,), rows.dtype)


def unpack_sorted(layout: PackedLayout, fill: np.ndarray, ids: np.ndarray, flat: np.ndarray,
                  where: str) -> np.ndarray:
  """Rows [N, W] of the ascending ids `ids` [N] from `pack_sorted`'s `flat` array: the
  kept columns from it, the others each table's constant `fill` [T, W].

  Raises:
    ValueError: naming `where`, when `flat` does not hold exactly those rows' kept columns.
  """
  ids = _sorted_ids(layout, ids, where)
  expected = packed_size(layout, ids)
  if flat.ndim != 1 or flat.size != expected:
    raise ValueError(f"{where}: holds {flat.size} values of shape {flat.shape}, the {ids.size} "
                     f"rows' tables store {expected}")
  out = np.empty((ids.size, layout.columns), flat.dtype)
  p = 0
  for t, lo, hi in _segments(layout, ids):
    width = int(layout.widths[t])
    out[lo:hi] = fill[t]
    _spread(out[lo:hi], flat[p:p + (hi - lo) * width].reshape(hi - lo, width), layout.ranges[t])
    p += (hi - lo) * width
  return out
