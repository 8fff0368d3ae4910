"""One classifier recipe for every image step, trained through the shared dense step.

A training is `train_steps`: a `lax.scan` of `sfjax.train.step.make_dense_train_step`
(loss -> grads -> optax update -> metrics; the same update the CTR step uses)
over batches drawn with `fold_in(key, state.step)`, with an optional augmentation
`augment(key, x, step)` applied to each batch before the step. The state is a
`DenseState`: parameters, AdamW state with injected (traceable) learning rate and
weight decay, and non-parameter `model_state` (batch-norm statistics,
`conv_layers.batch_norm`). A whole training is one pure function, so HPO and PBT
vmap it over candidates (purejaxrl's `make_train` style); `fit` is the stateless
shortcut. A single step jits with its state donated: `_make_train_step` +
`sfjax.train.step.jit_train_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from sfjax.train import step as step_lib
from sfjax.train.state import DenseState

ApplyFn = Callable[[Any, jax.Array], jax.Array]  # (params, [B, H, W, C]) -> [B, classes]
# (params, model_state, x [B, H, W, C], train) -> (logits [B, classes], model_state)
_StatefulApplyFn = Callable[[Any, Any, jax.Array, bool], tuple[jax.Array, Any]]
AugmentFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]  # (key, x, step) -> x


class Recipe(NamedTuple):
  """A training recipe.

  Attributes:
    steps: optimizer steps.
    batch_size: images per step (drawn with replacement).
    learning_rate, weight_decay: AdamW's.
  """

  steps: int
  batch_size: int
  learning_rate: float
  weight_decay: float


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy of logits [B, K] against int labels [B]."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _make_optimizer(learning_rate, weight_decay) -> optax.GradientTransformation:
  """AdamW whose hyperparameters live in its state (traced, vmappable)."""
  return optax.inject_hyperparams(optax.adamw)(learning_rate=learning_rate,
                                               weight_decay=weight_decay)


def classifier_loss(apply_fn: ApplyFn) -> step_lib.DenseLossFn:
  """The dense step's loss of a stateless classifier: batch (x [B, H, W, C], y [B])."""

  def loss_fn(params, model_state, batch):
    x, y = batch
    return cross_entropy(apply_fn(params, x), y), model_state

  return loss_fn


def _stateful_classifier_loss(apply_fn: _StatefulApplyFn) -> step_lib.DenseLossFn:
  """The dense step's loss of a classifier with non-parameter state (train mode)."""

  def loss_fn(params, model_state, batch):
    x, y = batch
    logits, model_state = apply_fn(params, model_state, x, True)
    return cross_entropy(logits, y), model_state

  return loss_fn


def init_dense_state(params, learning_rate, weight_decay, model_state=()) -> DenseState:
  """A fresh `DenseState`: step 0, `_make_optimizer`'s state (it carries the hyperparameters)."""
  opt_state = _make_optimizer(learning_rate, weight_decay).init(params)
  return DenseState(jnp.zeros((), jnp.int32), params, opt_state, model_state)


def _make_train_step(loss_fn: step_lib.DenseLossFn) -> Callable:
  """`step(state: DenseState, batch) -> (state, {'loss'})` with `init_dense_state`'s optimizer.

  The update reads the learning rate and weight decay injected into `state.opt_state`.
  """
  return step_lib.make_dense_train_step(loss_fn, _make_optimizer(0.0, 0.0))


def _draw_batch(key: jax.Array, images: jax.Array, labels: jax.Array, batch_size: int, step,
                augment: AugmentFn | None = None) -> tuple[jax.Array, jax.Array]:
  """Batch `step`'s (x [B, H, W, C], y [B]): drawn with replacement by `fold_in(key, step)`,
  then augmented with the second half of that key."""
  batch_key, aug_key = jax.random.split(jax.random.fold_in(key, step))
  idx = jax.random.randint(batch_key, (batch_size,), 0, images.shape[0])
  x, y = images[idx], labels[idx]
  if augment is not None:
    x = augment(aug_key, x, step)
  return x, y


def train_steps(loss_fn: step_lib.DenseLossFn, state: DenseState, images: jax.Array,
                labels: jax.Array, steps: int, batch_size: int, key: jax.Array,
                augment: AugmentFn | None = None) -> tuple[DenseState, jax.Array]:
  """`steps` shared dense steps from `state` on batches of `_draw_batch`; pure.

  Batch i of the run is drawn at global step `state.step + i`, so training in
  intervals (PBT) sees the same batches as one run.

  Args:
    loss_fn: `classifier_loss(apply_fn)` or `_stateful_classifier_loss(apply_fn)`.
    state: from `init_dense_state` (or a previous `train_steps`).
    images: [N, H, W, C]; labels: [N] int.
    steps, batch_size: static.
    key: PRNG key of the batches and augmentations.
    augment: optional (key, x [B, H, W, C], step) -> x, applied to every batch.

  Returns:
    (state, losses [steps]).
  """
  step_fn = _make_train_step(loss_fn)
  images, labels = jnp.asarray(images), jnp.asarray(labels)

  def body(s, _):
    s, metrics = step_fn(s, _draw_batch(key, images, labels, batch_size, s.step, augment))
    return s, metrics["loss"]

  return jax.lax.scan(body, state, None, length=steps)


def fit(apply_fn: ApplyFn, params, images: jax.Array, labels: jax.Array, steps: int,
        batch_size: int, learning_rate, weight_decay, key: jax.Array,
        augment: AugmentFn | None = None):
  """Trains `params` for `steps` AdamW steps from a fresh optimizer (`train_steps`); pure.

  Args:
    apply_fn: (params, x [B, H, W, C]) -> logits [B, K].
    params: the initial parameters.
    images: [N, H, W, C]; labels: [N] int.
    steps, batch_size: static.
    learning_rate, weight_decay: scalars (may be traced).
    key: PRNG key of the batches and augmentations.
    augment: optional (key, x [B, H, W, C], step) -> x, applied to every batch.

  Returns:
    (params, losses [steps]).
  """
  state, losses = train_steps(classifier_loss(apply_fn),
                              init_dense_state(params, learning_rate, weight_decay), images, labels,
                              steps, batch_size, key, augment)
  return state.params, losses


def accuracy(apply_fn: ApplyFn, params, images: jax.Array, labels: jax.Array) -> jax.Array:
  """Share of `images` [N, H, W, C] whose argmax logit is the label [N]; a scalar."""
  return jnp.mean(jnp.argmax(apply_fn(params, images), axis=-1) == labels)


def fit_and_score(apply_fn: ApplyFn, params, splits, recipe: Recipe, seed: int,
                  augment: AugmentFn | None = None) -> tuple[dict, dict]:
  """Trains with `recipe` on the train split (jitted once), scores valid and test.

  Returns:
    (trained params, {'valid_accuracy', 'test_accuracy', 'final_loss'} as floats).
  """
  train = jax.jit(lambda p, x, y, lr, wd, k: fit(apply_fn, p, x, y, recipe.steps,
                                                  recipe.batch_size, lr, wd, k, augment))
  params, losses = train(params, splits.train_x, splits.train_y, recipe.learning_rate,
                         recipe.weight_decay, jax.random.key(seed))
  score = jax.jit(lambda p, x, y: accuracy(apply_fn, p, x, y))
  return params, {"valid_accuracy": float(score(params, splits.valid_x, splits.valid_y)),
                  "test_accuracy": float(score(params, splits.test_x, splits.test_y)),
                  "final_loss": float(losses[-10:].mean())}
