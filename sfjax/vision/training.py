"""One classifier recipe for every image step: `fit` (pure, jit/vmap-able) and `accuracy`.

`fit` is a whole training as one function of (params, data, hyperparameters, key):
batches drawn with `fold_in(key, step)`, AdamW with injected (traceable)
learning rate and weight decay, optional augmentation `augment(key, x, step)`.
So HPO and PBT vmap it over candidates (purejaxrl's `make_train` style).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

ApplyFn = Callable[[dict, jax.Array], jax.Array]  # (params, [B, H, W, C]) -> [B, classes]
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


def make_optimizer(learning_rate, weight_decay) -> optax.GradientTransformation:
  """AdamW whose hyperparameters live in its state (traced, vmappable)."""
  return optax.inject_hyperparams(optax.adamw)(learning_rate=learning_rate,
                                               weight_decay=weight_decay)


def fit(apply_fn: ApplyFn, params, images: jax.Array, labels: jax.Array, steps: int,
        batch_size: int, learning_rate, weight_decay, key: jax.Array,
        augment: AugmentFn | None = None, start_step=0):
  """Trains `params` for `steps` AdamW steps on random batches from a fresh optimizer; pure.

  Args:
    apply_fn: (params, x [B, H, W, C]) -> logits [B, K].
    params: the initial parameters.
    images: [N, H, W, C]; labels: [N] int.
    steps, batch_size: static.
    learning_rate, weight_decay: scalars (may be traced).
    key: PRNG key of the batches and augmentations.
    augment: optional (key, x [B, H, W, C], step) -> x, applied to every batch.
    start_step: the global step of the first step (augmentation schedules).

  Returns:
    (params, losses [steps]).
  """
  opt_state = make_optimizer(learning_rate, weight_decay).init(params)
  params, _, losses = fit_from(apply_fn, params, opt_state, images, labels, steps, batch_size,
                               key, augment, start_step)
  return params, losses


def fit_from(apply_fn: ApplyFn, params, opt_state, images: jax.Array, labels: jax.Array,
             steps: int, batch_size: int, key: jax.Array, augment: AugmentFn | None = None,
             start_step=0):
  """`fit` continuing from an optimizer state of `make_optimizer` (its hyperparameters
  travel in the state), so training can run in intervals (PBT).

  Returns:
    (params, opt_state, losses [steps]).
  """
  tx = make_optimizer(0.0, 0.0)  # the update reads the injected values from opt_state
  images, labels = jnp.asarray(images), jnp.asarray(labels)
  n = images.shape[0]

  def loss_fn(p, x, y):
    return cross_entropy(apply_fn(p, x), y)

  def body(carry, step):
    p, opt_state = carry
    batch_key, aug_key = jax.random.split(jax.random.fold_in(key, step))
    idx = jax.random.randint(batch_key, (batch_size,), 0, n)
    x, y = images[idx], labels[idx]
    if augment is not None:
      x = augment(aug_key, x, step)
    loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
    updates, opt_state = tx.update(grads, opt_state, p)
    return (optax.apply_updates(p, updates), opt_state), loss

  steps_axis = jnp.arange(steps) + start_step
  (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), steps_axis)
  return params, opt_state, losses


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
