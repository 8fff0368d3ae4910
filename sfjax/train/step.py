"""The jitted CTR train and eval steps (on-device embedding table).

One step: gather the batch's unique rows `[U, E]`, look up `rows[vids]` as
`[B, F, E]`, forward/backward, take the gradient w.r.t. the `[U, E]` unique
rows only (never a dense gradient over the table), apply the row optimizer to
those rows and scatter them back; dense parameters go through optax.

Under `jax.jit` with a batch sharded over the mesh axis 'data' and the table
replicated, XLA sums the `[U, E]` row gradient across devices with one
all-reduce: the device collective replaces a CPU parameter server (SFCTR sync).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from sfjax.embedding import device_table
from sfjax.embedding import row_optimizers
from sfjax.train import state as state_lib

Metrics = dict[str, jax.Array]


def forward_logits(graphdef: nnx.GraphDef, params: Any, uniq_values: jax.Array,
                   batch: state_lib.DeviceBatch) -> jax.Array:
  """Model logits `[B]` from the batch's unique rows `[U, E]` and virtual ids."""
  model = nnx.merge(graphdef, params)
  emb = jnp.take(uniq_values, batch.vids, axis=0)  # [B, F, E]
  return model(emb, batch.dense)


def masked_loss(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean sigmoid cross-entropy over real (mask = 1) examples."""
  per_example = optax.sigmoid_binary_cross_entropy(logits, labels)
  return jnp.sum(per_example * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def loss_and_grads(graphdef: nnx.GraphDef, params: Any, uniq_values: jax.Array,
                   batch: state_lib.DeviceBatch, l2: float):
  """Loss and gradients w.r.t. dense params and the `[U, E]` unique rows.

  Returns:
    (loss, logits), (param_grads, row_grads [U, E]).
  """

  def objective(p, values):
    logits = forward_logits(graphdef, p, values, batch)
    loss = masked_loss(logits, batch.labels, batch.mask)
    # Padding rows read as zeros, so they add nothing to the penalty.
    return loss + l2 * jnp.sum(values * values), (loss, logits)

  (_, (loss, logits)), grads = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(
      params, uniq_values)
  return (loss, logits), grads


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation,
                    row_opt: row_optimizers.RowOptimizer, *, l2: float = 0.0
                    ) -> Callable[[state_lib.TrainState, state_lib.DeviceBatch],
                                  tuple[state_lib.TrainState, Metrics]]:
  """Builds the un-jitted step `(state, batch) -> (state, metrics)`; see `jit_train_step`."""

  def train_step(state: state_lib.TrainState, batch: state_lib.DeviceBatch):
    uniq = device_table.gather_rows(state.table, batch.rows)  # [U, E], [U, S]
    (loss, _), (param_grads, row_grads) = loss_and_grads(
        graphdef, state.params, uniq.values, batch, l2)
    count = state.step + 1
    new_values, new_slots = row_opt.update(uniq.values, uniq.opt_slots, row_grads, count)
    table = device_table.scatter_rows(
        state.table, batch.rows, device_table.TableState(new_values, new_slots))
    updates, opt_state = tx.update(param_grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = state_lib.TrainState(count, params, opt_state, table)
    return new_state, {"loss": loss}

  return train_step


def jit_train_step(step_fn, state_sharding=None, batch_sharding=None):
  """`jax.jit` of a train step with the state donated (no table copy per step)."""
  if state_sharding is None:
    return jax.jit(step_fn, donate_argnums=0)
  return jax.jit(step_fn, donate_argnums=0, in_shardings=(state_sharding, batch_sharding),
                 out_shardings=(state_sharding, None))


def make_eval_step(graphdef: nnx.GraphDef):
  """Jitted `(params, table, batch) -> logits [B]`."""

  def eval_step(params, table: device_table.TableState, batch: state_lib.DeviceBatch):
    values = jnp.take(table.values, batch.rows, axis=0, mode="fill", fill_value=0)
    return forward_logits(graphdef, params, values, batch)

  return jax.jit(eval_step)
