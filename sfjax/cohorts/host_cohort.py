"""A cohort of W trials through one host table (`CTRTask.embedding_backend='cache'`).

Issue #26 item 2. Trials of a cohort read the same batches, so they touch the same
rows at the same steps. One MixCache (DESIGN.md §2) serves all of them: the host
table's row `r` holds the W trials' rows `r` side by side (`values [V, W*E]`,
`opt_slots [V, W*S]`), and one VSI dedup, one cache plan, one gather, one
host-to-device transfer and one write-back per step move every lane's rows. The
cache machinery is width-agnostic (`sfjax.embedding.pipeline.CachePipeline`, its
planner, `cache.swap_rows`): only the step knows about lanes. It gathers the
batch's `[U, W*E]` cache rows, gives lane w the columns `[w*E, (w+1)*E)` as a
`U`-row table of its own, runs the trial's own step on it (`program.trial_step`,
vmapped over lanes: each lane its hyperparameters, dense state and non-finite
guard) and scatters the lanes' rows back into the cache.

Initial rows: lane w's row `r` is `init_rows(seed_w, 0, [r], E, init_stddev_w)`, the
trainer's host-table rule with the trial's seed and `embedding.init_stddev` (or the row's
table's own, `table_overrides`), written
into the host table the first time a batch names the row (`FirstTouch`); a cohort
of W trials therefore equals W one-lane cohorts (each a cache-backend run of its
trial), and a one-lane run equals the device-table trial program started from
those rows. Dense parameters are drawn from the seed as `init_trial_state` draws them.

Covered: fresh trials over `[0, end)`, one architecture per call (one row optimizer,
one `embed_dim`), float32 rows. Not covered: resuming a trial (promotions, PBT:
a trial's rows live in the shared table), padded shape buckets and mixed row
optimizers, per-lane step ranges, a ('trial',) mesh, half-width rows.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sfjax import models
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_call, lane_optimizers
from sfjax.cohorts import program as trial_program
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.cohort_call import CohortOutput
from sfjax.cohorts.table_choices import table_dims, table_overrides
from sfjax.cohorts.task import TrialData
from sfjax.data import types
from sfjax.data.types import DatasetSpec
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import cache_planner, device_table, row_optimizers, vsi
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import pipeline as pipeline_lib
from sfjax.embedding.initializers import init_rows
from sfjax.train import backends


class HostCohortRun(NamedTuple):
  """A host-table cohort call.

  Attributes:
    output: the W trials' CohortOutput (states hold 0-row tables: the rows are in
      `host_table`).
    host_table: the shared table after the run (`[V, W*E]` values, `[V, W*S]` slots).
    stats: the cache pipeline's counters (`CachePipeline.stats.as_dict`): `h2d_bytes`,
      `d2h_bytes` (rows moved, W lanes each), `put_bytes` (everything device_put:
      batches and swaps), hits, misses, steps.
  """

  output: CohortOutput
  host_table: host_table_lib.HostTable
  stats: dict[str, Any]


def lane_rows(seeds, stddevs, ids: np.ndarray, width: int, slot_row: np.ndarray,
              spec: DatasetSpec | None = None, dims: Sequence[Mapping[str, Any]] | None = None,
              latent_dim: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Initial rows of global `ids [N]` for W lanes side by side.

  Returns:
    values [N, W*E] float32 (lane w: `init_rows(seeds[w], 0, ids, E, stddevs[w])`; with a
    `spec` whose tables set their own `init_stddev`, those tables' rows take it,
    `table_overrides.row_stddevs`; with `dims` [W] (each lane's dim keys, `latent_dim` the
    model's D), 0 in the columns past a row's table dim, `table_dims.row_live_columns`)
    and slots [N, W*S] float32 (`slot_row [S]` in every lane; `[T, S]` with a `spec` whose
    tables name their own row optimizer: each row its table's, `table_overrides.row_slot_rows`).
  """
  ids = np.asarray(ids, np.int64)
  lane_stddevs = np.asarray(stddevs, np.float64)  # [W]
  if spec is not None and table_overrides.own_stddevs(spec) is not None:  # [W, N]
    lane_stddevs = table_overrides.row_stddevs(spec, lane_stddevs[:, None], ids, xp=np)
  lanes = [init_rows(int(seed), 0, ids, width, stddev)
           for seed, stddev in zip(seeds, lane_stddevs, strict=True)]
  if dims is not None:
    assert spec is not None  # dims name the tables of a layout
    for lane, lane_dims in zip(lanes, dims, strict=True):
      lane[~table_dims.row_live_columns(spec, lane_dims, latent_dim, width, ids, xp=np)] = 0.0
  values = np.concatenate(lanes, axis=1)
  slot_row = np.asarray(slot_row, np.float32)
  if slot_row.ndim == 2:
    assert spec is not None  # per-table slot rows name the tables of a layout
    slots = np.tile(table_overrides.row_slot_rows(spec, slot_row, ids, xp=np), (1, len(seeds)))
  else:
    slots = np.tile(slot_row.reshape(1, -1), (ids.size, len(seeds)))
  return values, slots


class FirstTouch:
  """Writes lane-initial rows into a host table the first time an id is named.

  A row is written before any gather reads it (the pipeline's loader names a batch's
  ids before its plan gathers them; eval names its ids before reading), and only
  rows never named before are written, so no cached or evicted row is overwritten.
  The host table's own lazy initialiser draws one seed and stddev for a whole row, not
  one per lane, hence this writer and its own `[V]` flags (calloc'd: a byte per row
  touched).
  """

  def __init__(self, table: host_table_lib.HostTable, seeds, stddevs, width: int,
               slot_row: np.ndarray, spec: DatasetSpec | None = None,
               dims: Sequence[Mapping[str, Any]] | None = None, latent_dim: int = 0):
    """`spec`: the data set, when its tables may set their own `init_stddev`; `dims`,
    `latent_dim`: each lane's table dims (`lane_rows`)."""
    self.table, self.width, self.spec = table, width, spec
    self._dims, self._latent = dims, latent_dim
    self._seeds, self._stddevs, self._slot_row = list(seeds), list(stddevs), slot_row
    self._seen = np.zeros((table.num_rows,), np.bool_)  # calloc'd: free until touched

  def ensure(self, ids: np.ndarray) -> None:
    """Initialises the never-named rows among global `ids` (any shape; -1 / >= V skipped)."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    ids = ids[(ids >= 0) & (ids < self.table.num_rows)]
    fresh = np.unique(ids[~self._seen[ids]])
    if fresh.size:
      values, slots = lane_rows(self._seeds, self._stddevs, fresh, self.width, self._slot_row,
                                self.spec, self._dims, self._latent)
      self.table.scatter(fresh, values, slots)
      self._seen[fresh] = True

  def named(self, batches: Iterable[types.Batch], spec: DatasetSpec) -> Iterator[types.Batch]:
    """`batches`, each after its rows were ensured."""
    for batch in batches:
      self.ensure(vsi.global_row_ids(batch.ids, spec.column_offsets, spec.total_rows,
                                     column_rows=spec.column_rows,
                                     allow_padding=batch.weights is not None))
      yield batch


def _lane_major(rows: jax.Array, lanes: int) -> jax.Array:
  """[U, W*K] -> [W, U, K]."""
  return rows.reshape(rows.shape[0], lanes, -1).transpose(1, 0, 2)


def _row_major(rows: jax.Array) -> jax.Array:
  """[W, U, K] -> [U, W*K]."""
  return rows.transpose(1, 0, 2).reshape(rows.shape[1], -1)


@functools.lru_cache(maxsize=32)
def cohort_cache_step(arch: ArchSpec, spec: DatasetSpec, lanes: int,
                      compiler_options: tuple[tuple[str, str], ...] = ()):
  """The jitted step of W lanes over one cache (states and cache donated), compiled with
  XLA's `compiler_options` ((name, value) pairs: `CTRTask.compiler_options`).

  Returns:
    `step(states [W], alive [W], cache, hparams [W], batch, swap) -> (states, alive, cache,
    losses [W], evicted)`: the swap (victims out, fills in), then each lane's own step
    on its `[U, E]` columns of the batch's cache rows, written back into the cache.
  """
  graphdef = trial_program.program_graphdef(arch, spec)

  def step(states, alive, cache, hparams, batch, swap):
    cache, evicted = cache_lib.swap_rows(cache, swap)
    uniq = device_table.gather_rows(cache, batch.rows)  # [U, W*E], [U, W*S]
    count = batch.rows.shape[0]
    # Lane tables hold the U rows in batch order; padding entries (slot C) stay padding.
    local = jnp.where(batch.rows < cache.values.shape[0], jnp.arange(count, dtype=jnp.int32),
                      count)
    lane_batch = batch._replace(rows=local)
    tables = device_table.TableState(_lane_major(uniq.values, lanes),
                                     _lane_major(uniq.opt_slots, lanes))

    def lane(hp, state, ok, table):
      train_step = trial_program.trial_step(arch, spec, graphdef, hp).train_step
      empty = state.table
      state, metrics = train_step(state._replace(table=table), lane_batch, ok)
      return state._replace(table=empty), state.table, metrics

    states, tables, metrics = jax.vmap(lane)(hparams, states, alive, tables)
    cache = device_table.scatter_rows(cache, batch.rows, device_table.TableState(
        _row_major(tables.values), _row_major(tables.opt_slots)))
    return states, metrics["applied"], cache, metrics["loss"], evicted

  return jax.jit(step, donate_argnums=(0, 2), compiler_options=dict(compiler_options))


@functools.lru_cache(maxsize=32)
def _lane_inits(arch: ArchSpec, spec: DatasetSpec):
  """Jitted `(hparams [W], seeds [W]) -> states [W]` with 0-row tables (the dense part of
  `init_trial_state`, drawn from each seed)."""
  def init(hparams, seed):
    return trial_program.init_trial_state(arch, spec, hparams, jax.random.key(seed), 0)
  return jax.jit(jax.vmap(init))


@functools.lru_cache(maxsize=32)
def _lane_eval(arch: ArchSpec, spec: DatasetSpec):
  """Jitted `(states [W], values [W, N, E], hparams [W], eval_batches) -> logits [W, Te, Be]`."""
  graphdef = trial_program.program_graphdef(arch, spec)

  def logits(state, values, hp, eval_batches):
    _, repool, live = trial_program.trial_step(arch, spec, graphdef, hp)
    table = device_table.TableState(values, jnp.zeros((values.shape[0], 0), jnp.float32))
    return trial_program.stacked_eval_logits(graphdef, state._replace(table=table),
                                             eval_batches, repool, live)

  return jax.jit(jax.vmap(logits, in_axes=(0, 0, 0, None)))


def _slot_rows(arch: ArchSpec, spec: DatasetSpec) -> np.ndarray:
  """The initial optimizer slots of a row of `arch`'s row optimizer: `[S]`, or `[T, S]`
  (each table's) when `spec`'s tables name their own row optimizer."""
  hparams = arch_lib.resolve_hparams({})
  if table_overrides.own_optimizers(spec) is not None:
    _, row_opt = trial_program.trial_optimizers(arch, hparams, spec)
    return row_optimizers.initial_slot_rows(row_opt.tables, arch.embedding_width)
  _, row_opt = trial_program.trial_optimizers(arch, hparams)
  return np.asarray(row_opt.initial_slot_row(arch.embedding_width), np.float32)


def make_planner(data: TrialData) -> cache_planner.CachePlanner:
  """The cache planner of `data`'s task: `task.cache_rows` slots (0: auto, as the trainer's
  `embedding.cache_rows`), `task.cache_lookahead` steps ahead.

  Raises:
    ValueError: a cache smaller than lookahead x unique capacity (names `task.cache_rows`).
  """
  task, rows = data.task, data.full_rows
  needed = task.cache_lookahead * data.capacity
  slots = backends.cache_rows(task.cache_rows, rows, needed)
  if slots < needed:
    raise ValueError(f"task.cache_rows: a cache of {slots} rows is too small for lookahead "
                     f"{task.cache_lookahead} x unique capacity {data.capacity}; set it >= "
                     f"{needed} (or 0 to choose it)")
  return cache_planner.CachePlanner(slots, data.capacity, lookahead=task.cache_lookahead,
                                    num_rows=rows)


def _lane_dims(arch: ArchSpec, spec: DatasetSpec, stacked: Mapping[str, Any], lanes: int
               ) -> tuple[list[dict[str, float]] | None, int]:
  """(each lane's dim keys, the model's latent dim) when the lanes read some table through
  fewer columns (`FirstTouch` zeroes the others), else (None, 0)."""
  if spec.layout is None or not table_dims.uses_dims(spec, stacked):
    return None, 0
  keys = [k for k in stacked if table_dims.dimmed_table(k) is not None]
  latent = models.latent_dim(arch.model_name, arch.embed_dim)
  assert latent is not None  # the lanes' program refuses dims of a model without latent columns
  return [{k: float(np.asarray(stacked[k]).reshape(-1)[w]) for k in keys}
          for w in range(lanes)], latent


def run_host_cohort(data: TrialData, arch: ArchSpec, hparams: Mapping[str, Any], seeds,
                    end: int) -> HostCohortRun:
  """Trains W fresh trials of `arch` over steps `[0, end)` through one host table.

  Args:
    data: the task's TrialData (its data set, unique capacity and eval set; its task's
      `cache_rows` / `cache_lookahead`).
    arch: the trials' architecture (one row optimizer).
    hparams: `arch.DYNAMIC_KEYS` -> [W] values (missing keys take defaults).
    seeds: [W] init seeds (dense parameters and each lane's initial rows).
    end: train steps.

  Returns:
    HostCohortRun.
  """
  if lane_optimizers.LANE_KEY in hparams or len(lane_optimizers.lane_names(
      arch.embedding_optimizer)) > 1:
    raise ValueError("task.embedding_backend='cache': a cohort takes one row optimizer "
                     "(mixed-optimizer programs are not supported)")
  seeds = np.asarray(seeds, np.int32).reshape(-1)
  lanes, spec, width = seeds.shape[0], data.spec, arch.embedding_width
  stacked = cohort_call.stacked_hparams(hparams, lanes)
  slot_row = _slot_rows(arch, spec)  # [S] or [T, S]
  slot_width = slot_row.shape[-1]
  t0 = time.perf_counter()
  planner = make_planner(data)
  table = host_table_lib.HostTable.create_ram(
      data.full_rows, lanes * width, lanes * slot_width, seed=0, init_stddev=0.0,
      initial_slot_row=np.tile(slot_row if slot_row.ndim == 1 else slot_row[0],
                               lanes))  # unread: the first touch writes each row's
  dims, latent = _lane_dims(arch, spec, stacked, lanes)
  touch = FirstTouch(table, seeds, stacked["embedding.init_stddev"], width, slot_row, spec,
                     dims, latent)
  batches = itertools.islice(data.dataset.train_batches(data.task.batch_size, data.task.seed),
                             int(end))
  states = _lane_inits(arch, spec)(stacked, seeds)
  alive = jnp.ones((lanes,), jnp.bool_)
  cache = cache_lib.init_cache(planner.num_slots, lanes * width, lanes * slot_width)
  step = cohort_cache_step(arch, spec, lanes, data.task.compiler_options)
  losses, applied = [], []
  with pipeline_lib.CachePipeline(
      touch.named(batches, spec), field_offsets=spec.column_offsets,
      column_rows=spec.column_rows, host_table=table, planner=planner,
      put_batch=jax.device_put, put_swap=jax.device_put) as pipeline:
    for _ in range(int(end)):
      inputs = next(pipeline)
      states, alive, cache, loss, evicted = step(states, alive, cache, stacked, inputs.batch,
                                                 inputs.swap)
      pipeline.submit(inputs, evicted)
      losses.append(loss)
      applied.append(alive)
    pipeline.flush(cache)
    stats = pipeline.stats.as_dict()
  logits = _eval_logits(data, arch, states, stacked, table, touch)
  host_alive, steps = jax.device_get((alive, states.step))
  losses_wl = np.stack(jax.device_get(losses), axis=1) if losses else np.zeros((lanes, 0))
  applied_wl = np.stack(jax.device_get(applied), axis=1) if applied else np.zeros((lanes, 0), bool)
  auc, logloss, test_auc, test_logloss = cohort_call.cohort_eval_metrics(
      data, logits.reshape(lanes, -1), host_alive)
  output = CohortOutput(states, host_alive, steps, losses_wl, applied_wl, auc, logloss, test_auc,
                        test_logloss, time.perf_counter() - t0)
  return HostCohortRun(output, table, stats)


def _eval_logits(data: TrialData, arch: ArchSpec, states, hparams,
                 table: host_table_lib.HostTable, touch: FirstTouch) -> np.ndarray:
  """[W, Te, Be] eval logits: the eval set's rows gathered once from the host table."""
  rows = np.asarray(data.eval_batches.rows)
  ids = np.unique(rows[rows < data.full_rows]).astype(np.int64)
  touch.ensure(ids)  # rows no train step named: their initial values
  values, _ = table.gather(ids)  # [N, W*E]
  lanes = len(states.step)
  lane_values = values.reshape(ids.size, lanes, -1).transpose(1, 0, 2)  # [W, N, E]
  local = np.where(rows < data.full_rows, np.searchsorted(ids, rows), ids.size).astype(np.int32)
  batches = data.eval_batches._replace(rows=jnp.asarray(local))
  return np.asarray(_lane_eval(arch, data.spec)(states, jnp.asarray(lane_values), hparams,
                                                batches))


def call_host_cohort(data: TrialData, arch: ArchSpec, hparams: Mapping[str, Any], seeds, start,
                     end, init_states=None, dense_masks=None) -> CohortOutput:
  """`cohort_call.call_cohort`'s contract for a task with `embedding_backend='cache'`
  (`run_host_cohort`'s output).

  Raises:
    ValueError: a resumed, padded or ragged call (not supported; the message says so).
  """
  starts, ends = np.asarray(start).reshape(-1), np.asarray(end).reshape(-1)
  if init_states is not None or dense_masks is not None or (starts != 0).any():
    raise ValueError("task.embedding_backend='cache': trials cannot resume (promotions, PBT) "
                     "or run padded programs; use a single-fidelity algorithm (random, tpe, ...)")
  if (ends != ends[0]).any():
    raise ValueError("task.embedding_backend='cache': a cohort's trials share one step range")
  return run_host_cohort(data, arch, hparams, seeds, int(ends[0])).output
