"""DARTS' candidate operations and the mixed op (Liu et al. 2019, arXiv 1806.09055).

Every op maps [B, H, W, C] -> [B, H, W, C] (stride 1, so a cell keeps its shape):

  conv_3x3       relu -> 3x3 conv
  sep_conv_3x3   relu -> 3x3 depthwise conv -> 1x1 pointwise conv
  max_pool_3x3   3x3 max pooling;  avg_pool_3x3   3x3 average pooling (padding not counted)
  skip           identity;         zero           zeros (lets an edge be dropped)

The mixed op of an edge is the softmax(alpha_edge)-weighted sum of all ops.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp

from sfjax.vision import conv_layers as layers

OPS = ("conv_3x3", "sep_conv_3x3", "max_pool_3x3", "avg_pool_3x3", "skip", "zero")
ZERO = "zero"


def init_op(key: jax.Array, name: str, channels: int) -> dict:
  """The parameters of op `name` on `channels` channels ({} for parameter-free ops)."""
  k1, k2 = jax.random.split(key)
  if name == "conv_3x3":
    return {"w": layers.he_normal(k1, (3, 3, channels, channels), 9 * channels)}
  if name == "sep_conv_3x3":
    return {"dw": layers.he_normal(k1, (3, 3, 1, channels), 9),
            "pw": layers.he_normal(k2, (1, 1, channels, channels), channels)}
  if name in OPS:
    return {}
  raise ValueError(f"unknown DARTS op {name!r} (known: {', '.join(OPS)})")


def apply_op(name: str, params: dict, x: jax.Array) -> jax.Array:
  """Op `name` on x [B, H, W, C] -> [B, H, W, C]."""
  if name == "conv_3x3":
    return layers.conv2d(jax.nn.relu(x), params["w"])
  if name == "sep_conv_3x3":
    h = layers.conv2d(jax.nn.relu(x), params["dw"], groups=x.shape[-1])
    return layers.conv2d(h, params["pw"])
  if name == "max_pool_3x3":
    return layers.max_pool(x, 3)
  if name == "avg_pool_3x3":
    return layers.avg_pool(x, 3)
  if name == "skip":
    return x
  if name == ZERO:
    return jnp.zeros_like(x)
  raise ValueError(f"unknown DARTS op {name!r} (known: {', '.join(OPS)})")


def init_mixed_op(key: jax.Array, channels: int) -> dict:
  """{op name: op params} of one edge of the supernet."""
  keys = jax.random.split(key, len(OPS))
  return {name: init_op(k, name, channels) for k, name in zip(keys, OPS, strict=True)}


def mixed_op(params: dict, alpha_edge: jax.Array, x: jax.Array) -> jax.Array:
  """sum_k softmax(alpha_edge)_k * op_k(x); alpha_edge [len(OPS)], x [B, H, W, C]."""
  weights = jax.nn.softmax(alpha_edge)
  # sum()'s order without its int 0 start (typed: a sum of arrays is an array).
  return functools.reduce(operator.add, (weights[k] * apply_op(name, params[name], x)
                                         for k, name in enumerate(OPS)))
