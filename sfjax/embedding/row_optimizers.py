"""Row-wise (sparse) optimizers for embedding tables.

An optax-like factory returns a `RowOptimizer` of pure functions over the rows a
batch touched, never over the whole table:

  new_rows, new_slots = opt.update(rows, slots, grads, count)

with `rows`/`grads` [U, E] and `slots` [U, S] (S = opt.slot_width(E)). Optimizer
state lives beside each row as slot columns, so a host table, a device table and
a device cache can all store `values[V, E]` and `opt_slots[V, S]` and move both
together. Hyperparameters may be Python floats or traced scalars (vmappable).

Formulas (per element, g = gradient, t = `count`, 1-based global step):
  sgd:     w -= lr * g
  adagrad: a += g^2;  w -= lr * g / sqrt(a)              (a starts at initial_accumulator)
  rowwise_adagrad:  a_row += mean_j(g_j^2) over the row's E columns;  w -= lr * g / sqrt(a_row)
           (one accumulator per row, S = 1: FBGEMM's EXACT_ROWWISE_ADAGRAD, TorchRec's default,
           without its eps, like adagrad here; a_row starts at initial_accumulator). With
           `row_width` e: a_row += sum_j(g_j^2) / e, the mean over a row's own e columns when
           the others are padding of gradient 0 (a padded cohort lane, issue #26)
  adam:    m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2   (lazy / row-wise Adam:
           w -= lr * mhat / (sqrt(vhat) + eps)            only touched rows move;
           mhat = m / (1-b1^t), vhat = v / (1-b2^t)       bias correction uses the global step)
  ftrl:    n' = n + g^2; sigma = (sqrt(n') - sqrt(n)) / lr; z += g - sigma w   (McMahan et al. 2013,
           w = 0 if |z| <= l1 else -(z - sign(z) l1) / ((beta + sqrt(n')) / lr + l2)  FTRL-Proximal)

Per-table settings (issue #22: tables of one concatenated table, each with its own
optimizer and rate): `per_table(optimizers)` is one RowOptimizer whose update takes
`row_tables [U]` (each row's table index) and gives every row exactly its table's
update; its slots are max_t S_t columns, table t's optimizer using the first S_t.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from sfjax.core import names
from sfjax.embedding import row_dtype


class RowOptimizer(NamedTuple):
  """Pure functions of a row optimizer.

  Attributes:
    name: optimizer name.
    slot_width: E -> S, slot columns stored per row.
    initial_slot_row: E -> [S] float32 numpy; the slot values of a never-touched row.
    update: (rows [U,E], slots [U,S], grads [U,E], count int32 scalar) -> (rows, slots);
      a `per_table` optimizer also takes `row_tables [U]` int32 (keyword).
    tables: the per-table optimizers of a `per_table` optimizer (table order); () for a
      plain one, which treats every row alike.
  """

  name: str
  slot_width: Callable[[int], int]
  initial_slot_row: Callable[[int], np.ndarray]
  update: Callable[..., tuple[Any, Any]]
  tables: tuple[RowOptimizer, ...] = ()


def sgd(learning_rate) -> RowOptimizer:
  """Plain SGD on touched rows; no slots."""

  def update(rows, slots, grads, count):
    del count
    return rows - learning_rate * grads, slots

  return RowOptimizer("sgd", lambda e: 0, lambda e: np.zeros((0,), np.float32), update)


def adagrad(learning_rate, initial_accumulator: float = 0.1) -> RowOptimizer:
  """Element-wise Adagrad; the accumulator starts at `initial_accumulator` (> 0).

  An element whose accumulator is still 0 (never initialised: a padded column of a search
  program's slots, which only ever sees zero gradients) keeps its value instead of 0/0.
  """
  if not initial_accumulator > 0:
    raise ValueError(f"adagrad initial_accumulator must be > 0, got {initial_accumulator}")

  def update(rows, slots, grads, count):
    del count
    acc = slots + grads * grads
    scaled = jnp.where(acc > 0, grads * jnp.reciprocal(jnp.sqrt(acc)), 0.0)
    return rows - learning_rate * scaled, acc

  return RowOptimizer(
      "adagrad", lambda e: e, lambda e: np.full((e,), initial_accumulator, np.float32), update
  )


def rowwise_adagrad(learning_rate, initial_accumulator: float = 0.1,
                    row_width=None) -> RowOptimizer:
  """Row-wise Adagrad: one accumulator per row, fed the mean squared gradient of the row.

  Stores 1 slot column instead of E (for a 1e9-row, E=16 table: 4 GB of
  accumulators instead of 64 GB). A padding row (zero slots, zero gradient)
  comes out NaN, like adagrad's; the scatter drops it.

  `row_width`: None, the mean over the E columns; else e (a float or traced scalar):
  the squared gradients' sum over the row divided by e, i.e. the mean over the row's
  own e columns of a row padded with zero-gradient columns to E (a trial in a wider
  cohort program: its update equals the one on its own e-column rows).
  """
  if not initial_accumulator > 0:
    raise ValueError(f"rowwise_adagrad initial_accumulator must be > 0, got {initial_accumulator}")

  def update(rows, slots, grads, count):
    del count
    if row_width is None:
      acc = slots + jnp.mean(grads * grads, axis=-1, keepdims=True)  # [U, 1]
    else:
      acc = slots + jnp.sum(grads * grads, axis=-1, keepdims=True) / row_width
    return rows - learning_rate * grads * jnp.reciprocal(jnp.sqrt(acc)), acc

  def initial_slot_row(e):
    del e
    return np.full((1,), initial_accumulator, np.float32)

  return RowOptimizer("rowwise_adagrad", lambda e: 1, initial_slot_row, update)


def adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8) -> RowOptimizer:
  """Row-wise (lazy) Adam: moments of untouched rows do not decay."""

  def update(rows, slots, grads, count):
    e = rows.shape[-1]
    m, v = slots[:, :e], slots[:, e:]
    m = b1 * m + (1.0 - b1) * grads
    v = b2 * v + (1.0 - b2) * grads * grads
    t = jnp.asarray(count, jnp.float32)
    mhat = m / (1.0 - jnp.power(b1, t))
    vhat = v / (1.0 - jnp.power(b2, t))
    rows = rows - learning_rate * mhat / (jnp.sqrt(vhat) + eps)
    return rows, jnp.concatenate([m, v], axis=-1)

  return RowOptimizer("adam", lambda e: 2 * e, lambda e: np.zeros((2 * e,), np.float32), update)


def ftrl(learning_rate, l1=0.0, l2=0.0, beta=0.0, initial_accumulator: float = 0.1) -> RowOptimizer:
  """FTRL-Proximal with per-coordinate learning rates; slots are (z, n)."""
  if not initial_accumulator > 0:
    raise ValueError(f"ftrl initial_accumulator must be > 0, got {initial_accumulator}")

  def update(rows, slots, grads, count):
    del count
    e = rows.shape[-1]
    z, n = slots[:, :e], slots[:, e:]
    n_new = n + grads * grads
    sigma = (jnp.sqrt(n_new) - jnp.sqrt(n)) / learning_rate
    z = z + grads - sigma * rows
    denom = (beta + jnp.sqrt(n_new)) / learning_rate + l2
    w = jnp.where(jnp.abs(z) <= l1, 0.0, -(z - jnp.sign(z) * l1) / denom)
    return w.astype(rows.dtype), jnp.concatenate([z, n_new], axis=-1)

  def initial_slot_row(e):
    return np.concatenate([np.zeros((e,), np.float32), np.full((e,), initial_accumulator, np.float32)])

  return RowOptimizer("ftrl", lambda e: 2 * e, initial_slot_row, update)


def per_table(optimizers: tuple[RowOptimizer, ...], keys: tuple | None = None) -> RowOptimizer:
  """One optimizer over the rows of several tables, each row updated by its table's.

  Every distinct update runs on all U rows and `jnp.where` keeps, per row, the one of
  the row's table; equal `keys` (e.g. `(name, learning_rate)`) share one update. Slots
  are `max_t S_t` columns: table t's optimizer reads and writes its first `S_t`, the
  others stay as they are. A padding row (any table index) is dropped by the scatter.

  Args:
    optimizers: [T] the optimizer of each table, in table order.
    keys: [T] hashable identities of the optimizers (tables with equal keys share one
      update); None: every table its own update.

  Returns:
    RowOptimizer whose `update(rows, slots, grads, count, row_tables=[U] int32)`
    and whose `tables` are `optimizers`; `initial_slot_row` is table 0's, padded
    (`initial_slot_rows` gives every table's).
  """
  optimizers = tuple(optimizers)
  if not optimizers:
    raise ValueError("per_table needs at least one optimizer")
  keys = tuple(range(len(optimizers))) if keys is None else tuple(keys)
  if len(keys) != len(optimizers):
    raise ValueError(f"per_table: {len(keys)} keys for {len(optimizers)} optimizers")
  groups: dict[Any, list[int]] = {}
  for t, key in enumerate(keys):
    groups.setdefault(key, []).append(t)
  distinct = [(optimizers[ts[0]], np.asarray(ts, np.int32)) for ts in groups.values()]

  def slot_width(e):
    return max(opt.slot_width(e) for opt in optimizers)

  def update(rows, slots, grads, count, row_tables=None):
    if row_tables is None:
      raise ValueError("a per_table row optimizer needs row_tables (DeviceBatch.row_tables)")
    new_rows, new_slots = rows, slots
    for opt, tables in distinct:
      width = opt.slot_width(rows.shape[-1])
      moved, moved_slots = opt.update(rows, slots[:, :width], grads, count)
      mine = jnp.isin(row_tables, jnp.asarray(tables))[:, None]  # [U, 1]
      new_rows = jnp.where(mine, moved, new_rows)
      if width:
        kept = jnp.where(mine, moved_slots, new_slots[:, :width])
        new_slots = jnp.concatenate([kept, new_slots[:, width:]], axis=1)
    return new_rows, new_slots

  name = "per_table(" + ",".join(opt.name for opt in optimizers) + ")"
  return RowOptimizer(name, slot_width, lambda e: initial_slot_rows(optimizers, e)[0], update,
                      optimizers)


def with_row_dtype(opt: RowOptimizer, dtype, stochastic_rounding: bool = False) -> RowOptimizer:
  """`opt` for a table whose rows are stored as `dtype` (`sfjax.embedding.row_dtype`).

  The update runs in float32 (the step gathers rows upcast) and its rows come back
  rounded to `dtype` (nearest even, or stochastically keyed by the step `count`), so a
  non-finite or overflowing row is seen before it is stored; slots stay float32.
  float32: `opt` itself.
  """
  dtype = row_dtype.row_dtype(dtype)
  if not row_dtype.is_half(dtype):
    return opt

  def update(rows, slots, grads, count, **kw):
    new_rows, new_slots = opt.update(rows, slots, grads, count, **kw)
    return row_dtype.round_rows(new_rows, dtype, stochastic=stochastic_rounding,
                                step=count), new_slots

  return opt._replace(update=update)


def initial_slot_rows(optimizers: tuple[RowOptimizer, ...], width: int) -> np.ndarray:
  """[T, S] float32 initial slots of each table's rows (S = max slot width, zero-padded)."""
  rows = [opt.initial_slot_row(width) for opt in optimizers]
  out = np.zeros((len(rows), max(r.shape[0] for r in rows)), np.float32)
  for t, r in enumerate(rows):
    out[t, :r.shape[0]] = r
  return out


# name -> factory(learning_rate, settings) reading its own settings from an `embedding`
# config block. The registry every row-optimizer name list derives from.
ROW_OPTIMIZERS: dict[str, Callable[[Any, Any], RowOptimizer]] = {
    "sgd": lambda lr, c: sgd(lr),
    "adagrad": lambda lr, c: adagrad(lr, c.adagrad_initial_accumulator),
    "rowwise_adagrad": lambda lr, c: rowwise_adagrad(lr, c.adagrad_initial_accumulator),
    "adam": lambda lr, c: adam(lr, c.adam_b1, c.adam_b2, c.adam_eps),
    "ftrl": lambda lr, c: ftrl(lr, c.ftrl_l1, c.ftrl_l2, c.ftrl_beta, c.ftrl_initial_accumulator),
}
ROW_OPTIMIZER_NAMES: tuple[str, ...] = tuple(ROW_OPTIMIZERS)


def make(name: str, learning_rate, settings, field: str = "embedding.optimizer",
         row_width=None) -> RowOptimizer:
  """Row optimizer `name` with `learning_rate` (a float or a traced scalar).

  Args:
    name: one of `ROW_OPTIMIZER_NAMES`.
    learning_rate: the row learning rate.
    settings: the `embedding` config block (its `adagrad_*` (also read by
      rowwise_adagrad), `adam_*`, `ftrl_*` fields).
    field: the config field named in the error for an unknown `name`.
    row_width: None, or the columns a row trains (a float or a traced scalar), which
      rowwise_adagrad averages over (`rowwise_adagrad(row_width=)`); the element-wise
      optimizers do not read it.

  Raises:
    ConfigError: an unknown name (the message names `field`).
  """
  factory = names.lookup(ROW_OPTIMIZERS, name, field, "row optimizer")
  if row_width is not None and name == "rowwise_adagrad":
    return rowwise_adagrad(learning_rate, settings.adagrad_initial_accumulator,
                           row_width=row_width)
  return factory(learning_rate, settings)


def row_optimizer_from_config(cfg, tables=None, row_widths=None) -> RowOptimizer:
  """The row optimizer of an `embedding` config block (`optimizer`, `learning_rate`, ...).

  Rows stored as `cfg.dtype` (bfloat16 / float16) come out of the update rounded to it
  (`with_row_dtype`).

  Args:
    cfg: the `embedding` config block.
    tables: None, or a feature layout's `TableSpec`s: when one sets its own `optimizer`
      or `learning_rate` ("" / 0 mean the block's), or a row-wise Adagrad table has a
      row width of its own, a `per_table` optimizer over them.
    row_widths: None, or [T] the columns each table's rows train (None: all; a table of a
      smaller `dim`, `feature_layout.table_row_widths`), read by rowwise_adagrad.
  """
  settings = _table_settings(cfg, tables, row_widths)
  if settings is None:
    return _rows_of(cfg, make(cfg.optimizer, cfg.learning_rate, cfg))
  opts = tuple(make(name, lr, cfg, field=f"features.tables.{t.name}.optimizer", row_width=w)
               for (name, lr, w), t in zip(settings, tables, strict=True))
  return _rows_of(cfg, per_table(opts, keys=tuple(settings)))


def _table_settings(cfg, tables, row_widths) -> list[tuple[str, float, int | None]] | None:
  """Per table (optimizer name, learning rate, rowwise_adagrad's row width), or None when
  every table trains with the block's own optimizer (no tables, or none sets anything)."""
  if tables is None:
    return None
  widths = [None] * len(tables) if row_widths is None else list(row_widths)
  if len(widths) != len(tables):
    raise ValueError(f"{len(widths)} row widths for {len(tables)} tables")
  settings = []
  for t, w in zip(tables, widths, strict=True):
    name = t.optimizer or cfg.optimizer
    settings.append((name, t.learning_rate or cfg.learning_rate,
                     w if name == "rowwise_adagrad" else None))
  if not any(t.optimizer or t.learning_rate or s[2] is not None
             for t, s in zip(tables, settings, strict=True)):
    return None
  return settings


def _rows_of(cfg, opt: RowOptimizer) -> RowOptimizer:
  """`opt` rounding to the block's `dtype` (`stochastic_rounding`); float32 (or a block
  without the field): `opt`."""
  return with_row_dtype(opt, getattr(cfg, "dtype", "float32"),
                        bool(getattr(cfg, "stochastic_rounding", False)))
