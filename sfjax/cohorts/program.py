"""One CTR trial as a pure, vmappable function: init -> scan of train steps -> eval.

purejaxrl-style (STYLE.md): the whole run of a trial is one jittable function of
traced inputs (its dynamic hyperparameters, its seed, optionally the state it
resumes from, and the shared step batches), so `jax.vmap` over trials of one
`ArchSpec` is one line and the cohort is one compiled program.

Hyperparameters are traced scalars: the row optimizer and the dense optax
optimizer are built inside the function from them (the dense learning rate and
weight decay live in the `optax.inject_hyperparams` state, so a resumed trial
gets its new values written there: PBT's explore), the embedding L2 enters the
loss, and the initial embedding scale multiplies a unit-variance draw.

A step whose loss, updated rows or updated dense parameters are not finite is
not applied, and neither is any later step of that trial (`alive` drops to
False): a diverging trial keeps its last finite state and cannot disturb its
cohort-mates, whose computation never reads it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from sfjax import models
from sfjax.cohorts import lane_optimizers
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.table_choices import bag_pooling, table_dims, table_overrides
from sfjax.core.errors import ConfigError
from sfjax.core.types import DeviceBatch
from sfjax.data.types import DatasetSpec
from sfjax.embedding import device_table, row_optimizers
from sfjax.embedding.row_optimizers import RowOptimizer
from sfjax.train import defaults as ctr_defaults_lib
from sfjax.train import optimizers
from sfjax.train import step as step_lib
from sfjax.train.state import TrainState

_EMB = ctr_defaults_lib.ctr_defaults().embedding
# arch.DYNAMIC_KEYS -> scalar (one trial; a float where nothing is traced) or [W] (a cohort)
Hparams = Mapping[str, jax.Array | float]


class TrialOutput(NamedTuple):
  """What one trial's program returns (a leading [W] axis under vmap).

  Attributes:
    state: final TrainState (the last finite one for a failed trial).
    alive: bool scalar, False once a step was rejected as non-finite.
    losses: [L] train loss of each step of the range.
    applied: [L] bool, whether each step was applied.
    logits: [Te, Be] eval logits of the final state.
  """

  state: TrainState
  alive: jax.Array
  losses: jax.Array
  applied: jax.Array
  logits: jax.Array


def trial_optimizers(arch: ArchSpec, hparams: Hparams, spec: DatasetSpec | None = None):
  """The trial's dense and row optimizers: the trainer's factories, with traced hyperparameters.

  With `spec`: tables that name their own row optimizer train with it, and tables that set
  their own learning rate train at it (`table_overrides`: one `per_table` optimizer, the
  trainer's `row_optimizer_from_config`; its slots are the widest table's), and with tables
  read through fewer columns (`table_dims`) a row-wise optimizer averages each row over its
  table's own columns (`table_dims.row_width_optimizer`). Either way the step passes each
  row's table (`table_dims.with_row_tables`).
  """
  tx = optimizers.dense_optimizer(arch.dense_optimizer, hparams["optimizer.learning_rate"],
                                  hparams["optimizer.weight_decay"], field="optimizer.name")

  # A program of several row optimizers (a mixed cohort) takes each lane's by its index, and
  # of several row widths each lane's own width (`lane_optimizers.ROW_WIDTH_KEY`).
  def make(learning_rate, row_width):
    return lane_optimizers.make_lane_optimizer(
        arch.embedding_optimizer, learning_rate, _EMB,
        hparams.get(lane_optimizers.LANE_KEY, 0), field="embedding.optimizer",
        row_width=row_width)

  learning_rate = hparams["embedding.learning_rate"]
  names = table_overrides.own_optimizers(spec)
  widths = None
  if spec is not None and _reads_dims(spec, hparams) and "rowwise_adagrad" in (
      *lane_optimizers.lane_names(arch.embedding_optimizer), *(names or ())):
    widths = table_dims.row_widths(spec, _dims(hparams), _latent(arch), arch.embedding_width)
  rates = table_overrides.own_rates(spec)
  if rates is not None or names is not None:
    assert spec is not None and spec.layout is not None  # own settings come from its tables
    count = len(spec.layout.tables)
    rates, names = rates or (0.0,) * count, names or ("",) * count
    own_width = hparams.get(lane_optimizers.ROW_WIDTH_KEY)
    tables: list[RowOptimizer] = []
    keys: list[tuple[str, float]] = []
    for t, (rate, name) in enumerate(zip(rates, names, strict=True)):
      width = own_width if widths is None else widths[t]
      if name:  # the table's own optimizer, in every lane (0: the trial's rate)
        tables.append(row_optimizers.make(
            name, rate or learning_rate, _EMB,
            row_width=width if name == "rowwise_adagrad" else None,
            field=f"features.tables.{spec.layout.tables[t].name}.optimizer"))
        keys.append(("own", t))
      else:  # the trial's optimizer: tables at one rate (no width of their own) share an update
        tables.append(make(rate or learning_rate, width))
        keys.append(("trial", rate) if widths is None else ("trial", t))
    return tx, row_optimizers.per_table(tuple(tables), tuple(keys))
  if widths is not None:
    return tx, table_dims.row_width_optimizer(lambda w: make(learning_rate, w), widths)
  return tx, make(learning_rate, hparams.get(lane_optimizers.ROW_WIDTH_KEY))


def _dims(hparams: Hparams) -> dict[str, Any]:
  return {k: v for k, v in hparams.items() if table_dims.dimmed_table(k) is not None}


def _latent(arch: ArchSpec) -> int:
  latent = models.latent_dim(arch.model_name, arch.embed_dim)
  if latent is None:
    raise ConfigError(f"model {arch.model_name!r} has no per-table embedding dims (its rows "
                      f"are not model.embed_dim latent columns)")
  return latent


def _reads_dims(spec: DatasetSpec, hparams: Hparams) -> bool:
  """Whether the trial reads some table of `spec` through fewer columns (its dim keys, or
  the data set's own dims)."""
  return spec.layout is not None and table_dims.uses_dims(spec, hparams)


def trial_live_columns(arch: ArchSpec, spec: DatasetSpec, hparams: Hparams) -> jax.Array | None:
  """`[S, E]` 0/1 through which the trial's model reads each id column's rows (its tables'
  dims, `table_dims.traced_live_columns`); None when it reads every column."""
  if not _reads_dims(spec, hparams):
    return None
  return table_dims.traced_live_columns(spec, _dims(hparams), _latent(arch), arch.embedding_width)


def abstract_graphdef(arch: ArchSpec, spec: DatasetSpec) -> nnx.GraphDef:
  """The model's graph definition, built without allocating parameters."""
  return nnx.split(nnx.eval_shape(lambda: arch.build_model(spec, nnx.Rngs(0))))[0]


def program_graphdef(arch: ArchSpec, spec: DatasetSpec) -> nnx.GraphDef:
  """The graph of a trial program's model: `spec`'s bags pool by 'sum' over weights the
  program renormalises per trial (`bag_pooling`) and its tables are read in full through
  the trial's live columns (`table_dims`); the parameters are the model's."""
  return abstract_graphdef(arch, table_dims.undimmed_spec(bag_pooling.summed_spec(spec)))


def _repooler(spec: DatasetSpec, hparams: Hparams) -> Callable[[DeviceBatch], DeviceBatch]:
  """`batch -> batch` with each bag's weights normalised by the trial's pooling code
  (`bag_pooling.repool_weights`); the identity for a data set without bags."""
  if not bag_pooling.multi_hot_features(spec):
    return lambda batch: batch
  codes = {k: v for k, v in hparams.items() if bag_pooling.pooled_feature(k) is not None}
  return lambda batch: batch._replace(
      weights=bag_pooling.repool_weights(spec, batch.weights, codes))


def _preparer(spec: DatasetSpec, repool: Callable[[DeviceBatch], DeviceBatch],
              row_opt: RowOptimizer) -> Callable[[DeviceBatch], DeviceBatch]:
  """`batch -> batch` the trial's train step reads: `repool(batch)` (`_repooler`) and, for
  a row optimizer that reads each row's table (`trial_optimizers`), with it."""
  if not row_opt.tables:
    return repool
  return lambda batch: table_dims.with_row_tables(spec, repool(batch))


def init_trial_state(arch: ArchSpec, spec: DatasetSpec, hparams: Hparams,
                     key: jax.Array, num_rows: int | None = None,
                     table_starts: tuple[int, ...] | None = None) -> TrainState:
  """A fresh trial: model parameters and table drawn from `key`.

  Table values are uniform with standard deviation `embedding.init_stddev` (the
  distribution of `initializers.init_rows`, drawn on device), or a table's own
  `init_stddev` for its rows (`table_overrides.row_stddevs`), and 0 in the columns past
  a table's dim (the trial's or the data set's, `table_dims.row_live_columns`); slots start at
  the row optimizer's initial values. The table has `num_rows` rows (default
  `spec.total_rows`; a task with `compact_rows` passes its touched rows, and
  `table_starts`, where each table's rows begin among them, `TrialData.table_starts`).

  Raises:
    ValueError: compact rows (`num_rows` below `spec.total_rows`) of tables with their own
      `init_stddev` or dims and no `table_starts`.
  """
  num_rows = spec.total_rows if num_rows is None else int(num_rows)
  tx, row_opt = trial_optimizers(arch, hparams)
  model_key, table_key = jax.random.split(key)
  params = nnx.split(arch.build_model(table_dims.undimmed_spec(spec), nnx.Rngs(model_key)))[1]
  width = arch.embedding_width
  unit = jax.random.uniform(table_key, (num_rows, width), jnp.float32, -1.0, 1.0)
  stddev = hparams["embedding.init_stddev"]
  if num_rows and table_overrides.own_stddevs(spec) is not None:  # [V, 1]: its table's
    if table_starts is None and num_rows != spec.total_rows:
      raise ValueError(f"init_trial_state: {num_rows} compact rows of {spec.total_rows} "
                       f"need their table_starts (tables with their own init_stddev)")
    stddev = table_overrides.row_stddevs(spec, stddev, jnp.arange(num_rows),
                                         table_starts=table_starts)[:, None]
  values = unit * (math.sqrt(3.0) * stddev)  # [V, E]
  if num_rows and _reads_dims(spec, hparams):  # columns past a table's dim start at 0
    if table_starts is None and num_rows != spec.total_rows:
      raise ValueError(f"init_trial_state: {num_rows} compact rows of {spec.total_rows} "
                       f"need their table_starts (tables with their own dims)")
    live = table_dims.row_live_columns(spec, _dims(hparams), _latent(arch), width,
                                       jnp.arange(num_rows), table_starts)
    values = jnp.where(live, values, 0.0)
  if table_overrides.own_optimizers(spec) is not None:  # [V, S]: its table's initial slots
    if table_starts is None and num_rows not in (0, spec.total_rows):
      raise ValueError(f"init_trial_state: {num_rows} compact rows of {spec.total_rows} "
                       f"need their table_starts (tables with their own row optimizer)")
    _, row_opt = trial_optimizers(arch, hparams, spec)
    slots = table_overrides.row_slot_rows(
        spec, row_optimizers.initial_slot_rows(row_opt.tables, width), jnp.arange(num_rows),
        table_starts=table_starts)
  else:
    slot_row = jnp.asarray(row_opt.initial_slot_row(width))
    slots = jnp.broadcast_to(slot_row, (num_rows, slot_row.shape[0]))  # [V, S]
  return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                              device_table.TableState(values, slots))


def _with_dense_hparams(state: TrainState, hparams: Hparams) -> TrainState:
  """`state` with the dense learning rate and weight decay in its optax state replaced."""
  injected = dict(state.opt_state.hyperparams)
  for name in ("learning_rate", "weight_decay"):  # trial key `optimizer.<name>`
    injected[name] = jnp.asarray(hparams[f"optimizer.{name}"], jnp.asarray(injected[name]).dtype)
  return state._replace(opt_state=state.opt_state._replace(hyperparams=injected))


def stacked_eval_logits(graphdef: nnx.GraphDef, state: TrainState, eval_batches: DeviceBatch,
                        prepare: Callable[[DeviceBatch], DeviceBatch] | None = None,
                        live: jax.Array | None = None) -> jax.Array:
  """Logits `[Te, Be]` of every stacked eval batch (the trainer's `step.eval_logits`), each
  batch first through `prepare` when given (a trial's bag pooling), its rows read through
  `live` (a trial's table dims, `trial_live_columns`)."""
  prepare = prepare or (lambda b: b)
  return lax.map(lambda b: step_lib.eval_logits(graphdef, state.params, state.table.values,
                                                prepare(b), live), eval_batches)


class TrialStep(NamedTuple):
  """One trial's train step and how it reads a batch (`trial_step`).

  Attributes:
    train_step: `(state, batch, alive) -> (state, {'loss', 'applied'})`.
    repool: `batch -> batch` with each bag's weights normalised by the trial's pooling.
    live: None, or `[S, E]` 0/1 through which the model reads the rows (the trial's
      table dims; an eval reads through it too, `stacked_eval_logits`).
  """

  train_step: Callable[..., Any]
  repool: Callable[[DeviceBatch], DeviceBatch]
  live: jax.Array | None


def trial_step(arch: ArchSpec, spec: DatasetSpec, graphdef: nnx.GraphDef, hparams: Hparams,
               dense_mask: Any = None) -> TrialStep:
  """One trial's train step, bag pooling and table dims, built from its (traced)
  hyperparameters: the shared step (`step.make_train_step`, non-finite steps skipped)
  over `repool(batch)`, its rows read through `live` (`trial_live_columns`)."""
  tx, row_opt = trial_optimizers(arch, hparams, spec)
  repool = _repooler(spec, hparams)
  prepare = _preparer(spec, repool, row_opt)
  live = trial_live_columns(arch, spec, hparams)
  shared_step = step_lib.make_train_step(graphdef, tx, row_opt, l2=hparams["embedding.l2"],
                                         skip_non_finite=True, dense_mask=dense_mask,
                                         live_columns=live)

  def train_step(state, batch, alive):
    return shared_step(state, prepare(batch), alive)

  return TrialStep(train_step, repool, live)


def _make_trial_fn(arch: ArchSpec, spec: DatasetSpec, graphdef: nnx.GraphDef, *,
                   resume: bool, masked: bool = False, num_rows: int | None = None,
                   ragged: bool = False, table_starts: tuple[int, ...] | None = None
                   ) -> Callable[..., TrialOutput]:
  """The pure function of one trial.

  Args:
    arch, spec, graphdef: the (padded program's superset) architecture, data set
      and the model's graph definition (`program_graphdef`: bags pool by 'sum' over
      the weights this function normalises by the trial's pooling codes).
    resume: start from `init_state` instead of drawing one from the seed.
    masked: a padded trial of a shape bucket (`sfjax.cohorts.shape_buckets.buckets`): it
      resumes from its padded `init_state` and `dense_mask` freezes the padding.
    num_rows, table_starts: rows of a fresh trial's table and where each table's begin
      (`init_trial_state`).
    ragged: the trial takes its own step range inside a longer shared one (it
      resumes from `init_state`): `batches` span the cohort's steps `[lo, hi)`,
      the trial starts at batch `offset` and takes `length` steps; the scan runs
      over `clock` (`[L]` = arange of the longest range) and a loop index
      `t >= length` is not applied (the state stays as it is, exactly), so the
      trial equals its own run over its own range.

  Returns:
    `trial(hparams, seed, init_state, batches, eval_batches, dense_mask=None,
    offset=None, length=None, clock=None) -> TrialOutput` with hparams a dict of
    scalars, seed an int32 scalar, init_state a TrainState (ignored, may be None,
    unless `resume`, `masked` or `ragged`), batches a DeviceBatch with a leading
    [L] step axis ([hi - lo] when ragged), eval_batches one with a leading [Te]
    axis, dense_mask (masked only) a 0/1 pytree like the dense parameters, and
    offset, length int32 scalars and clock an int32 [L] (ragged only). Under
    `ragged`, `losses`/`applied` are indexed by the loop index (False past the
    trial's length).
  """
  resume = resume or masked or ragged

  def trial(hparams, seed, init_state, batches, eval_batches, dense_mask=None, offset=None,
            length=None, clock=None) -> TrialOutput:
    if resume:
      state = _with_dense_hparams(init_state, hparams)
    else:
      state = init_trial_state(arch, spec, hparams, jax.random.key(seed), num_rows,
                               table_starts)
    train_step, repool, live = trial_step(arch, spec, graphdef, hparams,
                                          dense_mask if masked else None)

    def body(carry, batch):
      state, alive = carry
      state, metrics = train_step(state, batch, alive)  # once dead, every later step is skipped
      alive = metrics["applied"]
      return (state, alive), (metrics["loss"], alive)

    def ragged_body(carry, t):
      state, alive = carry
      span = jax.tree.leaves(batches)[0].shape[0]
      index = jnp.minimum(offset + t, span - 1)  # clamped past the range: not applied anyway
      batch = jax.tree.map(lambda b: lax.dynamic_index_in_dim(b, index, keepdims=False), batches)
      active = t < length
      state, metrics = train_step(state, batch, alive & active)
      applied = metrics["applied"]
      return (state, jnp.where(active, applied, alive)), (metrics["loss"], applied)

    if ragged:
      (state, alive), (losses, applied) = lax.scan(ragged_body, (state, jnp.bool_(True)), clock)
    else:
      (state, alive), (losses, applied) = lax.scan(body, (state, jnp.bool_(True)), batches)
    return TrialOutput(state, alive, losses, applied,
                       stacked_eval_logits(graphdef, state, eval_batches, repool, live))

  return trial


def make_cohort_fn(arch: ArchSpec, spec: DatasetSpec, graphdef: nnx.GraphDef, *, resume: bool,
                   on_trace: Callable[[], Any] | None = None,
                   masked: bool = False, num_rows: int | None = None, ragged: bool = False,
                   table_starts: tuple[int, ...] | None = None) -> Callable[..., TrialOutput]:
  """`jax.vmap` of `_make_trial_fn` over trials (`masked`, `num_rows`, `ragged`, `table_starts`: as
  there); batches (and a ragged cohort's clock) are shared (not vmapped).

  Returns:
    `cohort(hparams [W], seeds [W], init_states [W] | None, batches, eval_batches,
    dense_masks [W] | None, offsets [W] | None, lengths [W] | None, clock [L] | None)
    -> TrialOutput` with a leading [W] axis (`dense_masks` only when `masked`;
    offsets, lengths and clock only when `ragged`); `on_trace` runs each time it is traced.
  """
  trial = _make_trial_fn(arch, spec, graphdef, resume=resume, masked=masked, num_rows=num_rows,
                         ragged=ragged, table_starts=table_starts)
  stacked_states = 0 if resume or masked or ragged else None
  per_trial = 0 if ragged else None

  def cohort(hparams, seeds, init_states, batches, eval_batches, dense_masks=None, offsets=None,
             lengths=None, clock=None):
    if on_trace is not None:
      on_trace()
    return jax.vmap(trial, in_axes=(0, 0, stacked_states, None, None, 0 if masked else None,
                                    per_trial, per_trial, None))(
        hparams, seeds, init_states, batches, eval_batches, dense_masks, offsets, lengths, clock)

  return cohort
