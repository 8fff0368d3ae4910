"""The one CTR train step, its cache wrapper and the one eval function.

One step: gather the batch's unique rows `[U, E]`, look up `rows[vids]` as
`[B, F, E]`, forward/backward, take the gradient w.r.t. the `[U, E]` unique
rows only (never a dense gradient over the table), apply the row optimizer to
those rows and scatter them back; dense parameters go through optax.

Every user runs this step: the trainer (jitted, donated), the MixCache (wrapped
by `make_cache_train_step`: rows are cache slots), the AutoML trials
(`sfjax.cohorts.program`: inside a `lax.scan`, vmapped over trials,
with `skip_non_finite` so a diverging trial keeps its last finite state), the
structure searches (`sfjax.structure`: AutoFIS / AutoGroup models, whose batch-norm
moments and Gumbel counter travel as `model_variables`, their parameter groups
split by `optax.multi_transform`) and the compression fine-tune
(`sfjax.compress.prune_search`: a masked model, `dense_mask` holding its dropped
units at 0, vmapped over candidates).

Under `jax.jit` with a batch sharded over the mesh axis 'data' and the table
replicated, XLA sums the `[U, E]` row gradient across devices with one
all-reduce: the device collective replaces a CPU parameter server (SFCTR sync).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sfjax.core.types import DeviceBatch
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import device_table, row_optimizers
from sfjax.train.state import DenseState, TrainState

_Metrics = dict[str, jax.Array]
TrainStep = Callable[..., tuple[TrainState, _Metrics]]
# (params, model_state, batch) -> (loss, new model_state): a model without a table.
DenseLossFn = Callable[[Any, Any, Any], tuple[jax.Array, Any]]


def forward_logits(graphdef: nnx.GraphDef, params: Any, uniq_values: jax.Array,
                   batch: DeviceBatch, live: jax.Array | None = None) -> jax.Array:
  """Model logits `[B]` from the batch's unique rows `[U, E]` and virtual ids (`live`:
  as `call_model`'s)."""
  return call_model(nnx.merge(graphdef, params), uniq_values, batch, live)


def call_model(model: nnx.Module, uniq_values: jax.Array, batch: DeviceBatch,
               live: jax.Array | None = None) -> jax.Array:
  """`model(rows[vids], dense)`, or with the per-id weights of a feature layout.

  `rows[vids]` is `[B, F, E]`, or `[B, S, E]` id columns that the model's input wrapper
  pools by `batch.weights [B, S]` (`sfjax.models.behavior.pooling`). A model built to
  read the unique rows itself (`reads_unique_rows`: DeepFM with `model.split_input`)
  gets `(rows [U, E], vids, dense)` and gathers the blocks it needs.

  `live`: None, or `[S, E]` 0/1 (may be traced) multiplying each id column's rows
  before the model reads them: a search trial's per-table embedding dims
  (`sfjax.cohorts.table_choices.table_dims`; the trainer's `PooledInput` applies the same mask from
  the layout). It needs a layout's batch (`batch.weights`).
  """
  if live is not None and batch.weights is None:
    raise ValueError("call_model: live columns need a feature layout's batch (weights)")
  if batch.weights is None and getattr(model, "reads_unique_rows", False):
    from_rows = model.from_unique_rows  # type: ignore[attr-defined]
    return from_rows(uniq_values, batch.vids, batch.dense)
  emb = jnp.take(uniq_values, batch.vids, axis=0)
  if live is not None:
    emb = emb * live.astype(emb.dtype)[None]
  if batch.weights is None:
    return model(emb, batch.dense)
  return model(emb, batch.dense, batch.weights)


def eval_logits(graphdef: nnx.GraphDef, params: Any, values: jax.Array,
                batch: DeviceBatch, live: jax.Array | None = None) -> jax.Array:
  """Logits `[B]` of an eval batch whose `rows` index `values` (padding rows read zeros).

  `values` is whatever holds the rows: the device table `[V, E]`, a trial's
  table, or the rows an eval batch gathered from the host table. `live`: as `call_model`'s.
  """
  uniq_values = jnp.take(values, batch.rows, axis=0, mode="fill", fill_value=0)  # [U, E]
  return forward_logits(graphdef, params, uniq_values, batch, live)


def _masked_loss(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean sigmoid cross-entropy over real (mask = 1) examples."""
  per_example = optax.sigmoid_binary_cross_entropy(logits, labels)
  return jnp.sum(per_example * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def loss_and_grads(graphdef: nnx.GraphDef, params: Any, uniq_values: jax.Array,
                   batch: DeviceBatch, l2):
  """Loss and gradients w.r.t. dense params and the `[U, E]` unique rows.

  Returns:
    (loss, logits), (param_grads, row_grads [U, E]).
  """
  (loss, logits, _), grads = _loss_and_grads(graphdef, params, None, uniq_values, batch, l2)
  return (loss, logits), grads


def _loss_and_grads(graphdef, params, variables, uniq_values, batch, l2, live=None):
  """`loss_and_grads` of a model whose forward may update `variables` (None: no such state),
  its rows read through `live` (`call_model`; the L2 penalty is on the stored rows).

  Returns:
    (loss, logits, new variables or None), (param_grads, row_grads [U, E]).
  """

  # A literal 0.0 (the default) adds no term: XLA may not drop `0 * x` (x could be inf).
  no_l2 = isinstance(l2, (int, float)) and l2 == 0

  def objective(p, values):
    if variables is None:
      logits, new_variables = forward_logits(graphdef, p, values, batch, live), None
    else:
      # A copy made under this trace: NNX refuses to update variables of an outer trace.
      model = nnx.merge(graphdef, p, jax.tree.map(lambda x: x, variables))
      logits = call_model(model, values, batch, live)
      new_variables = nnx.state(model, nnx.Not(nnx.Param))
    loss = _masked_loss(logits, batch.labels, batch.mask)
    if no_l2:
      return loss, (loss, logits, new_variables)
    # Padding rows read as zeros, so they add nothing to the penalty.
    return loss + l2 * jnp.sum(values * values), (loss, logits, new_variables)

  (_, aux), grads = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
      params, uniq_values)
  return aux, grads


def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                    row_opt: row_optimizers.RowOptimizer, *, l2=0.0,
                    skip_non_finite: bool = False, row_axis: str | None = None,
                    dense_mask: Any = None, model_variables: bool = False,
                    live_columns: jax.Array | None = None) -> TrainStep:
  """Builds the un-jitted step `(state, batch) -> (state, metrics)`; see `jit_train_step`.

  Args:
    graphdef: the model's NNX graph definition.
    tx: the dense optimizer (`sfjax.train.optimizers.dense_optimizer`).
    row_opt: the row optimizer (`sfjax.embedding.row_optimizers.make`).
    l2: L2 penalty on the rows the batch touches (a float or a traced scalar).
    skip_non_finite: guard the update: a step whose loss, updated (real) rows or
      updated dense parameters are not finite is not applied (the state comes
      back unchanged, its rows are written nowhere). The step then takes a third
      argument `enabled` (bool scalar, default True): False skips the step too,
      so a caller can keep a diverged trial frozen. `metrics['applied']` says
      whether the step was applied.
    row_axis: None (the table is replicated or on one device), or the mesh axis of a
      row-sharded cache: the step is then the per-device body to run inside
      `jax.shard_map` over that axis (`_owner_train_step`): `state.table` is this
      device's cache block and `batch.rows` its local slots (`sharded_cache.block_by_owner`).
    dense_mask: None, or a pytree like the dense parameters (0/1 values, may be
      traced) that multiplies both their gradients and their updates: entries at 0
      never change (a padded program's unused units and identity layers,
      `sfjax.cohorts.shape_buckets.buckets`), entries at 1 follow exactly the unmasked step.
    model_variables: the model has variables besides `nnx.Param`s that its forward
      updates (batch-norm moments, an `nnx.Rngs` counter: AutoFIS, AutoGroup):
      `state.params` is then its whole `nnx.State`, `tx` (and `dense_mask`) see only
      its `nnx.Param` part, and the other variables are written back after each
      forward. False: every variable is a parameter (the registered CTR models).
    live_columns: None, or `[S, E]` 0/1 (may be traced) through which the model reads
      each id column's rows (`call_model`): a search trial's per-table dims
      (`sfjax.cohorts.table_choices.table_dims`). Not with `row_axis`.

  Returns:
    `train_step(state, batch[, enabled]) -> (state, {'loss'[, 'applied']})`.
  """

  if model_variables and (row_axis is not None or skip_non_finite):
    raise ValueError("make_train_step: model_variables is not supported with row_axis or "
                     "skip_non_finite")
  if row_axis is not None:
    if skip_non_finite or dense_mask is not None or live_columns is not None:
      raise ValueError("make_train_step: skip_non_finite, dense_mask and live_columns are not "
                       "supported with row_axis")
    return _owner_train_step(graphdef, tx, row_opt, l2, row_axis)

  def train_step(state: TrainState, batch: DeviceBatch, enabled=True):
    uniq = device_table.gather_rows(state.table, batch.rows)  # [U, E], [U, S]
    params, variables = state.params, None
    if model_variables:
      params, variables = nnx.split_state(state.params, nnx.Param, ...)
    (loss, _, variables), (param_grads, row_grads) = _loss_and_grads(
        graphdef, params, variables, uniq.values, batch, l2, live_columns)
    count = state.step + 1
    new_values, new_slots = update_rows(row_opt, uniq.values, uniq.opt_slots, row_grads, count,
                                        batch.row_tables)
    params, opt_state = dense_update(tx, param_grads, state.opt_state, params, dense_mask)
    if model_variables:
      params = nnx.merge_state(params, variables)
    rows, metrics = batch.rows, {"loss": loss}
    if skip_non_finite:
      # Padding entries (row V) may hold NaN (e.g. Adagrad on a zero accumulator): ignored.
      real = (batch.rows < state.table.values.shape[0])[:, None]  # [U, 1]
      touched = jnp.where(real, jnp.concatenate([new_values, new_slots], axis=1), 0.0)
      applied = enabled & jnp.isfinite(loss) & _all_finite((touched, params))
      rows = jnp.where(applied, rows, state.table.values.shape[0])  # a skipped step writes no row
      def keep(new, old):
        return jnp.where(applied, new, old)

      params, opt_state = jax.tree.map(keep, (params, opt_state), (state.params, state.opt_state))
      count = jnp.where(applied, count, state.step)
      metrics["applied"] = applied
    elif enabled is not True:
      raise ValueError("train_step: `enabled` needs make_train_step(..., skip_non_finite=True)")
    table = device_table.scatter_rows(
        state.table, rows, device_table.TableState(new_values, new_slots))
    return TrainState(count, params, opt_state, table), metrics

  return train_step


def _owner_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                      row_opt: row_optimizers.RowOptimizer, l2, axis: str) -> TrainStep:
  """The train step of one device of a row-sharded cache (inside `jax.shard_map`).

  The same computation as `make_train_step`'s, with the collectives written out:
  each device gathers its own rows `[Ud, E]`, `all_gather` assembles the `[D*Ud, E]`
  rows the examples index, the local gradients are weighted by the device's share of
  the real examples (so their sum is the global mean's gradient), the row gradient is
  `psum_scatter`ed to the rows' owners and the dense gradients `psum`med; each owner
  applies the row optimizer to its own rows only.
  """
  no_l2 = isinstance(l2, (int, float)) and l2 == 0

  def owner_step(state: TrainState, batch: DeviceBatch):
    own = device_table.gather_rows(state.table, batch.rows)  # [Ud, E], [Ud, S]
    values = jax.lax.all_gather(own.values, axis, tiled=True)  # [D*Ud, E]
    examples = jnp.sum(batch.mask)
    weight = examples / jnp.maximum(jax.lax.psum(examples, axis), 1.0)
    (loss, _), (param_grads, row_grads) = loss_and_grads(graphdef, state.params, values, batch, 0.0)
    loss = jax.lax.psum(weight * loss, axis)
    param_grads = jax.tree.map(lambda g: jax.lax.psum(weight * g, axis), param_grads)
    row_grads = jax.lax.psum_scatter(weight * row_grads, axis, tiled=True)  # [Ud, E] own rows
    if not no_l2:  # d/dv of l2 * sum(v^2), added once, by the owner
      row_grads = row_grads + 2.0 * l2 * own.values
    count = state.step + 1
    new_values, new_slots = update_rows(row_opt, own.values, own.opt_slots, row_grads, count,
                                        batch.row_tables)
    table = device_table.scatter_rows(state.table, batch.rows,
                                      device_table.TableState(new_values, new_slots))
    updates, opt_state = tx.update(param_grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(count, params, opt_state, table), {"loss": loss}

  return owner_step


def update_rows(row_opt: row_optimizers.RowOptimizer, rows: jax.Array, slots: jax.Array,
                grads: jax.Array, count: jax.Array, row_tables: Any = None):
  """`row_opt.update` of the batch's rows `[U, E]`; with `row_tables [U]` (a `per_table`
  optimizer), each row by its table's optimizer.

  Returns:
    (new rows [U, E], new slots [U, S]).
  """
  if not row_opt.tables:  # one optimizer: row_tables, if any, changes nothing
    return row_opt.update(rows, slots, grads, count)
  if row_tables is None:
    raise ValueError("a per_table row optimizer needs DeviceBatch.row_tables")
  return row_opt.update(rows, slots, grads, count, row_tables=row_tables)


def dense_update(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any,
                 dense_mask: Any = None) -> tuple[Any, Any]:
  """One optax update of dense parameters: `(params, opt_state)` after `grads`.

  `dense_mask` (None, or 0/1 like `params`) multiplies the gradients and the
  updates (see `make_train_step`). Every step here updates dense parameters
  through this function.
  """
  if dense_mask is not None:
    grads = jax.tree.map(jnp.multiply, grads, dense_mask)
  updates, opt_state = tx.update(grads, opt_state, params)
  if dense_mask is not None:
    updates = jax.tree.map(jnp.multiply, updates, dense_mask)
  return optax.apply_updates(params, updates), opt_state


def make_dense_train_step(loss_fn: DenseLossFn, tx: optax.GradientTransformation) -> Callable:
  """The step of a model without an embedding table (images, DARTS' derived nets).

  `loss_fn(params, model_state, batch) -> (loss, new model_state)`; the gradient
  is taken w.r.t. `params` only, and `model_state` (batch-norm statistics) is
  carried as the forward pass left it. Jit it with `jit_train_step` (state
  donated), or run it inside a `lax.scan` (a whole training as one function).

  Returns:
    `train_step(state: DenseState, batch) -> (state, {'loss'})`.
  """

  def dense_train_step(state: DenseState, batch):
    (loss, model_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, state.model_state, batch)
    params, opt_state = dense_update(tx, grads, state.opt_state, state.params)
    return DenseState(state.step + 1, params, opt_state, model_state), {"loss": loss}

  return dense_train_step


def make_cache_train_step(train_step: TrainStep, swap_rows=cache_lib.swap_rows) -> Callable:
  """Wraps the train step for the MixCache: `(state, batch, swap) -> (state, metrics, evicted)`.

  `state.table` is the device cache and `batch.rows` holds cache slots; the
  swap (victims read out, then fills written) runs first, in the same program.
  `swap_rows(cache, swap) -> (cache, evicted)` is `cache.swap_rows` (one cache,
  maybe replicated) or, inside `jax.shard_map`, `sharded_cache.swap_rows_local`.
  """

  def cache_train_step(state: TrainState, batch: DeviceBatch, swap: cache_lib.CacheSwap):
    cache, evicted = swap_rows(state.table, swap)
    state, metrics = train_step(state._replace(table=cache), batch)
    return state, metrics, evicted

  return cache_train_step


def jit_train_step(step_fn, state_sharding=None, batch_sharding=None, compiler_options=None):
  """`jax.jit` of a train step with the state donated (no table copy per step), compiled
  with `compiler_options` (XLA options; `sfjax.core.xla_cpu_dots`)."""
  if state_sharding is None:
    return jax.jit(step_fn, donate_argnums=0, compiler_options=compiler_options)
  return jax.jit(step_fn, donate_argnums=0, in_shardings=(state_sharding, batch_sharding),
                 out_shardings=(state_sharding, None), compiler_options=compiler_options)


def make_eval_step(graphdef: nnx.GraphDef):
  """Jitted `(params, values, batch) -> logits [B]` (`eval_logits`)."""
  return jax.jit(lambda params, values, batch: eval_logits(graphdef, params, values, batch))
