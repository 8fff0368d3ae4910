"""Each table's embedding dim as a traced per-trial hyperparameter (issue #22, Deliver 7).

A trial config may set `tables.<name>.dim` (an integer d, 1 <= d <= `model.embed_dim`, or
0: the model's dim) for each table `<name>` of the data set's layout: the model reads the
first d latent columns of that table's rows, as the trainer does for
`data.tables = "<name>:dim=d"`
(`feature_layout.live_columns`, applied by `models.behavior.pooling.PooledInput`).

The choice is not part of the trial's `ArchSpec`: rows stay stored `model.embed_dim`
wide (as in the trainer), so trials that differ only in their dims share one vmapped
program. The program's model is built without dims (`undimmed_spec`) and reads every id
column's rows through a per-trial `[S, E]` 0/1 mask (`live_columns`, handed to the
shared step as `make_train_step(live_columns=)`): the trainer's mask, built from traced
dims. Columns past a table's dim then read 0 and take no model gradient, exactly as in
the trainer; the L2 penalty is on the stored rows in both. rowwise_adagrad averages a
row's squared gradient over its table's own `d (+1)` columns in the trainer
(`feature_layout.table_row_widths`); the program gives it each row's width by the row's
table (`row_width_optimizer`), the table read off the batch's columns
(`with_row_tables`). A table whose key a trial does not set takes the data set's dim
(`TableSpec.dim`; 0: the model's, every column). The trainer reproduces a trial by
`data.tables` (`trainer_tables`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.core import feature_layout
from sfjax.core.errors import ConfigError
from sfjax.core.types import DeviceBatch
from sfjax.data import table_settings
from sfjax.data.types import DatasetSpec
from sfjax.embedding.row_optimizers import RowOptimizer

_KEY = re.compile(r"^tables\.([^.]+)\.dim$")


def dim_key(table: str) -> str:
  """The trial config key of table `table`'s embedding dim: `tables.<table>.dim`."""
  return f"tables.{table}.dim"


def dimmed_table(key: str) -> str | None:
  """The table a dim key names (`tables.item.dim` -> 'item'); None otherwise."""
  match = _KEY.match(str(key))
  return match.group(1) if match else None


def dim_value(key: str, value: Any) -> float:
  """`value` of dim key `key` (an integer, or an integral float) as a float; 0 is the
  model's dim (every latent column), as `TableSpec.dim`.

  Raises:
    ValueError: naming `key`, for anything but an integer >= 0.
  """
  if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number))
      or not float(value) >= 0 or float(value) != int(value)):
    raise ValueError(f"config key {key!r}: must be an integer >= 0 (0: the model's "
                     f"embedding dim), got {value!r}")
  return float(value)


def default_dims(spec: DatasetSpec) -> dict[str, float]:
  """Dim key -> the data set's own dim (`TableSpec.dim`; 0 = the model's), every table."""
  if spec.layout is None:
    return {}
  return {dim_key(t.name): float(t.dim) for t in spec.layout.tables}


def check_dim_keys(spec: DatasetSpec, keys) -> None:
  """Raises ConfigError naming the first dim key of `keys` that is not a table of `spec`."""
  tables = default_dims(spec)
  for key in keys:
    if dimmed_table(key) is not None and key not in tables:
      names = ", ".join(str(dimmed_table(k)) for k in tables) or "none"
      raise ConfigError(f"config field {key}: {dimmed_table(key)!r} is not a table of the "
                        f"data set (its tables: {names})")


def uses_dims(spec: DatasetSpec, hparams: Mapping[str, Any]) -> bool:
  """Whether a program over `spec` with `hparams` reads some table through fewer columns:
  a dim key is given, or a table of the data set has its own dim."""
  return (any(dimmed_table(k) is not None for k in hparams)
          or any(v > 0 for v in default_dims(spec).values()))


def undimmed_spec(spec: DatasetSpec) -> DatasetSpec:
  """`spec` with every table read in full (the program's model; `live_columns` masks)."""
  layout = spec.layout
  if layout is None or not any(t.dim for t in layout.tables):
    return spec
  tables = tuple(dataclasses.replace(t, dim=0) for t in layout.tables)
  return dataclasses.replace(spec, layout=dataclasses.replace(layout, tables=tables))


def table_dims(spec: DatasetSpec, dims: Mapping[str, Any], latent_dim: int,
               xp: Any = jnp) -> Any:
  """`[T]` float32 each table's dim: `dims[key]` (a traced scalar or a number), else the
  data set's; 0 (the model's) becomes `latent_dim`. `xp`: `jnp`, or `np` for numbers."""
  defaults = default_dims(spec)
  values = xp.stack([xp.asarray(dims.get(k, d), xp.float32) for k, d in defaults.items()])
  return xp.where(values > 0, values, float(latent_dim))


def row_live_columns(spec: DatasetSpec, dims: Mapping[str, Any], latent_dim: int, width: int,
                     rows: Any, table_starts: Any = None, xp: Any = jnp) -> Any:
  """`[N, width]` bool: the columns of rows `rows [N]` their table's model reads (its dim from
  `dims`, else the data set's; `feature_layout.live_mask`). A fresh row starts at 0 in the
  others, as the trainer's (`initializers.TableInits.dims`), and they stay 0.

  Args:
    spec: the data set (with a feature layout).
    dims: dim key -> dim (traced under `jnp`; numbers under `np`).
    latent_dim, width: the model's latent columns D and row width E.
    rows: [N] rows of the trial's table.
    table_starts: [T] first row of each table among the trial's rows (a compact task's);
      None: the layout's `table_offsets` (rows are global ids).
    xp: `jnp` (the device program) or `np` (the host cohort).
  """
  assert spec.layout is not None  # dims exist only in a layout
  starts = spec.layout.table_offsets if table_starts is None else np.asarray(table_starts)
  tables = xp.maximum(xp.searchsorted(xp.asarray(starts), rows, side="right") - 1, 0)
  return feature_layout.live_mask(table_dims(spec, dims, latent_dim, xp)[tables], latent_dim,
                                  width)


def column_tables(spec: DatasetSpec) -> np.ndarray:
  """`[S]` int32 the table index of each id column of `spec`'s layout."""
  assert spec.layout is not None  # dims exist only in a layout
  layout = spec.layout
  return np.asarray(layout.feature_tables, np.int32)[layout.column_features]


def traced_live_columns(spec: DatasetSpec, dims: Mapping[str, Any], latent_dim: int,
                        width: int) -> jax.Array:
  """`[S, width]` float32 1/0: the row columns the model reads through each id column,
  `feature_layout.live_columns` with each table's dim from `dims` (traced or not):
  `feature_layout.live_mask` of each column's table dim.
  """
  per_column = table_dims(spec, dims, latent_dim)[column_tables(spec)]  # [S]
  return feature_layout.live_mask(per_column, latent_dim, width).astype(jnp.float32)


def row_widths(spec: DatasetSpec, dims: Mapping[str, Any], latent_dim: int,
               width: int) -> jax.Array:
  """`[T]` float32 the columns each table's rows train: its dim plus those after the
  latent ones (`feature_layout.table_row_widths`, with the model's width for a full table)."""
  return table_dims(spec, dims, latent_dim) + float(width - latent_dim)


def with_row_tables(spec: DatasetSpec, batch: DeviceBatch) -> DeviceBatch:
  """`batch` with `row_tables [U]`: each unique row's table, read off the id columns that
  index it (a row belongs to one table; a row no column indexes, padding, gets 0)."""
  rows = batch.rows.shape[-1]
  tables = jnp.broadcast_to(jnp.asarray(column_tables(spec)), batch.vids.shape)
  row_tables = jnp.zeros((rows,), jnp.int32).at[batch.vids.reshape(-1)].max(
      tables.reshape(-1), mode="drop")
  return batch._replace(row_tables=row_tables)


def row_width_optimizer(make: Callable[[Any], RowOptimizer], widths: jax.Array) -> RowOptimizer:
  """A row optimizer that updates each row as `make(row_width)` would, `row_width` its
  table's `widths[t]` (rowwise_adagrad's mean over the row's own columns).

  `make(row_width)` builds the (lane) optimizer; the result takes `row_tables [U]` (the
  step passes `DeviceBatch.row_tables`, `with_row_tables`).
  """
  base = make(None)

  def update(rows, slots, grads, count, row_tables=None):
    if row_tables is None:
      raise ValueError("row_width_optimizer needs row_tables (DeviceBatch.row_tables)")
    return make(widths[row_tables][:, None]).update(rows, slots, grads, count)

  return RowOptimizer(base.name, base.slot_width, base.initial_slot_row, update, (base,))


def check_dims(config: Mapping[str, Any], model_name: str, latent_dim: int | None) -> None:
  """Raises ValueError naming the first dim key of a trial config that its model cannot
  read: a dim above the model's `latent_dim`, or a model without per-table dims (None)."""
  for key, value in config.items():
    if dimmed_table(key) is None:
      continue
    if latent_dim is None:
      raise ValueError(f"config key {key!r}: model {model_name!r} has no per-table embedding "
                       f"dims (its rows are not model.embed_dim latent columns)")
    if dim_value(key, value) > latent_dim:
      raise ValueError(f"config key {key!r}: {int(value)} is above the model's embedding dim "
                       f"{latent_dim} (model.embed_dim)")


def trainer_tables(config: Mapping[str, Any], base: str = "") -> str:
  """The trainer's `data.tables` of a trial config: `base` (the recipe's own settings)
  with each dim the trial sets; `base` itself when it sets none."""
  dims = {dimmed_table(k): int(dim_value(k, v)) for k, v in config.items()
          if dimmed_table(k) is not None}
  if not dims:
    return base
  settings = table_settings.parse_table_settings(base)
  for name, dim in dims.items():
    settings.setdefault(str(name), {})["dim"] = dim
  return table_settings.format_table_settings(settings)
