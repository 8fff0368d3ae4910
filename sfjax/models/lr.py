"""Logistic regression: one first-order weight per field value, plus dense and bias."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.layers import DenseLinear
from sfjax.models.validation import check_inputs, check_sizes


class LR(nnx.Module):
  """`logit = sum_f w[x_f] + dense @ v + b`.

  The embedding rows are the first-order weights themselves (width 1), so the
  embedding backend holds the whole sparse part of the model.
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """LR reads one weight per field value, whatever `embed_dim` says."""
    del embed_dim
    return 1

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs):
    """Builds the dense weights and the bias.

    Args:
      num_fields: F.
      embed_dim: ignored (rows have width 1); accepted for a uniform signature.
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "lr", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    self.num_fields, self.num_dense = num_fields, num_dense
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    self.bias = nnx.Param(jnp.zeros((), jnp.float32))

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, 1]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("lr", emb, dense, num_fields=self.num_fields, width=1, num_dense=self.num_dense)
    return jnp.sum(emb[..., 0], axis=1) + self.dense_linear(dense) + self.bias[...]
