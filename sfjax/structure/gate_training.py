"""Training pure-function CTR models whose structure is searched (AutoFIS, AutoGroup).

A structure search trains a model with parameters of several kinds updated by
different optimizers, sometimes in turns: AutoFIS updates network weights by Adam
and gates by gRDA in one step; AutoGroup alternates a structure update and a
weight update on each batch. The trainer's step (`sfjax.train.step`) has one
optax transformation and no non-trained state (batch-norm moments), so this
module holds the small generalisation both searches share. It keeps the
trainer's conventions: the embedding table is a `TableState` updated row-wise
through a `RowOptimizer` on the batch's `[U, E]` unique rows only (never a dense
gradient over the table), batches are a `TrialData`'s precomputed
`DeviceBatch`es, and the loss is `train.step.masked_loss`.

A model is a `forward(params, stats, emb, dense, mask, key, train) -> (logits,
new_stats)` function of dense parameter groups `params` (a dict: group name ->
pytree), non-trained `stats`, embeddings `emb` [B, F, E], `dense` [B, Nd],
`mask` [B] and a PRNG key. A train step runs `phases` in order on one batch;
each phase differentiates the loss w.r.t. some groups (and the rows, if it says
so) and applies their optimizers; the step counter (the row optimizer's `count`)
advances once per step.

Evaluation splits the task's eval rows like `cohort.split_eval_mask`: the first
half is 'valid' (any selection uses it), the second half 'test' (only reported).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from sfjax.cohorts.cohort_runner import split_eval_mask
from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.core import metrics as metrics_lib
from sfjax.core.types import DeviceBatch
from sfjax.embedding import device_table, row_optimizers
from sfjax.train import defaults as defaults_lib
from sfjax.train.step import masked_loss

Forward = Callable[..., tuple[jax.Array, Any]]


def check_int(owner: str, name: str, value: Any, low: int) -> None:
  """Raises ValueError naming `owner.name` unless `value` is an integer >= low."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
    raise ValueError(f"{owner}.{name} must be an integer >= {low}, got {value!r}")


def check_float(owner: str, name: str, value: Any, low: float, low_ok: bool, high: float = math.inf) -> None:
  """Raises ValueError naming `owner.name` unless `value` is a finite number in range."""
  ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool) and math.isfinite(value)
  if not ok or value < low or (value == low and not low_ok) or value > high:
    bound = f"{'>=' if low_ok else '>'} {low}" + (f" and <= {high}" if high < math.inf else "")
    raise ValueError(f"{owner}.{name} must be a finite number {bound}, got {value!r}")


def check_common_settings(owner: str, settings) -> None:
  """Validates the fields AutoFIS and AutoGroup settings share; errors name `owner.field`."""
  check_int(owner, "embed_dim", settings.embed_dim, 1)
  if not isinstance(settings.mlp_dims, tuple):
    raise ValueError(f"{owner}.mlp_dims must be a tuple of widths, got {settings.mlp_dims!r}")
  for width in settings.mlp_dims:
    check_int(owner, "mlp_dims", width, 1)
  for name in ("batch_size", "eval_rows"):
    check_int(owner, name, getattr(settings, name), 0)
  check_int(owner, "seed", settings.seed, 0)
  for name in ("dense_lr", "embedding_lr", "init_stddev"):
    check_float(owner, name, getattr(settings, name), 0.0, False)
  row_optimizers.make(settings.embedding_optimizer, settings.embedding_lr, defaults_lib.ctr_defaults().embedding,
                      field=f"{owner}.embedding_optimizer")


def prepare_data(task: CTRTask, settings) -> TrialData:
  """The TrialData of `task` with `settings.batch_size` / `settings.eval_rows` when nonzero."""
  overrides = {k: getattr(settings, k) for k in ("batch_size", "eval_rows") if getattr(settings, k)}
  return TrialData(dataclasses.replace(task, **overrides) if overrides else task)


def row_optimizer(settings) -> row_optimizers.RowOptimizer:
  """The row optimizer `settings.embedding_optimizer` at `settings.embedding_lr` (trainer defaults else)."""
  return row_optimizers.make(settings.embedding_optimizer, settings.embedding_lr,
                             defaults_lib.ctr_defaults().embedding)


class ModelState(NamedTuple):
  """Everything a structure-search model carries between steps.

  Attributes:
    step: int32 scalar, train steps taken.
    params: dict group name -> dense parameter pytree.
    opt_state: dict group name -> optimizer state (groups without an optimizer: absent).
    table: the embedding `TableState` (values [V, E], opt_slots [V, S]).
    stats: non-trained state updated by the forward pass (e.g. batch-norm moments).
  """

  step: jax.Array
  params: dict
  opt_state: dict
  table: device_table.TableState
  stats: Any


class Phase(NamedTuple):
  """One update inside a train step.

  Attributes:
    groups: parameter groups differentiated and updated (each has an optimizer).
    train_rows: whether the embedding rows are updated too.
  """

  groups: tuple[str, ...]
  train_rows: bool


def init_state(params: Mapping[str, Any], stats: Any, optimizers: Mapping[str, optax.GradientTransformation],
               row_opt: row_optimizers.RowOptimizer, num_rows: int, width: int, *, seed: int,
               init_stddev: float) -> ModelState:
  """A fresh state; the table is `device_table.init_table` (counter-based rows of `seed`).

  Args:
    params: group name -> dense parameter pytree.
    stats: initial non-trained state.
    optimizers: group name -> optax transformation (groups that are never trained omitted).
    row_opt: the embedding row optimizer.
    num_rows: V, table rows.
    width: E, the table width.
    seed: table seed.
    init_stddev: standard deviation of the initial rows.
  """
  unknown = sorted(set(optimizers) - set(params))
  if unknown:
    raise ValueError(f"optimizers for unknown parameter groups {unknown} (groups: {sorted(params)})")
  params = {k: jax.tree.map(jnp.asarray, v) for k, v in params.items()}
  opt_state = {k: tx.init(params[k]) for k, tx in optimizers.items()}
  table = device_table.init_table(num_rows, width, row_opt, seed=seed, stddev=init_stddev)
  return ModelState(jnp.zeros((), jnp.int32), params, opt_state, table, jax.tree.map(jnp.asarray, stats))


def make_train_step(forward: Forward, optimizers: Mapping[str, optax.GradientTransformation],
                    row_opt: row_optimizers.RowOptimizer, phases: Sequence[Phase]):
  """Builds the un-jitted `step(state, batch, key) -> (state, loss)` (loss of the last phase).

  Phase i draws its randomness from `fold_in(key, i)`; the caller passes a key per step.
  """
  phases = tuple(phases)
  if not phases:
    raise ValueError("make_train_step needs at least one phase")
  for phase in phases:
    missing = [g for g in phase.groups if g not in optimizers]
    if missing:
      raise ValueError(f"phase {phase} trains groups without an optimizer: {missing}")

  def run_phase(state: ModelState, batch: DeviceBatch, key, phase: Phase):
    uniq = device_table.gather_rows(state.table, batch.rows)  # [U, E], [U, S]
    trained = {g: state.params[g] for g in phase.groups}

    def objective(trained, values):
      emb = jnp.take(values, batch.vids, axis=0)  # [B, F, E]
      logits, stats = forward({**state.params, **trained}, state.stats, emb, batch.dense, batch.mask,
                              key, True)
      return masked_loss(logits, batch.labels, batch.mask), stats

    (loss, stats), (grads, row_grads) = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
        trained, uniq.values)
    params, opt_state = dict(state.params), dict(state.opt_state)
    for g in phase.groups:
      updates, opt_state[g] = optimizers[g].update(grads[g], state.opt_state[g], trained[g])
      params[g] = optax.apply_updates(trained[g], updates)
    table = state.table
    if phase.train_rows:
      values, slots = row_opt.update(uniq.values, uniq.opt_slots, row_grads, state.step + 1)
      table = device_table.scatter_rows(table, batch.rows, device_table.TableState(values, slots))
    return ModelState(state.step, params, opt_state, table, stats), loss

  def step(state: ModelState, batch: DeviceBatch, key):
    loss = jnp.zeros((), jnp.float32)
    for i, phase in enumerate(phases):
      state, loss = run_phase(state, batch, jax.random.fold_in(key, i), phase)
    return state._replace(step=state.step + 1), loss

  return step


def make_runner(step_fn):
  """Jitted `run(state, batches [T], key) -> (state, losses [T])`: a `lax.scan` of `step_fn`.

  Step t uses `fold_in(key, state.step)`, so a run split into windows draws the
  same keys as one long run. The state is donated.
  """

  def run(state, batches, key):
    def body(state, batch):
      new_state, loss = step_fn(state, batch, jax.random.fold_in(key, state.step))
      return new_state, loss

    return lax.scan(body, state, batches)

  return jax.jit(run, donate_argnums=0)


def train(state: ModelState, data: TrialData, runner, key, start: int, end: int,
          window: int = 256) -> tuple[ModelState, np.ndarray]:
  """Runs steps `[start, end)` of `data` in windows of at most `window` steps.

  Returns:
    The state and the [end - start] per-step losses (host).
  """
  losses = []
  for lo in range(start, end, window):
    hi = min(end, lo + window)
    state, loss = runner(state, data.train_steps(lo, hi), key)
    losses.append(np.asarray(loss))
  return state, (np.concatenate(losses) if losses else np.zeros(0, np.float32))


@functools.partial(jax.jit, static_argnums=0)
def _eval_logits(forward: Forward, state: ModelState, eval_batches: DeviceBatch, key):
  def one(batch):
    uniq = jnp.take(state.table.values, batch.rows, axis=0, mode="fill", fill_value=0)
    emb = jnp.take(uniq, batch.vids, axis=0)
    logits, _ = forward(state.params, state.stats, emb, batch.dense, batch.mask, key, False)
    return logits

  return lax.map(one, eval_batches).reshape(-1)


def eval_logits(forward: Forward, state: ModelState, data: TrialData, key=None) -> np.ndarray:
  """[Te * Be] host logits of the task's stacked eval set (train=False forward)."""
  key = jax.random.key(0) if key is None else key
  return np.asarray(_eval_logits(forward, state, data.eval_batches, key))


def split_metrics(data: TrialData, logits: np.ndarray) -> dict[str, float]:
  """Exact AUC / logloss on the valid (first) and test (second) halves of the eval rows.

  Returns:
    {'valid_auc', 'valid_logloss', 'test_auc', 'test_logloss'}.
  """
  valid, test = split_eval_mask(data.eval_mask)
  probs = metrics_lib.sigmoid(logits)
  out = {}
  for name, mask in (("valid", valid), ("test", test)):
    out[f"{name}_auc"] = metrics_lib.auc(data.eval_labels, logits, mask)
    out[f"{name}_logloss"] = metrics_lib.logloss(data.eval_labels, probs, mask)
  return out


def mlp_init(key, dims: Sequence[int]) -> list[dict[str, jax.Array]]:
  """Layers of an MLP with widths `dims` (input first): He-normal kernels, zero biases."""
  layers = []
  for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
    w = jax.random.normal(jax.random.fold_in(key, i), (d_in, d_out), jnp.float32) * np.sqrt(2.0 / d_in)
    layers.append({"w": w, "b": jnp.zeros((d_out,), jnp.float32)})
  return layers


def mlp_apply(layers: Sequence[Mapping[str, jax.Array]], x: jax.Array) -> jax.Array:
  """x [B, D_0] -> [B, D_last]: ReLU between layers, none after the last."""
  for i, layer in enumerate(layers):
    x = x @ layer["w"] + layer["b"]
    if i + 1 < len(layers):
      x = jax.nn.relu(x)
  return x
