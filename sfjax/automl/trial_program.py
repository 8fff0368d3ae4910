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
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax import lax

from sfjax.train import defaults as ctr_defaults_lib
from sfjax.automl.arch import ArchSpec
from sfjax.data.types import DatasetSpec
from sfjax.embedding import device_table
from sfjax.embedding import row_optimizers
from sfjax.train import state as state_lib
from sfjax.train import step as step_lib

_EMB = ctr_defaults_lib.ctr_defaults().embedding
Hparams = Mapping[str, jax.Array]  # arch.DYNAMIC_KEYS -> scalar (one trial) or [W] (a cohort)


class TrialOutput(NamedTuple):
  """What one trial's program returns (a leading [W] axis under vmap).

  Attributes:
    state: final TrainState (the last finite one for a failed trial).
    alive: bool scalar, False once a step was rejected as non-finite.
    losses: [L] train loss of each step of the range.
    applied: [L] bool, whether each step was applied.
    logits: [Te, Be] eval logits of the final state.
  """

  state: state_lib.TrainState
  alive: jax.Array
  losses: jax.Array
  applied: jax.Array
  logits: jax.Array


def dense_optimizer(name: str, learning_rate, weight_decay) -> optax.GradientTransformation:
  """optax optimizer `name` with injected (traceable) `learning_rate` and `weight_decay`.

  Every kind has both hyperparameters in its state, so the state's structure does
  not depend on their values (weight decay 0 adds exactly 0).
  """
  inner = {
      "adam": lambda learning_rate, weight_decay: optax.chain(
          optax.add_decayed_weights(weight_decay), optax.adam(learning_rate)),
      "adamw": lambda learning_rate, weight_decay: optax.adamw(learning_rate, weight_decay=weight_decay),
      "sgd": lambda learning_rate, weight_decay: optax.chain(
          optax.add_decayed_weights(weight_decay), optax.sgd(learning_rate)),
      "adagrad": lambda learning_rate, weight_decay: optax.chain(
          optax.add_decayed_weights(weight_decay), optax.adagrad(learning_rate)),
  }
  if name not in inner:
    raise ValueError(f"optim.dense_optimizer: unknown dense optimizer {name!r} (known: {', '.join(inner)})")
  return optax.inject_hyperparams(inner[name])(learning_rate=learning_rate, weight_decay=weight_decay)


def row_optimizer(name: str, learning_rate) -> row_optimizers.RowOptimizer:
  """Row optimizer `name` with a (traceable) learning rate; other settings from ctr.py."""
  if name == "sgd":
    return row_optimizers.sgd(learning_rate)
  if name == "adagrad":
    return row_optimizers.adagrad(learning_rate, _EMB.adagrad_initial_accumulator)
  if name == "adam":
    return row_optimizers.adam(learning_rate, _EMB.adam_b1, _EMB.adam_b2, _EMB.adam_eps)
  if name == "ftrl":
    return row_optimizers.ftrl(learning_rate, _EMB.ftrl_l1, _EMB.ftrl_l2, _EMB.ftrl_beta,
                               _EMB.ftrl_initial_accumulator)
  raise ValueError(f"optim.embedding_optimizer: unknown row optimizer {name!r} "
                   "(known: sgd, adagrad, adam, ftrl)")


def _optimizers(arch: ArchSpec, hparams: Hparams):
  tx = dense_optimizer(arch.dense_optimizer, hparams["optim.dense_lr"], hparams["optim.weight_decay"])
  return tx, row_optimizer(arch.embedding_optimizer, hparams["optim.embedding_lr"])


def abstract_graphdef(arch: ArchSpec, spec: DatasetSpec) -> nnx.GraphDef:
  """The model's graph definition, built without allocating parameters."""
  return nnx.split(nnx.eval_shape(lambda: arch.build_model(spec, nnx.Rngs(0))))[0]


def init_trial_state(arch: ArchSpec, spec: DatasetSpec, hparams: Hparams,
                     key: jax.Array) -> state_lib.TrainState:
  """A fresh trial: model parameters and table drawn from `key`.

  Table values are uniform with standard deviation `optim.init_stddev` (the
  distribution of `initializers.init_rows`, drawn on device); slots start at
  the row optimizer's initial values.
  """
  tx, row_opt = _optimizers(arch, hparams)
  model_key, table_key = jax.random.split(key)
  params = nnx.split(arch.build_model(spec, nnx.Rngs(model_key)))[1]
  width = arch.embedding_width
  unit = jax.random.uniform(table_key, (spec.total_rows, width), jnp.float32, -1.0, 1.0)
  values = unit * (math.sqrt(3.0) * hparams["optim.init_stddev"])  # [V, E]
  slot_row = jnp.asarray(row_opt.initial_slot_row(width))
  slots = jnp.broadcast_to(slot_row, (spec.total_rows, slot_row.shape[0]))  # [V, S]
  return state_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                              device_table.TableState(values, slots))


def with_dense_hparams(state: state_lib.TrainState, hparams: Hparams) -> state_lib.TrainState:
  """`state` with the dense learning rate and weight decay in its optax state replaced."""
  injected = dict(state.opt_state.hyperparams)
  for name, key in (("learning_rate", "optim.dense_lr"), ("weight_decay", "optim.weight_decay")):
    injected[name] = jnp.asarray(hparams[key], jnp.asarray(injected[name]).dtype)
  return state._replace(opt_state=state.opt_state._replace(hyperparams=injected))


def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def guarded_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                       row_opt: row_optimizers.RowOptimizer, l2, num_rows: int,
                       state: state_lib.TrainState, alive: jax.Array, batch: state_lib.DeviceBatch):
  """The train step of `sfjax.train.step`, applied only while it stays finite.

  Returns:
    (state, alive, loss): `alive` is False from the first step whose loss, new
    rows or new dense parameters are not finite; such steps leave `state` as is.
  """
  uniq = device_table.gather_rows(state.table, batch.rows)  # [U, E], [U, S]
  (loss, _), (param_grads, row_grads) = step_lib.loss_and_grads(
      graphdef, state.params, uniq.values, batch, l2)
  count = state.step + 1
  new_values, new_slots = row_opt.update(uniq.values, uniq.opt_slots, row_grads, count)
  updates, opt_state = tx.update(param_grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  # Padding entries (row V) may hold NaN (e.g. Adagrad on a zero accumulator); they are dropped.
  real = (batch.rows < num_rows)[:, None]  # [U, 1]
  new_rows = jnp.where(real, jnp.concatenate([new_values, new_slots], axis=1), 0.0)
  alive = alive & jnp.isfinite(loss) & _all_finite((new_rows, params))
  # A rejected step writes no row (padding row V is dropped) and keeps the dense state.
  rows = jnp.where(alive, batch.rows, num_rows)
  table = device_table.scatter_rows(state.table, rows, device_table.TableState(new_values, new_slots))
  keep = lambda new, old: jnp.where(alive, new, old)
  params, opt_state = jax.tree.map(keep, (params, opt_state), (state.params, state.opt_state))
  return state_lib.TrainState(jnp.where(alive, count, state.step), params, opt_state, table), alive, loss


def eval_logits(graphdef: nnx.GraphDef, state: state_lib.TrainState,
                eval_batches: state_lib.DeviceBatch) -> jax.Array:
  """Logits `[Te, Be]` of every stacked eval batch."""

  def one(batch):
    values = jnp.take(state.table.values, batch.rows, axis=0, mode="fill", fill_value=0)
    return step_lib.forward_logits(graphdef, state.params, values, batch)

  return lax.map(one, eval_batches)


def make_trial_fn(arch: ArchSpec, spec: DatasetSpec, graphdef: nnx.GraphDef, *,
                  resume: bool) -> Callable[..., TrialOutput]:
  """The pure function of one trial.

  Returns:
    `trial(hparams, seed, init_state, batches, eval_batches) -> TrialOutput` with
    hparams a dict of scalars, seed an int32 scalar, init_state a TrainState
    (ignored, may be None, unless `resume`), batches a DeviceBatch with a
    leading [L] step axis and eval_batches one with a leading [Te] axis.
  """

  def trial(hparams, seed, init_state, batches, eval_batches) -> TrialOutput:
    tx, row_opt = _optimizers(arch, hparams)
    if resume:
      state = with_dense_hparams(init_state, hparams)
    else:
      state = init_trial_state(arch, spec, hparams, jax.random.key(seed))

    def body(carry, batch):
      state, alive, loss = guarded_train_step(graphdef, tx, row_opt, hparams["optim.embedding_l2"],
                                              spec.total_rows, *carry, batch)
      return (state, alive), (loss, alive)

    (state, alive), (losses, applied) = lax.scan(body, (state, jnp.bool_(True)), batches)
    return TrialOutput(state, alive, losses, applied, eval_logits(graphdef, state, eval_batches))

  return trial


def make_cohort_fn(arch: ArchSpec, spec: DatasetSpec, graphdef: nnx.GraphDef, *, resume: bool,
                   on_trace: Callable[[], Any] | None = None) -> Callable[..., TrialOutput]:
  """`jax.vmap` of `make_trial_fn` over trials; batches are shared (not vmapped).

  Returns:
    `cohort(hparams [W], seeds [W], init_states [W] | None, batches, eval_batches)
    -> TrialOutput` with a leading [W] axis; `on_trace` runs each time it is traced.
  """
  trial = make_trial_fn(arch, spec, graphdef, resume=resume)

  def cohort(hparams, seeds, init_states, batches, eval_batches):
    if on_trace is not None:
      on_trace()
    return jax.vmap(trial, in_axes=(0, 0, 0 if resume else None, None, None))(
        hparams, seeds, init_states, batches, eval_batches)

  return cohort
