"""The device embedding backend: the whole table on the accelerators (the reference).

  replicated  every device holds the whole table `values[V, E]` + `opt_slots[V, S]`;
              the `[U, E]` row gradient is all-reduced inside the jitted step.
  row         the table's rows are partitioned over the devices (`embedding.sharding=row`,
              `sfjax.embedding.row_sharded_table`): device d holds rows r % D == d, so the
              devices hold D x the rows of one; each step exchanges only the batch's unique
              rows, in per-owner blocks (`all_gather` + `psum_scatter`, the row-sharded
              cache's step without its swap).

Rows are stored as `embedding.dtype` (float32, or half-width bfloat16 / float16:
`sfjax.embedding.row_dtype`); the step and the eval read them upcast to float32.

Host work per step is VSI only (plus the per-owner blocking when row-sharded). The
`RunStep` every backend returns is defined here; `sfjax.train.backends` holds the
`Backend` protocol, the cache backend and the registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import PartitionSpec as P

from sfjax.core import background, names, xla_cpu_dots
from sfjax.core.types import DeviceBatch
from sfjax.data import types
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import (
  device_table,
  row_dtype,
  row_optimizers,
  row_sharded_table,
  sharded_cache,
  vsi,
)
from sfjax.parallel import distributed
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import step as step_lib
from sfjax.train.state import TrainState

# (state, inputs from `train_inputs`) -> (state, metrics, number of unique ids of the batch)
StepFn = Callable[[TrainState, Any], tuple[TrainState, dict[str, jax.Array], int]]
# `make_train_step` with graphdef, optimizers and l2 bound: (**kw) -> train step.
BuildStep = Callable[..., step_lib.TrainStep]
# embedding.sharding values of the device backend.
TABLE_SHARDINGS = ("replicated", "row")


@dataclasses.dataclass(frozen=True)
class RunStep:
  """A backend's compiled step: `run_step(state, inputs from train_inputs) -> (state,
  metrics, number of unique ids of the batch)`.

  Attributes:
    jitted: the `jax.jit` object it calls (for no-recompile checks and lowering).
    run: the step itself.
  """

  jitted: Any
  run: StepFn

  def __call__(self, state: TrainState, inputs: Any
               ) -> tuple[TrainState, dict[str, jax.Array], int]:
    return self.run(state, inputs)


def step_compiler_options(train_cfg, mesh) -> dict[str, str]:
  """The XLA options the train step is compiled with on `mesh`'s devices
  (`train.xla_cpu_dots`: Eigen or YNNPACK dots on CPU; `sfjax.core.xla_cpu_dots`)."""
  return xla_cpu_dots.compiler_options(xla_cpu_dots.dots_choice(train_cfg),
                                       mesh.devices.flat[0].platform)


def host_priority(train_cfg) -> int:
  """The `background` priority of the host threads that prepare batches (both backends):
  `background.IDLE` with `train.loader_idle`, else `train.loader_nice` (0: unchanged)."""
  if train_cfg.get("loader_idle", False):
    return background.IDLE
  return int(train_cfg.get("loader_nice", 0))


def _row_step(build_step: BuildStep, mesh) -> Callable:
  """The per-device step of a row-sharded table, mapped over 'data' (no swap: every row
  is resident). State: table split on 'data', the rest replicated; batch: all on 'data'."""
  on = P(sharded_cache.AXIS)
  state_spec = TrainState._make((P(), P(), P(), on))
  return jax.shard_map(build_step(row_axis=sharded_cache.AXIS), mesh=mesh,
                       in_specs=(state_spec, on), out_specs=(state_spec, P()), check_vma=False)


class DeviceBackend:
  """The whole table on device, replicated or row-sharded; the reference every other
  backend must reproduce.

  Attributes (besides the `Backend` protocol's):
    layout: the row-sharded table's layout (`SlotLayout(D, C)`; `SlotLayout(1, V)` when
      replicated): `capacity_rows` = D x C rows in all, C per device.
  """

  name = "device"
  host_table = None  # the TrainState's table is the table of record

  def __init__(self, config, spec: types.DatasetSpec, width: int, graphdef: nnx.GraphDef,
               build_step: BuildStep, row_opt: row_optimizers.RowOptimizer, mesh):
    self.spec, self.width, self.num_rows = spec, width, spec.total_rows
    self.sharding_name = names.lookup({k: k for k in TABLE_SHARDINGS},
                                      config.embedding.get("sharding", "replicated"),
                                      "embedding.sharding", "table sharding")
    row = self.sharding_name == "row"
    self.layout = row_sharded_table.table_layout(self.num_rows, mesh.size if row else 1)
    self.capacity_rows = self.layout.num_slots if row else self.num_rows
    self.capacity = config.embedding.unique_capacity or vsi.unique_capacity(
        config.train.batch_size, spec.num_columns, spec.has_padding)
    self._table_starts = (spec.layout.table_offsets
                          if row_opt.tables and spec.layout is not None else None)
    self.batch_sharding = mesh_lib.batch_shardings(mesh, row, row_tables=bool(row_opt.tables))
    stddev = config.embedding.init_stddev
    self.dtype = row_dtype.row_dtype(config.embedding.get("dtype", "float32"))
    tables = device_table.table_inits(spec.layout, width, row_opt, stddev,
                                      config.model.embed_dim)
    table_sharding = mesh_lib.rows_on_devices(mesh) if row else mesh_lib.replicated(mesh)
    self._table_sharding = device_table.TableState._make((table_sharding, table_sharding))
    if row:
      self.initial_table = row_sharded_table.init_row_sharded_table(
          self.num_rows, width, row_opt, seed=config.seed, stddev=stddev, layout=self.layout,
          sharding=table_sharding, tables=tables, dtype=self.dtype)
      self._train_step = _row_step(build_step, mesh)
      self._buckets = cache_lib.owner_buckets(self.capacity, mesh.size)
      self._eval_step = jax.jit(lambda params, values, db: step_lib.forward_logits(
          graphdef, params, row_sharded_table.gather_blocks(values, db.rows, mesh), db))
      logging.info("embedding.sharding=row: table capacity %d rows per device x %d devices = "
                   "%d rows (%d used)", self.layout.rows_per_shard, self.layout.num_shards,
                   self.capacity_rows, self.num_rows)
    else:
      self.initial_table = device_table.init_table(
          self.num_rows, width, row_opt, seed=config.seed, stddev=stddev, sharding=table_sharding,
          tables=tables, dtype=self.dtype)
      self._train_step = build_step()
      self._eval_step = jax.jit(lambda params, values, db: step_lib.forward_logits(
          graphdef, params, device_table.gather_values(values, db.rows), db))
    self._prefetch = max(1, config.train.prefetch)
    self._loader_nice = host_priority(config.train)
    self.compiler_options = step_compiler_options(config.train, mesh)

  @property
  def rows_per_device(self) -> int:
    """Table rows each device holds (C; V when replicated)."""
    return self.layout.rows_per_shard

  def make_step(self, state_sharding) -> RunStep:
    """The jitted donated step; returns (state, metrics, number of unique ids)."""
    state_sharding = state_sharding._replace(table=self._table_sharding)
    jitted = step_lib.jit_train_step(self._train_step, state_sharding, self.batch_sharding,
                                     self.compiler_options)

    def run_step(state, inputs):
      db, n = inputs
      state, metrics = jitted(state, db)
      return state, metrics, n

    return RunStep(jitted, run_step)

  def _blocked(self, db: DeviceBatch, n: int, capacity: int) -> DeviceBatch:
    """Row-sharded: the batch's rows in per-owner blocks; replicated: as is."""
    if self.sharding_name != "row":
      return db
    buckets = (self._buckets if capacity == self.capacity
               else cache_lib.owner_buckets(capacity, self.layout.num_shards))
    return row_sharded_table.block_batch(db, n, self.layout, buckets)

  def train_inputs(self, batches: Iterable[types.Batch]):
    """Background VSI (+ per-owner blocks) + device_put of the training batches."""
    offsets, column_rows = self.spec.column_offsets, self.spec.column_rows

    def prep(b):
      # VSI over the global batch (the same on every process); each process puts only
      # its own examples (`distributed.put_global`).
      db, n = vsi.prepare_batch(b, offsets, self.capacity, self.num_rows, column_rows,
                                self._table_starts)
      return distributed.put_global(self._blocked(db, n, self.capacity), self.batch_sharding), n

    return background.map_in_background(prep, batches, maxsize=self._prefetch, name="sfjax-data",
                                        nice=self._loader_nice)

  def prepare_eval(self, batch: types.Batch) -> DeviceBatch:
    """VSI of an eval batch: rows of the device table (row-sharded: per-owner blocks)."""
    capacity = vsi.unique_capacity(batch.size, self.spec.num_columns, self.spec.has_padding)
    db, n = vsi.prepare_batch(batch, self.spec.column_offsets, capacity, self.num_rows,
                              self.spec.column_rows)
    return self._blocked(db, n, capacity)

  def eval_logits(self, state, prepared) -> jax.Array:
    """Logits [B] of a prepared eval batch (several processes: each scores its own
    examples, `distributed.process_rows`, and gets back a global array of all logits)."""
    if jax.process_count() > 1:  # (an eval batch has no row_tables)
      prepared = distributed.put_global(prepared, self.batch_sharding._replace(row_tables=None))
    return self._eval_step(state.params, state.table.values, prepared)

  def table_rows(self, state: TrainState) -> tuple[np.ndarray, np.ndarray]:
    """The table's rows in row order, as numpy: (values [V, E], opt_slots [V, S]) (one
    process: every shard is addressable)."""
    values, slots = (np.asarray(x) for x in state.table)
    values = row_dtype.from_storage(values, self.dtype)  # bfloat16: stored as its bits
    if self.sharding_name == "row":
      values, slots = (row_sharded_table.to_logical(x, self.layout, self.num_rows)
                       for x in (values, slots))
    return values, slots

  def sync(self, state) -> None:
    """Nothing to do: the device table is the source of truth."""

  def stats(self) -> dict[str, Any]:
    """No cache counters for the device backend."""
    return {}

  def close(self) -> None:
    """Nothing to release."""
