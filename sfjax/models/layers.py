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


class DenseLinear(nnx.Module):
  """Linear term on the dense features, `dense @ w` without bias; zero when Nd = 0."""

  def __init__(self, num_dense: int, *, rngs: nnx.Rngs):
    """Weights `w: [Nd]` ~ N(0, 1/Nd) (lecun-normal for a single output)."""
    scale = 1.0 / math.sqrt(max(num_dense, 1))
    self.kernel = nnx.Param(scale * jax.random.normal(rngs.params(), (num_dense,), jnp.float32))

  def __call__(self, dense: jax.Array) -> jax.Array:
    """Maps `dense: [B, Nd]` to `[B]`."""
    return dense @ self.kernel[...]

