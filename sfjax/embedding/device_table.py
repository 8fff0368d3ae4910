"""The on-device embedding table: the reference backend that MixCache must reproduce.

State is a pytree of two arrays, `values[V, E]` and `opt_slots[V, S]`. Device
code only sees int32 row indices; the padding value `V` is out of range on
purpose: gathers fill it with zeros and scatters drop it, so padded entries of a
fixed-size unique set never read or write a real row.

Rows may be stored half-width (`embedding.dtype`, `sfjax.embedding.row_dtype`): a step
gathers them upcast to float32 (`gather_rows`), updates them in float32 and writes them
back in the table's dtype (`scatter_rows`); slots stay float32. bfloat16 rows are held
as their uint16 bits (`row_dtype.storage_dtype`: XLA:CPU has no native bfloat16 scatter).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.embedding import initializers, row_dtype, row_optimizers


class TableState(NamedTuple):
  """Embedding rows and their row-optimizer slots.

  Attributes:
    values: [V, E] float32, float16, or uint16 (the bits of bfloat16 rows; `row_dtype`).
    opt_slots: [V, S] float32.
  """

  values: jax.Array
  opt_slots: jax.Array


def init_table_host(num_rows: int, width: int, row_opt: row_optimizers.RowOptimizer, *,
                     seed: int, stddev: float, tables: initializers.TableInits | None = None,
                     dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
  """Host (numpy) initial table: `init_rows` values and the optimizer's initial slots.

  Returns:
    values [V, E] `dtype` (float32 rows rounded to nearest) and opt_slots [V, S] float32.
  """
  if tables is not None:  # each table its own stddev and initial slots
    values, opt_slots = initializers.init_table_rows(
        seed, np.arange(num_rows, dtype=np.int64), width, tables)
    return values.astype(dtype, copy=False), opt_slots
  values = initializers.init_rows(seed, 0, np.arange(num_rows, dtype=np.int64), width, stddev)
  slot_row = row_opt.initial_slot_row(width)
  opt_slots = np.broadcast_to(slot_row, (num_rows, slot_row.shape[0])).astype(np.float32)
  return values.astype(dtype, copy=False), opt_slots


def init_table(num_rows: int, width: int, row_opt: row_optimizers.RowOptimizer, *,
               seed: int, stddev: float, sharding=None,
               tables: initializers.TableInits | None = None, dtype=np.float32) -> TableState:
  """Device table initialised exactly like the lazily initialised host table.

  `tables` (None: every row alike) gives each table of a feature layout its own
  stddev and initial slots (`initializers.init_table_rows`); `dtype` is the rows' dtype.
  """
  values, opt_slots = init_table_host(num_rows, width, row_opt, seed=seed, stddev=stddev,
                                       tables=tables, dtype=dtype)
  values = row_dtype.to_stored_host(values)  # bfloat16: its uint16 bits (a view)
  # jnp.array copies: the host buffers are never aliased by the device arrays (DESIGN §7).
  if sharding is None:
    return TableState(jnp.array(values), jnp.array(opt_slots))
  return TableState(jax.device_put(values.copy(), sharding), jax.device_put(opt_slots.copy(), sharding))


def table_inits(layout, width: int, row_opt: row_optimizers.RowOptimizer,
                stddev: float, latent_dim: int | None = None) -> initializers.TableInits | None:
  """Per-table initial rows of a feature layout whose tables set their own initializer,
  optimizer or dim (`TableSpec.init_stddev`, 0 = `stddev`; the initial slots of each table's
  optimizer, `row_opt.tables`; with `latent_dim`, the model's D, each table's `dim`, whose
  unread columns start at 0); None when every row is alike (no layout, or no override).
  """
  dimmed = layout is not None and latent_dim is not None and any(
      0 < t.dim < latent_dim for t in layout.tables)
  if layout is None or not (layout.has_table_settings or dimmed):
    return None
  stddevs = np.asarray([t.init_stddev or stddev for t in layout.tables], np.float64)
  if row_opt.tables:
    slot_rows = row_optimizers.initial_slot_rows(row_opt.tables, width)
  else:
    slot_rows = np.tile(row_opt.initial_slot_row(width), (len(layout.tables), 1))
  if not dimmed:
    return initializers.TableInits(layout.table_offsets, stddevs, slot_rows.astype(np.float32))
  dims = np.asarray([t.dim for t in layout.tables], np.int64)
  assert latent_dim is not None  # `dimmed` needs it
  return initializers.TableInits(layout.table_offsets, stddevs, slot_rows.astype(np.float32),
                                 dims, int(latent_dim))


def take_stored_rows(table: TableState, rows: jax.Array) -> TableState:
  """Rows `rows [U]` int32 of the table as stored (values in the table's stored dtype: cache
  evictions travel half-width); out-of-range (padding) rows read as zeros."""
  return TableState(
      jnp.take(table.values, rows, axis=0, mode="fill", fill_value=0),
      jnp.take(table.opt_slots, rows, axis=0, mode="fill", fill_value=0),
  )


def gather_values(values: jax.Array, rows: jax.Array) -> jax.Array:
  """Rows `rows [U]` of `values [V, E]` upcast to float32 `[U, E]` (padding rows: zeros)."""
  return row_dtype.to_compute(jnp.take(values, rows, axis=0, mode="fill", fill_value=0))


def gather_rows(table: TableState, rows: jax.Array) -> TableState:
  """Rows `rows [U]` int32 of the table, values upcast to float32 (the dtype a step
  computes in; exact); out-of-range (padding) rows read as zeros."""
  taken = take_stored_rows(table, rows)
  return taken._replace(values=row_dtype.to_compute(taken.values))


def scatter_rows(table: TableState, rows: jax.Array, update: TableState) -> TableState:
  """Writes `update` ([U, E], [U, S]) into rows `rows [U]`; out-of-range rows are dropped.

  Values are cast to the table's stored dtype (round to nearest even; a row optimizer
  from `row_optimizers.with_row_dtype` has already rounded them). `rows` must be unique
  among in-range entries (VSI guarantees it).
  """
  values = row_dtype.to_stored(update.values, table.values.dtype)
  return TableState(
      table.values.at[rows].set(values, mode="drop", unique_indices=False),
      table.opt_slots.at[rows].set(update.opt_slots, mode="drop", unique_indices=False),
  )
