"""Pure image layers on NHWC arrays: convolutions, pooling, batch norm, initialisers.

Parameters are plain dicts of arrays (pytrees), so whole trainings are jittable
and vmappable over candidates (`training.fit`); no module state: batch-norm
statistics are an explicit pytree passed in and returned (`batch_norm`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_DIMS = ("NHWC", "HWIO", "NHWC")


def conv2d(x: jax.Array, w: jax.Array, groups: int = 1) -> jax.Array:
  """'SAME' stride-1 convolution.

  Args:
    x: [B, H, W, Cin].
    w: [k, k, Cin / groups, Cout].
    groups: feature groups (Cin for a depthwise convolution).

  Returns:
    [B, H, W, Cout].
  """
  return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=_DIMS,
                                      feature_group_count=groups)


def max_pool(x: jax.Array, size: int = 3, stride: int = 1) -> jax.Array:
  """'SAME' max pooling of [B, H, W, C] (stride 1 keeps the shape)."""
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, size, size, 1),
                               (1, stride, stride, 1), "SAME")


def avg_pool(x: jax.Array, size: int = 3, stride: int = 1) -> jax.Array:
  """'SAME' average pooling of [B, H, W, C], padding not counted (as DARTS)."""
  window, strides = (1, size, size, 1), (1, stride, stride, 1)
  total = jax.lax.reduce_window(x, 0.0, jax.lax.add, window, strides, "SAME")
  count = jax.lax.reduce_window(jnp.ones_like(x[:1, :, :, :1]), 0.0, jax.lax.add, window,
                                strides, "SAME")
  return total / count


def he_normal(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
  """[shape] float32 He-normal weights for `fan_in` inputs."""
  return jax.random.normal(key, shape, jnp.float32) * jnp.sqrt(2.0 / fan_in)


def dense_init(key: jax.Array, n_in: int, n_out: int) -> dict:
  """{'w': [n_in, n_out], 'b': [n_out]} of a dense layer."""
  return {"w": he_normal(key, (n_in, n_out), n_in), "b": jnp.zeros((n_out,), jnp.float32)}


def conv_init(key: jax.Array, c_in: int, c_out: int, k: int = 3) -> dict:
  """{'w': [k, k, c_in, c_out], 'b': [c_out]} of a convolution."""
  return {"w": he_normal(key, (k, k, c_in, c_out), k * k * c_in),
          "b": jnp.zeros((c_out,), jnp.float32)}


def num_params(params) -> int:
  """The number of scalars in the pytree `params`."""
  return int(sum(leaf.size for leaf in jax.tree_util.tree_leaves(params)))


def batch_norm_init(channels: int) -> tuple[dict, dict]:
  """A batch norm's (params {'scale', 'bias'} [C], statistics {'mean', 'var'} [C]).

  The statistics are non-parameter state (`DenseState.model_state`): no gradient
  reaches them; the train-mode forward pass moves them.
  """
  ones, zeros = jnp.ones((channels,), jnp.float32), jnp.zeros((channels,), jnp.float32)
  return {"scale": ones, "bias": zeros}, {"mean": zeros, "var": ones}


def batch_norm(params: dict, stats: dict, x: jax.Array, train: bool, momentum: float = 0.9,
               eps: float = 1e-5) -> tuple[jax.Array, dict]:
  """Batch normalisation of x [..., C] over every axis but the last (Ioffe & Szegedy 2015).

  Train mode normalises by the batch's mean and variance and returns the
  statistics moved towards them (`momentum * old + (1 - momentum) * batch`,
  variance unbiased, gradient stopped); eval mode normalises by the running
  statistics and returns them unchanged.

  Returns:
    (y [..., C], statistics).
  """
  if train:
    axes = tuple(range(x.ndim - 1))
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    n = x.size // x.shape[-1]
    batch = jax.lax.stop_gradient({"mean": mean, "var": var * n / max(n - 1, 1)})
    stats = jax.tree.map(lambda old, new: momentum * old + (1.0 - momentum) * new, stats, batch)
  else:
    mean, var = stats["mean"], stats["var"]
  y = (x - mean) * jax.lax.rsqrt(var + eps) * params["scale"] + params["bias"]
  return y, stats
