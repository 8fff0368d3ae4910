"""Row-sharded device table: the whole table's rows partitioned over the 'data' devices.

The replicated device table keeps all `V` rows on every device, so the table that fits is
one device's memory. The row-sharded table gives each of the `D` devices `C = ceil(V/D)`
rows: `D x C` rows in all, D times one device's capacity (issue #24, item 3). It is a
row-sharded MixCache whose slots never change: row `r` lives at the cache's slot `r`
(`sharded_cache.SlotLayout`, round robin: device `r % D`, local row `r // D`), so a
table's hot rows (ids ranked by frequency) spread evenly over the devices. The arrays
are `values [D*C, E]` and `opt_slots [D*C, S]` in that physical order, split on their
leading axis; the `D*C - V` padding rows are zeros and never indexed. Row optimizer
slots travel with their rows.

A step runs the row-sharded cache's per-device step (`train.step.make_train_step(
row_axis='data')` inside `jax.shard_map`) without a swap: the host lays the batch's
unique rows out in per-owner blocks (`block_batch`, `sharded_cache.block_by_owner` on
the owner buckets), each device gathers its own block, one `all_gather` assembles the
`[D*Ud, E]` rows, one `psum_scatter` returns each owner its rows' gradient. Per device
and step (ring): `2 (D-1) Ud E 4` bytes, against `2 (D-1)/D Ucap E 4` for the replicated
table's all-reduced `[Ucap, E]` row gradient (`exchange_bytes`).

Checkpoints hold the physical arrays and their layout (`num_shards`); `relayout` moves
rows between layouts (another device count, or the replicated `[V, E]`) on the host.
"""

from __future__ import annotations

import jax
import numpy as np

from sfjax.core.types import DeviceBatch
from sfjax.embedding import device_table, initializers, row_dtype, row_optimizers, sharded_cache

AXIS = sharded_cache.AXIS


def table_layout(num_rows: int, num_shards: int) -> sharded_cache.SlotLayout:
  """The layout of a `num_rows`-row table over `num_shards` devices: ceil(V/D) rows each.

  Raises:
    ValueError: a count below 1, or more rows than int32 device indices address.
  """
  if num_rows < 1 or num_shards < 1:
    raise ValueError(f"row-sharded table: rows ({num_rows}) and devices ({num_shards}) "
                     "must be >= 1")
  per = -(-num_rows // num_shards)
  if per * num_shards >= 2**31:
    raise ValueError(f"row-sharded table of {per * num_shards} rows does not fit int32 device "
                     "indices; use the cache backend")
  return sharded_cache.SlotLayout(num_shards, per)


def to_physical(rows: np.ndarray, layout: sharded_cache.SlotLayout) -> np.ndarray:
  """Logical rows `[N, ...]` (N <= D*C, row r = table row r) -> physical `[D*C, ...]`;
  the rows past N are zeros."""
  rows = np.asarray(rows)
  if rows.shape[0] > layout.num_slots:
    raise ValueError(f"{rows.shape[0]} rows do not fit a layout of {layout.num_slots}")
  out = np.zeros((layout.num_slots, *rows.shape[1:]), rows.dtype)
  out[layout.physical(np.arange(rows.shape[0]))] = rows
  return out


def to_logical(rows: np.ndarray, layout: sharded_cache.SlotLayout, num_rows: int | None = None) -> np.ndarray:
  """Physical rows `[D*C, ...]` -> logical `[num_rows, ...]` (default all D*C, the padding
  rows last)."""
  rows = np.asarray(rows)
  if rows.shape[0] != layout.num_slots:
    raise ValueError(f"{rows.shape[0]} rows are not a layout of {layout.num_slots} "
                     f"({layout.num_shards} x {layout.rows_per_shard})")
  n = layout.num_slots if num_rows is None else num_rows
  return rows[layout.physical(np.arange(n))]


def relayout(rows: np.ndarray, saved: sharded_cache.SlotLayout, target: sharded_cache.SlotLayout) -> np.ndarray:
  """Rows of one layout in another (another device count; `SlotLayout(1, V)` is the
  replicated table's). Rows past the smaller layout's size must be padding (zeros)."""
  logical = to_logical(rows, saved)
  keep = min(logical.shape[0], target.num_slots)
  if np.any(logical[keep:]):
    raise ValueError(f"a table of {saved.num_slots} rows has nonzero rows past the "
                     f"{target.num_slots} rows of the target layout")
  return to_physical(logical[:keep], target)


def init_row_sharded_table(num_rows: int, width: int, row_opt: row_optimizers.RowOptimizer, *,
               seed: int, stddev: float, layout: sharded_cache.SlotLayout, sharding,
               tables: initializers.TableInits | None = None,
               dtype=np.float32) -> device_table.TableState:
  """The row-sharded table initialised exactly like `device_table.init_table` (the same
  rows of `dtype`, in the physical order of `layout`), placed with `sharding` (split on
  'data')."""
  values, opt_slots = device_table.init_table_host(num_rows, width, row_opt, seed=seed,
                                                   stddev=stddev, tables=tables, dtype=dtype)
  values = row_dtype.to_stored_host(values)  # bfloat16: its uint16 bits
  return device_table.TableState(jax.device_put(to_physical(values, layout), sharding),
                                 jax.device_put(to_physical(opt_slots, layout), sharding))


def block_batch(batch: DeviceBatch, num_unique: int, layout: sharded_cache.SlotLayout,
                buckets: tuple[int, ...]) -> DeviceBatch:
  """A VSI batch (`vsi.prepare_batch`: rows = table rows, padding V) with its unique rows
  in per-owner blocks of local rows (`sharded_cache.block_by_owner`).

  Args:
    batch: the VSI batch; `rows[:num_unique]` are its real rows, `vids == num_unique`
      marks padding ids (bags, sequences).
    num_unique: U, its unique rows.
    layout: the table's layout.
    buckets: per-owner block lengths (`cache.owner_buckets`).

  Returns:
    The batch with rows [D * Ud] (block d: device d's local rows, padding C), vids into
    them and row_tables (if any) blocked alike.
  """
  slots = layout.physical(np.asarray(batch.rows[:num_unique]))
  has_padding = bool(np.any(np.asarray(batch.vids) == num_unique))
  rows, vids = sharded_cache.block_by_owner(slots, np.asarray(batch.vids), layout, buckets,
                                            has_padding=has_padding)
  row_tables = batch.row_tables
  if row_tables is not None:
    row_tables = sharded_cache.blocked_like(slots, np.asarray(row_tables[:num_unique]), layout,
                                            rows.shape[0] // layout.num_shards)
  return batch._replace(rows=rows, vids=vids, row_tables=row_tables)


def gather_blocks(values: jax.Array, rows: jax.Array, mesh) -> jax.Array:
  """The `[D*Ud, E]` rows of per-owner blocks `rows [D*Ud]` from a row-sharded
  `values [D*C, E]` (each device gathers its block, one `all_gather`), replicated, float32."""

  def local(block, own_rows):
    own = device_table.gather_values(block, own_rows)
    return jax.lax.all_gather(own, AXIS, tiled=True)

  spec = jax.sharding.PartitionSpec(AXIS)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec),
                       out_specs=jax.sharding.PartitionSpec(), check_vma=False)(values, rows)


def exchange_bytes(unique_rows: int, row_bytes: int, num_devices: int, sharding: str) -> int:
  """Row-gradient bytes each device sends per step (ring collectives).

  Args:
    unique_rows: U, the step's (padded) unique rows of the table.
    row_bytes: bytes of one row's values (E x 4 for float32).
    num_devices: D.
    sharding: 'replicated' (the `[U, E]` row gradient all-reduced: 2 (D-1)/D U row_bytes)
      or 'row' (all_gather + psum_scatter of ceil(U/D)-row owner blocks:
      2 (D-1) ceil(U/D) row_bytes).
  """
  if sharding not in ("replicated", "row"):
    raise ValueError(f"unknown sharding {sharding!r}: expected 'replicated' or 'row'")
  if num_devices <= 1:
    return 0
  if sharding == "replicated":
    return int(2 * (num_devices - 1) * unique_rows * row_bytes // num_devices)
  return int(2 * (num_devices - 1) * -(-unique_rows // num_devices) * row_bytes)
