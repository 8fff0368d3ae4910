"""Augmentation ops by hand, policy sampling, schedule lookup, explore."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from sfjax.vision import augment

IMAGE = jnp.arange(25.0).reshape(5, 5, 1) / 25.0


def test_affine_identity_shift_and_quarter_turn():
  same = augment._affine_resample(IMAGE, jnp.eye(2), jnp.zeros(2))
  np.testing.assert_allclose(same, IMAGE, atol=1e-6)
  shifted = augment._affine_resample(IMAGE, jnp.eye(2), jnp.array([0.0, 1.0]))  # reads col + 1
  np.testing.assert_allclose(shifted[:, :4, 0], IMAGE[:, 1:, 0], atol=1e-6)
  np.testing.assert_allclose(shifted[:, 4, 0], 0.0)
  quarter = augment._affine_resample(IMAGE, jnp.array([[0.0, -1.0], [1.0, 0.0]]), jnp.zeros(2))
  np.testing.assert_allclose(quarter[:, :, 0], np.rot90(np.asarray(IMAGE[:, :, 0]), -1), atol=1e-5)


def test_cutout_noise_and_zero_magnitude():
  key = jax.random.key(0)
  cut = augment._apply_op("cutout", key, jnp.ones((8, 8, 1)), 1.0)
  rows, cols = np.nonzero(np.asarray(cut[:, :, 0]) == 0)
  # a square of side round(8 / 2) = 4, clipped at the border: a filled rectangle
  assert 0 < len(rows) <= 16 and len(rows) == len(set(rows)) * len(set(cols))
  assert len(set(rows)) <= 4 and len(set(cols)) <= 4
  for name in augment.AUG_OPS:
    np.testing.assert_allclose(augment._apply_op(name, key, IMAGE, 0.0), IMAGE, atol=1e-6)
  noisy = augment._apply_op("noise", key, IMAGE, 1.0)
  assert 0.0 <= float(noisy.min()) and float(noisy.max()) <= 1.0
  assert not np.allclose(noisy, IMAGE)


def test_policy_probabilities_are_sampled_per_image():
  images = jnp.ones((400, 8, 8, 1))
  policy = jnp.array([[0, 0], [0, 0], [0, 0], [5, 9]])  # cutout with p = 0.5 at full size
  out = jax.jit(augment.apply_policy)(jax.random.key(1), images, policy)
  changed = np.asarray((out != 1.0).any(axis=(1, 2, 3))).mean()
  assert 0.4 < changed < 0.6
  never = augment.apply_policy(jax.random.key(1), images, jnp.zeros((4, 2), jnp.int32))
  np.testing.assert_allclose(never, images)


def test_schedule_lookup_and_explore():
  schedule = jnp.arange(3 * 4 * 2).reshape(3, 4, 2)
  assert [int(augment._policy_at(schedule, s, 30)[0, 0]) for s in (0, 9, 10, 29, 40)] == \
      [0, 0, 8, 16, 16]
  rng = np.random.default_rng(0)
  policies = augment.random_policies(rng, 6)
  chex.assert_shape(policies, (6, 4, 2))
  assert policies.max() <= 3
  which = np.array([True, False, True, False, False, False])
  explored = augment.explore(rng, policies, which)
  np.testing.assert_array_equal(explored[~which], policies[~which])
  assert (explored[..., 0] <= augment.PROB_LEVELS).all() and explored.min() >= 0
  assert not np.array_equal(explored[which], policies[which])
