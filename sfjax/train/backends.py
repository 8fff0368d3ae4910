"""Embedding backends of the trainer: where the rows live and how a step reaches them.

  device  the whole table `values[V, E]` + `opt_slots[V, S]` on the accelerator (the
          reference); host work per step is VSI only.
  cache   MixCache: the table lives on the host (RAM or mmap, lazily initialised), a
          `C`-row device cache holds the working rows, a threaded pipeline plans slots,
          gathers fills and writes evicted rows back (`sfjax.embedding.pipeline`).

Both expose the same small interface to `loop.py`: `initial_table`, `train_inputs`,
`run_step`, `prepare_eval`/`eval_logits`, `sync`, `stats`, `close`.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.data import types
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import cache_planner
from sfjax.embedding import device_table
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import pipeline as pipeline_lib
from sfjax.embedding import row_optimizers
from sfjax.embedding import vsi
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import config_check
from sfjax.train import prefetch
from sfjax.train import state as state_lib
from sfjax.train import step as step_lib


def _eval_from_values(graphdef):
  return jax.jit(lambda params, values, batch: step_lib.forward_logits(graphdef, params, values, batch))


class DeviceBackend:
  """The whole table on device; the reference every other backend must reproduce."""

  name = "device"

  def __init__(self, config, spec: types.DatasetSpec, width: int, graphdef, train_step,
               row_opt: row_optimizers.RowOptimizer, mesh):
    self.spec, self.width, self.num_rows = spec, width, spec.total_rows
    self.capacity = config.embedding.unique_capacity or config.train.batch_size * spec.num_fields
    self._rep = mesh_lib.replicated(mesh)
    self.batch_sharding = mesh_lib.batch_shardings(mesh)
    self.initial_table = device_table.init_table(
        self.num_rows, width, row_opt, seed=config.seed, stddev=config.embedding.init_stddev,
        sharding=self._rep)
    self._train_step = train_step
    self._jitted = None
    self._eval_step = step_lib.make_eval_step(graphdef)
    self._prefetch = max(1, config.train.prefetch)

  def jit(self, state_sharding) -> None:
    """Compiles lazily with the state's sharding (called once by the loop)."""
    self._jitted = step_lib.jit_train_step(self._train_step, state_sharding, self.batch_sharding)

  def train_inputs(self, batches: Iterable[types.Batch]) -> Iterator[Any]:
    """Background VSI + device_put of the training batches."""
    offsets = self.spec.field_offsets

    def prep(b):
      db, n = state_lib.prepare_batch(b, offsets, self.capacity, self.num_rows)
      return jax.device_put(db, self.batch_sharding), n

    return prefetch.map_in_background(prep, batches, maxsize=self._prefetch, name="sfjax-data")

  def run_step(self, state, inputs):
    """Dispatches one step; returns (state, metrics, number of unique ids)."""
    db, n = inputs
    state, metrics = self._jitted(state, db)
    return state, metrics, n

  def prepare_eval(self, batch: types.Batch):
    """Host side of an eval batch (runs on a background thread)."""
    capacity = batch.size * self.spec.num_fields
    return state_lib.prepare_batch(batch, self.spec.field_offsets, capacity, self.num_rows)[0]

  def eval_logits(self, state, prepared) -> jax.Array:
    """Logits [B] of a prepared eval batch."""
    return self._eval_step(state.params, state.table, prepared)

  def sync(self, state) -> None:
    """Nothing to do: the device table is the source of truth."""

  def stats(self) -> dict[str, float]:
    """No cache counters for the device backend."""
    return {}

  def close(self) -> None:
    """Nothing to release."""


class CacheBackend:
  """MixCache: host-resident table + device cache + overlapped host pipeline."""

  name = "cache"

  def __init__(self, config, spec: types.DatasetSpec, width: int, graphdef, train_step,
               row_opt: row_optimizers.RowOptimizer, mesh):
    e = config.embedding
    self.spec, self.width, self.num_rows = spec, width, spec.total_rows
    self.capacity = e.unique_capacity or config.train.batch_size * spec.num_fields
    self.num_slots = cache_rows(e.cache_rows, spec.total_rows)
    needed = e.lookahead * self.capacity
    if self.num_slots < needed:
      raise config_check.ConfigError(
          f"config field embedding.cache_rows: a cache of {self.num_slots} rows is too small for "
          f"lookahead {e.lookahead} x unique capacity {self.capacity}; the minimum capacity is "
          f"{needed} rows (or lower embedding.lookahead / embedding.unique_capacity)")
    slot_width = row_opt.slot_width(width)
    kw = dict(seed=config.seed, init_stddev=e.init_stddev,
              initial_slot_row=row_opt.initial_slot_row(width))
    if e.host_storage == "mmap":
      if not e.host_path:
        raise config_check.ConfigError(
            "config field embedding.host_path: required when embedding.host_storage=mmap")
      self.host_table = host_table_lib.HostTable.create_mmap(
          e.host_path, self.num_rows, width, slot_width, **kw)
    else:
      self.host_table = host_table_lib.HostTable.create_ram(self.num_rows, width, slot_width, **kw)
    self.planner = cache_planner.CachePlanner(self.num_slots, self.capacity, policy=e.cache_policy,
                                              lookahead=e.lookahead)
    self._rep = mesh_lib.replicated(mesh)
    self.batch_sharding = mesh_lib.batch_shardings(mesh)
    self._swap_sharding = jax.tree.map(lambda _: self._rep, cache_lib.CacheSwap(0, 0, 0, 0))
    self.initial_table = cache_lib.init_cache(self.num_slots, width, slot_width, self._rep)
    self._cache_step = cache_lib.make_cache_train_step(train_step)
    self._jitted = None
    self._eval_step = _eval_from_values(graphdef)
    self._pipeline: pipeline_lib.CachePipeline | None = None
    self._loader_depth = max(1, config.train.prefetch)

  def jit(self, state_sharding) -> None:
    """Compiles the cache step (state donated) with the state's sharding."""
    self._jitted = jax.jit(self._cache_step, donate_argnums=0,
                           in_shardings=(state_sharding, self.batch_sharding, self._swap_sharding),
                           out_shardings=(state_sharding, None, None))

  def train_inputs(self, batches: Iterable[types.Batch]) -> pipeline_lib.CachePipeline:
    """Starts the Data-Loader / Host-Manager / write-back threads over `batches`."""
    if self._pipeline is not None:
      raise RuntimeError("the cache backend runs one training pipeline at a time")
    self._pipeline = pipeline_lib.CachePipeline(
        batches, field_offsets=self.spec.field_offsets, host_table=self.host_table,
        planner=self.planner, put_batch=lambda db: jax.device_put(db, self.batch_sharding),
        put_swap=lambda sw: jax.device_put(sw, self._swap_sharding),
        loader_depth=self._loader_depth)
    return self._pipeline

  def run_step(self, state, inputs: pipeline_lib.StepInputs):
    """Dispatches the cache step and queues its evicted rows for write-back."""
    state, metrics, evicted = self._jitted(state, inputs.batch, inputs.swap)
    self._pipeline.submit(inputs, evicted)
    return state, metrics, inputs.plan.num_unique

  def prepare_eval(self, batch: types.Batch):
    """VSI + host-table gather of an eval batch (after `sync`, the host table is current)."""
    ids = vsi.global_row_ids(batch.ids, self.spec.field_offsets)
    virt = vsi.dedup_ids(ids, batch.size * self.spec.num_fields, pad_id=-1)
    values, _ = self.host_table.gather(virt.uniq[:virt.num_unique])
    padded = np.zeros((virt.uniq.shape[0], self.width), np.float32)
    padded[:virt.num_unique] = values
    return padded, state_lib.DeviceBatch(None, virt.vids, batch.dense, batch.labels, batch.mask)

  def eval_logits(self, state, prepared) -> jax.Array:
    """Logits [B] of a prepared eval batch."""
    values, db = prepared
    return self._eval_step(state.params, jnp.asarray(values), db)

  def sync(self, state) -> None:
    """Flushes every cached row to the host table (the cache keeps its rows)."""
    if self._pipeline is not None:
      self._pipeline.flush(state.table)
    else:
      self.host_table.flush()

  def stats(self) -> dict[str, float]:
    """Cumulative cache/pipeline counters (`cache_hit_rate`, bytes per example, stage times)."""
    if self._pipeline is None:
      return {}
    return dict(self._pipeline.stats.as_dict(), last_step=self._pipeline.last_step)

  def close(self) -> None:
    """Stops the pipeline threads."""
    if self._pipeline is not None:
      self._pipeline.close()


def cache_rows(setting: float, total_rows: int) -> int:
  """`embedding.cache_rows`: a row count (>= 1) or a fraction of the table (0 < x < 1)."""
  if 0 < setting < 1:
    return max(1, int(round(setting * total_rows)))
  if setting >= 1 and float(setting).is_integer():
    return int(setting)
  raise config_check.ConfigError(
      f"config field embedding.cache_rows: expected a row count >= 1 or a fraction in (0, 1), "
      f"got {setting!r}")


def make_backend(config, spec, width, graphdef, train_step, row_opt, mesh):
  """The backend named by `config.embedding.backend`."""
  cls = {"device": DeviceBackend, "cache": CacheBackend}[config.embedding.backend]
  return cls(config, spec, width, graphdef, train_step, row_opt, mesh)
