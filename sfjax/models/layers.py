"""Building blocks of the CTR models: the MLP tower and the dense linear term.

No BatchNorm and no dropout: every variable is an `nnx.Param` that `__call__`
only reads, so `nnx.split` once + `jax.jit`/`jax.vmap` over the params is exact.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx


class MLP(nnx.Module):
  """Linear+ReLU layers, optionally followed by a linear output layer.

  Kernels use lecun-normal init (nnx.Linear's default), biases zeros, so the
  logit layer of every model starts with bias 0.

  Attributes:
    out_features: width of the output (`out_features` if given, else the last
      hidden width, else `in_features`).
  """

  def __init__(self, in_features: int, hidden_dims: Sequence[int], out_features: int | None = None,
               *, rngs: nnx.Rngs):
    """Builds the layers.

    Args:
      in_features: input width.
      hidden_dims: widths of the Linear+ReLU layers (may be empty).
      out_features: width of a final Linear without activation; None for none
        (then the output is the last ReLU layer, as DLRM's bottom MLP wants).
      rngs: initialisation keys.
    """
    dims = (in_features, *hidden_dims)
    self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(dims)])
    self.out = nnx.Linear(dims[-1], out_features, rngs=rngs) if out_features is not None else None
    self.out_features = out_features if out_features is not None else dims[-1]

  def __call__(self, x: jax.Array) -> jax.Array:
    """Maps `x: [B, in_features]` to `[B, out_features]`."""
    for layer in self.hidden:
      x = jax.nn.relu(layer(x))
    return self.out(x) if self.out is not None else x

  def call_on_parts(self, parts: Sequence[jax.Array]) -> jax.Array:
    """`self(concatenate(parts, axis=1))` without building the concatenated input.

    The first layer multiplies each part `[B, n_i]` by its own rows of the kernel and
    sums the products, so no `[B, sum n_i]` copy is written and the backward pass
    computes an input gradient only for the parts that need one. Equal to `__call__`
    up to float rounding (the sum runs in another order). Needs a hidden layer.
    """
    if not self.hidden:
      raise ValueError("MLP.call_on_parts: the MLP has no hidden layer to split")
    first, start = self.hidden[0], 0
    kernel = first.kernel[...]  # [sum n_i, H]
    assert first.bias is not None  # nnx.Linear's default use_bias=True (built above)
    x = first.bias[...]
    for part in parts:
      x = x + part @ kernel[start:start + part.shape[1]]
      start += part.shape[1]
    if start != kernel.shape[0]:
      raise ValueError(f"MLP.call_on_parts: the parts have {start} columns in all, the first "
                       f"layer takes {kernel.shape[0]}")
    x = jax.nn.relu(x)
    for layer in list(self.hidden)[1:]:
      x = jax.nn.relu(layer(x))
    return self.out(x) if self.out is not None else x


class DenseLinear(nnx.Module):
  """Linear term on the dense features, `dense @ w` without bias; zero when Nd = 0."""

  def __init__(self, num_dense: int, *, rngs: nnx.Rngs):
    """Weights `w: [Nd]` ~ N(0, 1/Nd) (lecun-normal for a single output)."""
    scale = 1.0 / math.sqrt(max(num_dense, 1))
    self.kernel = nnx.Param(scale * jax.random.normal(rngs.params(), (num_dense,), jnp.float32))

  def __call__(self, dense: jax.Array) -> jax.Array:
    """Maps `dense: [B, Nd]` to `[B]`."""
    return dense @ self.kernel[...]

