"""PBA-style augmentation: per-op probability and magnitude, scheduled over training.

Population Based Augmentation (Ho et al. 2019, arXiv 1905.05393): a policy gives
each op of `AUG_OPS` a probability level (0..PROB_LEVELS, p = level / PROB_LEVELS)
and a magnitude level (0..MAG_LEVELS, m = level / MAG_LEVELS); a schedule is one
policy per interval of training, `[T, len(AUG_OPS), 2]` int32. Each image of a
batch gets each op independently with its probability (ops applied in order):

  shift    translation by up to m * MAX_SHIFT of the side each way  (affine, bilinear)
  rotate   rotation by up to m * MAX_DEGREES each way about the centre (affine, bilinear)
  noise    Gaussian noise of std m * NOISE_STD, clipped to [0, 1]
  cutout   a zeroed square of side round(m * side / 2) at a random centre

Everything is jnp, per image, so a population's policies are vmapped (`population`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

AUG_OPS = ("shift", "rotate", "noise", "cutout")
PROB_LEVELS, MAG_LEVELS = 10, 9
MAX_SHIFT, MAX_DEGREES, NOISE_STD = 0.25, 30.0, 0.2


def _affine_resample(image: jax.Array, matrix: jax.Array, offset: jax.Array) -> jax.Array:
  """image [H, W, C] sampled at `matrix @ (p - centre) + centre + offset` per output pixel p.

  Bilinear; outside the image reads 0. matrix [2, 2], offset [2] in pixels (row, col).
  """
  h, w = image.shape[:2]
  centre = jnp.array([(h - 1) / 2.0, (w - 1) / 2.0])
  rows, cols = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32),
                            indexing="ij")
  points = jnp.stack([rows.ravel(), cols.ravel()]) - centre[:, None]  # [2, H*W]
  source = matrix @ points + (centre + offset)[:, None]

  def sample(ch):
    return jax.scipy.ndimage.map_coordinates(ch, list(source), order=1, mode="constant",
                                             cval=0.0).reshape(h, w)

  return jax.vmap(sample, in_axes=2, out_axes=2)(image)


def _shift(key, image, m):
  side = jnp.array(image.shape[:2], jnp.float32)
  offset = jax.random.uniform(key, (2,), minval=-1.0, maxval=1.0) * m * MAX_SHIFT * side
  return _affine_resample(image, jnp.eye(2), offset)


def _rotate(key, image, m):
  angle = jax.random.uniform(key, (), minval=-1.0, maxval=1.0) * m * jnp.deg2rad(MAX_DEGREES)
  c, s = jnp.cos(angle), jnp.sin(angle)
  return _affine_resample(image, jnp.array([[c, -s], [s, c]]), jnp.zeros(2))


def _noise(key, image, m):
  return jnp.clip(image + jax.random.normal(key, image.shape) * m * NOISE_STD, 0.0, 1.0)


def _cutout(key, image, m):
  h, w = image.shape[:2]
  half = jnp.round(m * min(h, w) / 2.0) / 2.0
  centre = jax.random.uniform(key, (2,)) * jnp.array([h, w], jnp.float32)
  rows = jnp.arange(h, dtype=jnp.float32)[:, None] + 0.5
  cols = jnp.arange(w, dtype=jnp.float32)[None, :] + 0.5
  inside = (jnp.abs(rows - centre[0]) < half) & (jnp.abs(cols - centre[1]) < half)
  return jnp.where(inside[:, :, None], 0.0, image)


_APPLY = {"shift": _shift, "rotate": _rotate, "noise": _noise, "cutout": _cutout}


def _apply_op(name: str, key: jax.Array, image: jax.Array, magnitude) -> jax.Array:
  """Op `name` at magnitude in [0, 1] on one image [H, W, C]."""
  return _APPLY[name](key, image, magnitude)


def apply_policy(key: jax.Array, images: jax.Array, policy: jax.Array) -> jax.Array:
  """Each image of [B, H, W, C] gets each op with the policy's probability.

  Args:
    policy: [len(AUG_OPS), 2] int levels (probability, magnitude).
  """
  probs = policy[:, 0].astype(jnp.float32) / PROB_LEVELS
  mags = policy[:, 1].astype(jnp.float32) / MAG_LEVELS

  def one(k, image):
    keys = jax.random.split(k, 2 * len(AUG_OPS))
    for i, name in enumerate(AUG_OPS):
      changed = _apply_op(name, keys[2 * i], image, mags[i])
      image = jnp.where(jax.random.uniform(keys[2 * i + 1]) < probs[i], changed, image)
    return image

  return jax.vmap(one)(jax.random.split(key, images.shape[0]), images)


def _policy_at(schedule: jax.Array, step, total_steps: int) -> jax.Array:
  """The policy [K, 2] of `schedule` [T, K, 2] at `step` of `total_steps` (T equal intervals)."""
  t = schedule.shape[0]
  return schedule[jnp.clip(step * t // total_steps, 0, t - 1)]


def schedule_augment(schedule, total_steps: int):
  """`augment(key, x, step)` for `training.fit` following `schedule` [T, K, 2] over
  `total_steps` (the schedule is stretched to the training length)."""
  schedule = jnp.asarray(schedule, jnp.int32)
  return lambda key, x, step: apply_policy(key, x, _policy_at(schedule, step, total_steps))


def random_policies(rng: np.random.Generator, n: int, max_prob_level: int = 3,
                    max_mag_level: int = 3) -> np.ndarray:
  """[n, K, 2] initial policies; PBA starts near no augmentation (small levels)."""
  probs = rng.integers(0, max_prob_level + 1, (n, len(AUG_OPS)))
  mags = rng.integers(0, max_mag_level + 1, (n, len(AUG_OPS)))
  return np.stack([probs, mags], axis=-1).astype(np.int32)


def explore(rng: np.random.Generator, policies: np.ndarray, which: np.ndarray,
            resample_prob: float = 0.2) -> np.ndarray:
  """PBA's explore on the rows `which` [P] bool of policies [P, K, 2]: each level is
  redrawn uniformly with `resample_prob`, else moved by -1, 0 or +1, and clipped."""
  out = policies.copy()
  limits = np.array([PROB_LEVELS, MAG_LEVELS])
  moved = policies + rng.integers(-1, 2, policies.shape)
  redrawn = rng.integers(0, limits + 1, policies.shape)
  new = np.where(rng.random(policies.shape) < resample_prob, redrawn, moved)
  new = np.clip(new, 0, limits)
  out[which] = new[which]
  return out.astype(np.int32)
