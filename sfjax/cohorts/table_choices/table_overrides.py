"""A feature layout's per-table settings in trial programs: a table's own row optimizer,
learning rate and initializer (`data.tables = "item:optimizer=adam,learning_rate=0.05;
user:init_stddev=0.02"`, issue #22).

The trainer applies them through `row_optimizers.row_optimizer_from_config(cfg, tables)`
(one `per_table` optimizer) and `device_table.table_inits` (each table's stddev and
initial slots). A trial program does the same with its traced hyperparameters: a table
that names its own optimizer trains with it (`own_optimizers`), every trial and every lane
of a mixed cohort alike, the others with the trial's `embedding.optimizer`; a table that
sets its own rate trains at it, the others at the trial's `embedding.learning_rate`
(`own_rates`; both in `program.trial_optimizers`); a table that sets its own stddev draws
its initial rows with it, the others with the trial's `embedding.init_stddev`
(`row_stddevs`: the device program's uniform draw and the host cohort's `init_rows`).
With own optimizers the slots are as wide as the widest table's, and each row starts from
its table's initial slots (`row_slot_rows`: the program's draw, the host cohort's first
touch), as in the trainer.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from sfjax.core.feature_layout import row_tables
from sfjax.data.types import DatasetSpec


def own_optimizers(spec: DatasetSpec | None) -> tuple[str, ...] | None:
  """[T] each table's own row optimizer name (`TableSpec.optimizer`; "": the trial's
  `embedding.optimizer`), or None when no table names one."""
  if spec is None or spec.layout is None:
    return None
  own = tuple(t.optimizer or "" for t in spec.layout.tables)
  return own if any(own) else None


def own_rates(spec: DatasetSpec | None) -> tuple[float, ...] | None:
  """[T] each table's own row learning rate (`TableSpec.learning_rate`; 0: the trial's
  `embedding.learning_rate`), or None when no table sets one."""
  if spec is None or spec.layout is None:
    return None
  own = tuple(float(t.learning_rate) for t in spec.layout.tables)
  return own if any(own) else None


def own_stddevs(spec: DatasetSpec | None) -> np.ndarray | None:
  """[T] float64 each table's own initial stddev (0: the trial's; float64 as the trainer's
  `device_table.table_inits`), or None when no table sets one."""
  if spec is None or spec.layout is None:
    return None
  own = np.asarray([t.init_stddev for t in spec.layout.tables], np.float64)
  return own if own.any() else None


def row_stddevs(spec: DatasetSpec, stddev: Any, rows: Any, xp: Any = jnp,
                table_starts: Any = None) -> Any:
  """[N] the initial stddev of each row `rows [N]`: its table's own `init_stddev`, else
  `stddev` (the trial's, maybe traced); float32 under `jnp`, float64 under `np`.

  Args:
    spec: the data set (its layout's tables; raises ValueError when none sets a stddev).
    stddev: the trial's `embedding.init_stddev`.
    rows: [N] rows of the trial's table.
    xp: `jnp` (the device program; `rows` may be traced) or `np` (the host cohort).
    table_starts: [T] ascending first row of each table in the trial's table: None, the
      layout's `table_offsets` (rows are global ids); a compact task's
      (`TrialData.table_starts`).
  """
  own = own_stddevs(spec)
  if own is None:
    raise ValueError("row_stddevs: no table of the data set sets its own init_stddev")
  at = _row_tables(spec, rows, xp, table_starts)
  if xp is np:  # float64, as the trainer's host initial rows (`init_table_rows`)
    mine = own[at]
    return np.where(mine > 0, mine, np.float64(stddev))
  mine = jnp.asarray(own, jnp.float32)[at]  # traced rows: the same search, in the program
  return jnp.where(mine > 0, mine, jnp.asarray(stddev, jnp.float32))


def _row_tables(spec: DatasetSpec, rows: Any, xp: Any, table_starts: Any) -> Any:
  """[N] the table of each row `rows [N]` (numpy, or traced under `jnp`)."""
  assert spec.layout is not None  # a layout's tables set their own settings
  starts = spec.layout.table_offsets if table_starts is None else np.asarray(table_starts)
  if xp is np:
    return row_tables(starts, np.asarray(rows))
  return jnp.maximum(jnp.searchsorted(jnp.asarray(starts), rows, side="right") - 1, 0)


def row_slot_rows(spec: DatasetSpec, slot_rows: Any, rows: Any, xp: Any = jnp,
                  table_starts: Any = None) -> Any:
  """[N, S] the initial slots of each row `rows [N]`: its table's row of `slot_rows [T, S]`
  (`row_optimizers.initial_slot_rows` of a `per_table` optimizer's tables).

  Args:
    spec: the data set (its layout gives each row's table).
    slot_rows: [T, S] each table's initial slots.
    rows: [N] rows of the trial's table (traced under `jnp`).
    xp: `jnp` (the device program) or `np` (the host cohort).
    table_starts: as in `row_stddevs`.
  """
  at = _row_tables(spec, rows, xp, table_starts)
  if xp is np:
    return np.asarray(slot_rows, np.float32)[at]
  return jnp.asarray(slot_rows, jnp.float32)[at]


def compact_table_starts(spec: DatasetSpec, row_ids: np.ndarray) -> tuple[int, ...] | None:
  """The first row of each table among compact rows `row_ids [U]` (ascending global ids,
  `TrialData.row_ids`): a table's touched rows are contiguous there. None without a
  layout."""
  if spec.layout is None:
    return None
  return tuple(int(x) for x in np.searchsorted(np.asarray(row_ids), spec.layout.table_offsets))
