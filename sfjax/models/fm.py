"""Factorization Machine (Rendle, ICDM 2010) and its O(F*D) pairwise term."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.layers import DenseLinear
from sfjax.models.validation import check_inputs, check_sizes, split_first_order


def fm_pairwise(vectors: jax.Array) -> jax.Array:
  """Sum over field pairs i < j of <v_i, v_j>, by 0.5 * ((sum v)^2 - sum v^2).

  Args:
    vectors: [B, F, D] latent vectors.

  Returns:
    [B] pairwise interaction term, O(F*D) per example (Rendle 2010, eq. 5).
  """
  summed = jnp.sum(vectors, axis=1)  # [B, D]
  summed_sq = jnp.sum(vectors * vectors, axis=1)  # [B, D]
  return 0.5 * jnp.sum(summed * summed - summed_sq, axis=-1)


class FM(nnx.Module):
  """`logit = b + sum_f w_f + dense @ v + sum_{i<j} <v_i, v_j>`.

  Rows have width D+1: `emb[..., :-1]` is the latent vector, `emb[..., -1]` the
  first-order weight. Dense features enter linearly only.
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """D latent columns plus one first-order weight."""
    return embed_dim + 1

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs):
    """Builds the dense weights and the bias.

    Args:
      num_fields: F.
      embed_dim: D (rows have width D+1).
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "fm", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    self.bias = nnx.Param(jnp.zeros((), jnp.float32))

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D+1]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("fm", emb, dense, num_fields=self.num_fields, width=self.embed_dim + 1,
                 num_dense=self.num_dense)
    vectors, weights = split_first_order(emb)
    return (self.bias[...] + jnp.sum(weights, axis=1) + self.dense_linear(dense)
            + fm_pairwise(vectors))
