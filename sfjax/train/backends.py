"""Embedding backends of the trainer: where the rows live and how a step reaches them.

  device  the whole table `values[V, E]` + `opt_slots[V, S]` on the accelerators (the
          reference; `sfjax.train.device_backend`), replicated or row-sharded
          (`embedding.sharding`); host work per step is VSI only.
  cache   MixCache: the table lives on the host (RAM or mmap, lazily initialised), a
          `C`-row device cache holds the working rows, a threaded pipeline plans slots,
          gathers fills and writes evicted rows back (`sfjax.embedding.pipeline`).
          `embedding.cache_sharding`: `replicated` (SFCTR's default: every device holds
          the same C rows) or `row` (device d owns slots [d*C, (d+1)*C): D*C rows in
          all; `sfjax.embedding.sharded_cache`).

Backends receive `build_step`, `make_train_step` with the model and optimizers bound
(keyword `row_axis` for the row-sharded cache's per-device step), and build their own step.

Both implement the `Backend` protocol the loop (`sfjax.train.runner`) talks to.
`make_step` compiles and returns the step in one call; nothing is set aside for a
later call to find.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import PartitionSpec as P

from sfjax.core import names
from sfjax.core.errors import ConfigError
from sfjax.core.types import DeviceBatch
from sfjax.data import types
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import (
  cache_planner,
  device_table,
  placement,
  row_dtype,
  row_optimizers,
  sharded_cache,
  vsi,
)
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import pipeline as pipeline_lib
from sfjax.parallel import distributed
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import process_cache
from sfjax.train import step as step_lib
from sfjax.train.device_backend import BuildStep as BuildStep
from sfjax.train.device_backend import DeviceBackend as DeviceBackend
from sfjax.train.device_backend import RunStep as RunStep
from sfjax.train.device_backend import StepFn as StepFn
from sfjax.train.device_backend import host_priority, step_compiler_options
from sfjax.train.state import TrainState

# embedding.cache_sharding values: one copy per device, or rows partitioned over the devices.
CACHE_SHARDINGS = ("replicated", "row")


class TrainInputs(Iterator[Any], Protocol):
  """A backend's per-step inputs, prepared in the background until closed."""

  def close(self) -> None:
    """Stops the background work."""


class Backend(Protocol):
  """What the training loop needs from an embedding backend.

  Attributes:
    name: the `embedding.backend` value.
    capacity: padded unique rows per train step.
    initial_table: the table the initial TrainState carries (device table or empty cache).
    host_table: the host table of record (cache backend; checkpoints save it in chunks),
      or None when the TrainState's table is the whole table (device backend).
    capacity_rows: distinct rows the device holds in all (table rows or cache capacity).
    sharding_name: how the device rows are laid out (`replicated` or `row`).
  """

  name: str
  capacity: int
  initial_table: device_table.TableState
  capacity_rows: int
  sharding_name: str

  @property
  def host_table(self) -> host_table_lib.HostTable | None:
    """Read-only here, so that a backend may declare it as None or as a HostTable."""

  def make_step(self, state_sharding: Any) -> RunStep:
    """Compiles the train step for a state of `state_sharding` and returns it.

    The cache backend replaces `state_sharding.table` by its cache's sharding (split on
    'data' when row-sharded). The `RunStep` carries the `jax.jit` object as `.jitted`.
    """

  def train_inputs(self, batches: Iterable[types.Batch]) -> TrainInputs:
    """Per-step device inputs of `batches`, prepared in the background (close() it)."""

  def prepare_eval(self, batch: types.Batch) -> Any:
    """Host side of an eval batch (runs on a background thread)."""

  def eval_logits(self, state: TrainState, prepared: Any) -> jax.Array:
    """Logits [B] of a prepared eval batch."""

  def sync(self, state: TrainState) -> None:
    """Makes the backend's table of record current (the cache flushes to the host table)."""

  def stats(self) -> dict[str, Any]:
    """Cumulative counters (empty for the device backend)."""

  def close(self) -> None:
    """Stops background work."""


def _ram_table(e, num_rows, width, slot_width, **kw) -> host_table_lib.HostTable:
  del e
  return host_table_lib.HostTable.create_ram(num_rows, width, slot_width, **kw)


def _mmap_table(e, num_rows, width, slot_width, **kw) -> host_table_lib.HostTable:
  if not e.host_path:
    raise ConfigError("config field embedding.host_path: required when embedding.host_storage=mmap")
  # Several processes: each its own table directory (`distributed.process_path`).
  return host_table_lib.HostTable.create_mmap(distributed.process_path(e.host_path), num_rows,
                                              width, slot_width, **kw)


# embedding.host_storage -> builder of the cache backend's host table.
HOST_STORAGES = {"ram": _ram_table, "mmap": _mmap_table}


class CacheBackend:
  """MixCache: host-resident table + device cache + overlapped host pipeline."""

  name = "cache"
  # False: every step exchanges the full unique capacity (benchmarks: the no-VSI volume).
  bucket_unique = True

  def __init__(self, config, spec: types.DatasetSpec, width: int, graphdef: nnx.GraphDef,
               build_step: BuildStep, row_opt: row_optimizers.RowOptimizer, mesh):
    e = config.embedding
    self.spec, self.width, self.num_rows = spec, width, spec.total_rows
    self.capacity = e.unique_capacity or vsi.unique_capacity(
        config.train.batch_size, spec.num_columns, spec.has_padding)
    self.sharding_name = names.lookup({k: k for k in CACHE_SHARDINGS}, e.cache_sharding,
                                      "embedding.cache_sharding", "cache sharding")
    row = self.sharding_name == "row"
    self._processes = jax.process_count()
    # embedding.cache_rows is per device: a row-sharded cache holds D times as many rows.
    shards = mesh.size if row else 1
    needed = e.lookahead * self.capacity
    least = -(-needed // shards)  # the smallest valid embedding.cache_rows (per device)
    self.layout = sharded_cache.SlotLayout(
        shards, cache_rows(e.cache_rows, spec.total_rows, least, "per device" if row else ""))
    self.num_slots = self.capacity_rows = self.layout.num_slots
    if self.num_slots < needed:
      held = (f"{self.num_slots} rows ({self.layout.rows_per_shard} per device x "
              f"{self.layout.num_shards} devices, row-sharded)" if row else f"{self.num_slots} rows")
      raise ConfigError(
          f"config field embedding.cache_rows: a cache of {held} is too small for "
          f"lookahead {e.lookahead} x unique capacity {self.capacity}; the minimum capacity is "
          f"{needed} rows: set embedding.cache_rows >= {least} (or 0 to choose it), or lower "
          "embedding.lookahead / embedding.unique_capacity")
    slot_width = row_opt.slot_width(width)
    dtype = row_dtype.row_dtype(e.get("dtype", "float32"))  # host table and cache rows alike
    self.host_table = HOST_STORAGES[e.host_storage](
        e, self.num_rows, width, slot_width, seed=config.seed, init_stddev=e.init_stddev,
        initial_slot_row=row_opt.initial_slot_row(width),
        tables=device_table.table_inits(spec.layout, width, row_opt, e.init_stddev,
                                        config.model.embed_dim),
        dtype=row_dtype.dtype_name(dtype))
    self._table_starts = (spec.layout.table_offsets
                          if row_opt.tables and spec.layout is not None else None)
    self.planner = cache_planner.CachePlanner(self.num_slots, self.capacity, policy=e.cache_policy,
                                              lookahead=e.lookahead, num_rows=self.num_rows)
    rep = mesh_lib.replicated(mesh)
    self.batch_sharding = mesh_lib.batch_shardings(mesh, row, row_tables=bool(row_opt.tables))
    # Row-sharded: the cache rows, each step's per-device swap buffers and row blocks on 'data'.
    # Sharding trees are built with `_make`: the state classes type their fields as arrays.
    cache_sharding = mesh_lib.rows_on_devices(mesh) if row else rep
    self._table_sharding = device_table.TableState._make((cache_sharding, cache_sharding))
    self._swap_sharding = jax.tree.map(lambda _: cache_sharding, cache_lib.CacheSwap(0, 0, 0, 0))
    self.initial_table = cache_lib.init_cache(self.num_slots, width, slot_width, cache_sharding,
                                              dtype)
    if row:  # the whole step per device, collectives written out (sharded_cache docstring)
      owner_step = step_lib.make_cache_train_step(
          build_step(row_axis=sharded_cache.AXIS), swap_rows=sharded_cache.swap_rows_local)
      on = P(sharded_cache.AXIS)
      state_spec = TrainState._make((P(), P(), P(), on))
      evicted_spec = on
      if self._processes > 1:  # fills come from every process's rows; evictions go to all
        owner_step = process_cache.route_fills_and_gather_evictions(owner_step)
        evicted_spec = P()
      self._cache_step = jax.shard_map(
          owner_step, mesh=mesh, in_specs=(state_spec, on, on),
          out_specs=(state_spec, P(), evicted_spec), check_vma=False)
    else:
      self._cache_step = step_lib.make_cache_train_step(build_step())
    self._eval_step = step_lib.make_eval_step(graphdef)
    self._evicted_sharding = None
    if self._processes > 1:  # fills (and eval rows) arrive as per-process blocks, summed
      blocks = mesh_lib.rows_on_devices(mesh)
      slots = blocks if row else rep  # row-sharded: each device's [Fd] swap slots
      if not row:  # (row-sharded: summed per device inside the step, `process_cache`)
        self._cache_step = _summing_fill_blocks(self._cache_step)
      self._swap_sharding = cache_lib.CacheSwap(slots, blocks, blocks, slots)
      self._evicted_sharding = device_table.TableState._make((rep, rep))
      self._eval_step = jax.jit(lambda params, blocks_, db: step_lib.eval_logits(
          graphdef, params, blocks_.sum(0), db))
      self._blocks, self._rep = blocks, rep
    self._pipeline: pipeline_lib.CachePipeline | None = None
    self._loader_depth = max(1, config.train.prefetch)
    self._host_nice = host_priority(config.train)
    self.compiler_options = step_compiler_options(config.train, mesh)
    keep = e.get("keep_upcoming", -1)
    self._keep_upcoming = None if keep < 0 else keep  # None: lookahead - 1

  def make_step(self, state_sharding) -> RunStep:
    """The jitted donated cache step; its evicted rows are queued for write-back."""
    state_sharding = state_sharding._replace(table=self._table_sharding)
    jitted = jax.jit(self._cache_step, donate_argnums=0,
                     in_shardings=(state_sharding, self.batch_sharding, self._swap_sharding),
                     out_shardings=(state_sharding, None, self._evicted_sharding),
                     compiler_options=self.compiler_options)

    def run_step(state, inputs: pipeline_lib.StepInputs):
      state, metrics, evicted = jitted(state, inputs.batch, inputs.swap)
      if self._pipeline is None:
        raise RuntimeError("the cache step ran without the pipeline of train_inputs")
      self._pipeline.submit(inputs, evicted)
      return state, metrics, inputs.plan.num_unique

    return RunStep(jitted, run_step)

  def train_inputs(self, batches: Iterable[types.Batch]) -> pipeline_lib.CachePipeline:
    """Starts the Data-Loader / Host-Manager / write-back threads over `batches`."""
    if self._pipeline is not None:
      raise RuntimeError("the cache backend runs one training pipeline at a time")
    row = self.sharding_name == "row"
    self._pipeline = pipeline_lib.CachePipeline(
        batches, field_offsets=self.spec.column_offsets, column_rows=self.spec.column_rows,
        host_table=self.host_table,
        planner=self.planner,
        put_batch=lambda db: distributed.put_global(db, self.batch_sharding),
        put_swap=self._put_swap, owns=self._owns,
        loader_depth=self._loader_depth, layout=self.layout,
        sharded_swap=row, owner_blocks=row, bucket_unique=self.bucket_unique,
        table_starts=self._table_starts, nice=self._host_nice,
        keep_upcoming=self._keep_upcoming)
    return self._pipeline

  def prepare_eval(self, batch: types.Batch) -> tuple[np.ndarray, DeviceBatch]:
    """VSI + host-table gather of an eval batch (after `sync`, the host table is current).

    Returns `(values [Ucap, E], batch)` with `batch.rows = 0..Ucap-1` indexing
    `values` (rows past the unique count are zeros and unused).
    """
    ids = vsi.global_row_ids(batch.ids, self.spec.column_offsets,
                             column_rows=self.spec.column_rows,
                             allow_padding=batch.weights is not None)
    virt = vsi.dedup_ids(ids, vsi.unique_capacity(batch.size, self.spec.num_columns,
                                                  self.spec.has_padding), pad_id=-1)
    uniq = virt.uniq[:virt.num_unique]
    mine = self._owns(uniq) if self._owns is not None else np.ones(uniq.shape, bool)
    padded = np.zeros((virt.uniq.shape[0], self.width), np.float32)
    padded[:virt.num_unique][mine] = self.host_table.gather(uniq[mine])[0]  # own rows only
    rows = np.arange(virt.uniq.shape[0], dtype=np.int32)
    return padded, DeviceBatch(rows, virt.vids, batch.dense, batch.labels, batch.mask,
                               batch.weights)

  def eval_logits(self, state, prepared) -> jax.Array:
    """Logits [B] of a prepared eval batch."""
    values, db = prepared
    if self._processes > 1:  # every process's own rows, summed on device
      db = distributed.put_global(db, self.batch_sharding._replace(row_tables=None))
      return self._eval_step(state.params, distributed.put_process_blocks(values, self._blocks),
                             db)
    return self._eval_step(state.params, jnp.asarray(values), db)

  @property
  def _owns(self):
    """ids -> bool: this process's shard of the host table (id % P == process index);
    None with one process."""
    if self._processes == 1:
      return None
    count, index = self._processes, jax.process_index()
    return lambda ids: np.asarray(ids) % count == index

  def _put_swap(self, swap: cache_lib.CacheSwap) -> cache_lib.CacheSwap:
    """A host swap on the devices; several processes: fill rows as per-process blocks."""
    if self._processes == 1:
      return jax.device_put(swap, self._swap_sharding)
    return cache_lib.CacheSwap(
        distributed.put_global(swap.fill_slots, self._swap_sharding.fill_slots),
        distributed.put_process_blocks(swap.fill_values, self._blocks),
        distributed.put_process_blocks(swap.fill_opt_slots, self._blocks),
        distributed.put_global(swap.evict_slots, self._swap_sharding.evict_slots))

  def sync(self, state) -> None:
    """Flushes every cached row to the host table (the cache keeps its rows)."""
    if self._pipeline is not None:
      table = state.table
      if self._processes > 1 and self.sharding_name == "row":  # each process sees all slots
        table = process_cache.replicated_copy(table, self._evicted_sharding)
      self._pipeline.flush(table)
    else:
      self.host_table.flush()

  def stats(self) -> dict[str, Any]:
    """Cumulative cache/pipeline counters (`cache_hit_rate`, bytes per example, stage times)."""
    if self._pipeline is None:
      return {}
    return dict(self._pipeline.stats.as_dict(), last_step=self._pipeline.last_step)

  def close(self) -> None:
    """Stops the pipeline threads."""
    if self._pipeline is not None:
      self._pipeline.close()


AUTO_CACHE_FRACTION = 0.05  # embedding.cache_rows = 0: this fraction of the table, or more


def cache_rows(setting: float, total_rows: int, least: int = 1, per: str = "") -> int:
  """`embedding.cache_rows`: a row count (>= 1), a fraction of the table (0 < x < 1), or 0:
  auto, `AUTO_CACHE_FRACTION` of the table raised to `least` (the smallest valid size for
  the batch: lookahead x unique capacity), with a log line saying what it chose.

  Args:
    setting: the config value.
    total_rows: the table's rows.
    least: the smallest valid value (auto never goes below it).
    per: what the count is per ('per device' for a row-sharded cache), for the log line.
  """
  if setting == 0:
    share = max(1, int(round(AUTO_CACHE_FRACTION * total_rows)))
    rows = max(share, least)
    why = (f"{AUTO_CACHE_FRACTION:.0%} of the {total_rows}-row table" if rows == share else
           f"the minimum for the batch (lookahead x unique capacity; "
           f"{AUTO_CACHE_FRACTION:.0%} of the table is {share})")
    logging.info("embedding.cache_rows=0 (auto): %d rows%s, %s", rows, f" {per}" if per else "",
                 why)
    return rows
  if 0 < setting < 1:
    return max(1, int(round(setting * total_rows)))
  if setting >= 1 and float(setting).is_integer():
    return int(setting)
  raise ConfigError(
      f"config field embedding.cache_rows: expected a row count >= 1, a fraction in (0, 1) or 0 "
      f"(auto), got {setting!r}")


def _summing_fill_blocks(cache_step):
  """The cache step taking fills as per-process blocks `[D, F, ...]` (each row nonzero in
  its owner's block only); their sum over the blocks is the step's fill."""

  def step(state, batch, swap):
    return cache_step(state, batch, swap._replace(fill_values=swap.fill_values.sum(0),
                                                  fill_opt_slots=swap.fill_opt_slots.sum(0)))

  return step


# embedding.backend -> backend class. The registry config validation derives from.
BACKENDS: dict[str, Callable[..., Backend]] = {"device": DeviceBackend, "cache": CacheBackend}


def make_backend(config, spec: types.DatasetSpec, width: int, graphdef: nnx.GraphDef,
                 build_step: BuildStep, row_opt: row_optimizers.RowOptimizer,
                 mesh) -> Backend:
  """The backend named by `config.embedding.backend` (and `sharding`), or by
  `embedding.placement` when set (`resolve_placement`).

  `build_step(**kw)` is `make_train_step` with the model, optimizers and l2 bound.
  """
  if config.embedding.get("placement", ""):
    config = resolve_placement(config, spec, width, row_opt, mesh.size)
  cls = names.lookup(BACKENDS, config.embedding.backend, "embedding.backend", "backend")
  return cls(config, spec, width, graphdef, build_step, row_opt, mesh)


# embedding.placement -> (embedding.backend, embedding.sharding); cache keeps cache_sharding.
_PLACED = {"replicated": ("device", "replicated"), "row": ("device", "row"),
           "cache": ("cache", "replicated")}


def plan_budget(plan_config, num_devices: int) -> placement.Budget:
  """`embedding.plan`'s budget; 0 bytes = the device's memory limit (as JAX reports it) or
  the host's physical memory."""
  device_bytes = int(plan_config.device_bytes)
  if device_bytes == 0:
    device_bytes = int((jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", 0))
    if not device_bytes:
      raise ConfigError("config field embedding.plan.device_bytes: required with "
                        "embedding.placement=auto (this device reports no memory limit)")
  host_bytes = int(plan_config.host_bytes) or os.sysconf("SC_PAGE_SIZE") * os.sysconf(
      "SC_PHYS_PAGES")
  return placement.Budget(num_devices, device_bytes, jax.process_count(), host_bytes,
                          float(plan_config.replicate_fraction))


def resolve_placement(config, spec: types.DatasetSpec, width: int,
                      row_opt: row_optimizers.RowOptimizer, num_devices: int):
  """`config` with `embedding.backend` / `sharding` set by `embedding.placement`: as named,
  or (`auto`) the plan's run placement, the heaviest any table got (one backend per run;
  the plan, per table, is logged). Unset (''): `config` itself."""
  e = config.embedding
  chosen = e.get("placement", "")
  if not chosen:
    return config
  names.lookup(dict.fromkeys(placement.SETTINGS), chosen, "embedding.placement", "placement")
  if chosen == "auto":
    budget = plan_budget(e.plan, num_devices)
    tables = placement.table_costs(spec.layout, spec.total_rows, spec.num_columns, width,
                                   row_opt.slot_width(width), config.model.embed_dim)
    plan = placement.plan_placement(tables, budget, config.train.batch_size,
                                    float(e.plan.unique_fraction))
    logging.info("embedding.placement=auto\n%s", plan.describe())
    chosen = plan.run_placement
  config = config.copy_and_resolve_references()
  backend, sharding = _PLACED[chosen]
  config.embedding.backend = backend
  if backend == "device":
    config.embedding.sharding = sharding
  logging.info("embedding.placement=%s: embedding.backend=%s%s", e.placement, backend,
               f", sharding={sharding}" if backend == "device" else "")
  return config
