"""The baseline CNN (the unsearched model, and the model compression searches).

  conv3x3(1 -> C1) relu -> maxpool 2 -> conv3x3(C1 -> C2) relu -> global mean
  -> dense(C2 -> H) relu -> dense(H -> classes)

`apply_cnn` optionally takes structured-pruning masks (one 0/1 vector per pruned
width: C1, C2, H; a masked unit's output is zeroed, Prune-EA) and per-layer bit
widths (fake-quantized weights, Quant-EA). `prune_cnn` slices the kept units out,
so the pruned network is physically smaller and computes the same logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from sfjax.compress.quant import fake_quant
from sfjax.vision import conv_layers as layers

LAYERS = ("conv1", "conv2", "dense1", "dense2")  # weight layers, in order (bit widths)
_PRUNABLE = ("conv1", "conv2", "dense1")  # layers whose output units masks remove


def init_cnn(key: jax.Array, widths: Sequence[int] = (16, 32, 32), in_channels: int = 1,
             num_classes: int = 10) -> dict:
  """Parameters {layer: {'w', 'b'}} of the CNN with widths (C1, C2, H)."""
  c1, c2, h = widths
  k = jax.random.split(key, 4)
  return {"conv1": layers.conv_init(k[0], in_channels, c1),
          "conv2": layers.conv_init(k[1], c1, c2),
          "dense1": layers.dense_init(k[2], c2, h),
          "dense2": layers.dense_init(k[3], h, num_classes)}


def widths_of(params: dict) -> tuple[int, int, int]:
  """(C1, C2, H) of CNN parameters."""
  return (params["conv1"]["w"].shape[-1], params["conv2"]["w"].shape[-1],
          params["dense1"]["w"].shape[-1])


def apply_cnn(params: dict, x: jax.Array, masks: Sequence[jax.Array] | None = None,
              bits: jax.Array | None = None) -> jax.Array:
  """Logits [B, classes] of images x [B, H, W, C].

  Args:
    masks: optional (m1 [C1], m2 [C2], mh [H]) 0/1 unit masks.
    bits: optional [4] bit widths of LAYERS' weights (fake-quantized; biases stay float).
  """
  def weight(i, name):
    w = params[name]["w"]
    return w if bits is None else fake_quant(w, bits[i])

  def mask(i, h):
    return h if masks is None else h * masks[i]

  h = jax.nn.relu(layers.conv2d(x, weight(0, "conv1")) + params["conv1"]["b"])
  h = mask(0, h)
  h = layers.max_pool(h, 2, 2)
  h = mask(1, jax.nn.relu(layers.conv2d(h, weight(1, "conv2")) + params["conv2"]["b"]))
  h = h.mean(axis=(1, 2))
  h = mask(2, jax.nn.relu(h @ weight(2, "dense1") + params["dense1"]["b"]))
  return h @ weight(3, "dense2") + params["dense2"]["b"]


def cnn_param_count(widths: Sequence[int], in_channels: int = 1, num_classes: int = 10) -> int:
  """Scalars of a CNN with widths (C1, C2, H) (weights and biases)."""
  c1, c2, h = (int(w) for w in widths)
  return (9 * in_channels * c1 + c1) + (9 * c1 * c2 + c2) + (c2 * h + h) + (h * num_classes
                                                                            + num_classes)


def layer_weight_sizes(widths: Sequence[int], in_channels: int = 1,
                       num_classes: int = 10) -> tuple[int, int, int, int]:
  """Weight scalars of each of LAYERS (what bit widths multiply)."""
  c1, c2, h = (int(w) for w in widths)
  return 9 * in_channels * c1, 9 * c1 * c2, c2 * h, h * num_classes


def prune_cnn(params: dict, masks: Sequence) -> dict:
  """The CNN with the masked-out units removed (host side; masks are 0/1 arrays).

  The result has widths (sum m1, sum m2, sum mh) and, unquantized, the same
  logits as `apply_cnn(params, x, masks)`.
  """
  keep = [np.flatnonzero(np.asarray(m) > 0) for m in masks]
  k1, k2, kh = keep
  p = jax.tree.map(np.asarray, params)
  return {"conv1": {"w": p["conv1"]["w"][..., k1], "b": p["conv1"]["b"][k1]},
          "conv2": {"w": p["conv2"]["w"][:, :, k1][..., k2], "b": p["conv2"]["b"][k2]},
          "dense1": {"w": p["dense1"]["w"][k2][:, kh], "b": p["dense1"]["b"][kh]},
          "dense2": {"w": p["dense2"]["w"][kh], "b": p["dense2"]["b"]}}
