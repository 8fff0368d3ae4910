"""PBA's search: PBT over a vmapped population of (weights, optimizer, policy).

Every member trains `interval_steps` with its own policy (one `jax.vmap` of
`training.train_steps`, the shared dense step, over the population), is scored on
the valid split, then:

  exploit  the bottom `fraction` copy the top `fraction` (training state: weights,
           optimizer state, step; policy, policy history): a gather along the trial axis;
  explore  the copies' policies are perturbed (`augment.explore`).

The result is the best final member's policy history: a schedule `[T, K, 2]`
(Ho et al. 2019, arXiv 1905.05393), which `fully_train` stretches over its run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.automl.algorithms.pbt import exploit_sources, gather_members
from sfjax.vision import augment, training


class PBAResult(NamedTuple):
  """A finished PBA search.

  Attributes:
    schedule: [T, K, 2] int32 levels of the best member's policy per interval.
    valid_accuracy: [T, P] members' valid accuracy after each interval.
    best_valid_accuracy: the best member's at the end.
  """

  schedule: np.ndarray
  valid_accuracy: np.ndarray
  best_valid_accuracy: float


def pba_search(init_fn: Callable, apply_fn: training.ApplyFn, splits, population: int,
               intervals: int, interval_steps: int, batch_size: int, learning_rate: float,
               weight_decay: float, seed: int, fraction: float = 0.25) -> PBAResult:
  """Runs PBA; see the module docstring.

  Args:
    init_fn: key -> params of the model trained.
    apply_fn: (params, x) -> logits.
    splits: `image_data.ImageSplits` (train trains, valid scores).
    population, intervals, interval_steps, batch_size: sizes.
    learning_rate, weight_decay: of every member.
    seed: initial weights, policies, batches and explore.
    fraction: share of the population exploited per interval.
  """
  if population < 2 or intervals < 1 or interval_steps < 1:
    raise ValueError(f"pba_search: population >= 2, intervals >= 1 and interval_steps >= 1, got "
                     f"{population}, {intervals}, {interval_steps}")
  rng = np.random.default_rng(seed)
  key = jax.random.key(seed)
  params = jax.vmap(init_fn)(jax.random.split(key, population))
  states = jax.vmap(lambda p: training.init_dense_state(p, learning_rate, weight_decay))(params)
  loss_fn = training.classifier_loss(apply_fn)
  policies = augment.random_policies(rng, population)
  history = np.zeros((population, intervals) + policies.shape[1:], np.int32)

  def member(state, policy, k, x, y):
    def aug(key, images, step):
      return augment.apply_policy(key, images, policy)

    return training.train_steps(loss_fn, state, x, y, interval_steps, batch_size, k, aug)[0]

  train = jax.jit(jax.vmap(member, in_axes=(0, 0, 0, None, None)))
  score = jax.jit(jax.vmap(lambda p, x, y: training.accuracy(apply_fn, p, x, y),
                           in_axes=(0, None, None)))
  accs = []
  for t in range(intervals):
    history[:, t] = policies
    keys = jax.random.split(jax.random.fold_in(key, t + 1), population)
    states = train(states, jnp.asarray(policies), keys, splits.train_x, splits.train_y)
    acc = np.asarray(score(states.params, splits.valid_x, splits.valid_y))
    accs.append(acc)
    if t < intervals - 1:
      idx = exploit_sources(acc, fraction)  # the i-th worst copies the i-th best
      states = gather_members(states, idx)
      policies, history, acc = policies[idx], history[idx], acc[idx]
      policies = augment.explore(rng, policies, idx != np.arange(population))
  best = int(np.argmax(accs[-1]))
  return PBAResult(history[best], np.stack(accs), float(accs[-1][best]))
