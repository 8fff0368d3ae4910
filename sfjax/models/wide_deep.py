"""Wide & Deep (Cheng et al., DLRS 2016): a linear wide part plus an MLP."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import as_layer_dims, check_inputs, check_sizes, split_first_order


class WideDeep(nnx.Module):
  """`logit = sum_f w_f + dense @ v + MLP([v_1..v_F, dense])`.

  The wide part is the per-field first-order weights (last column of each
  width-D+1 row) plus a linear term on dense features; the paper's hand-made
  cross-product columns are not built (add them as extra fields upstream).
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """D latent columns plus one first-order (wide) weight."""
    return embed_dim + 1

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               mlp_dims: Sequence[int] = (400, 400, 400)):
    """Builds the deep MLP and the dense linear term.

    Args:
      num_fields: F.
      embed_dim: D (rows have width D+1).
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      mlp_dims: hidden widths of the deep part (`model.mlp_dims`); a Linear to 1 follows.
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "wide_deep", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("wide_deep", "model.mlp_dims", mlp_dims)
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    self.mlp = MLP(num_fields * embed_dim + num_dense, mlp_dims, 1, rngs=rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D+1]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("wide_deep", emb, dense, num_fields=self.num_fields, width=self.embed_dim + 1,
                 num_dense=self.num_dense)
    vectors, weights = split_first_order(emb)  # [B, F, D], [B, F]
    deep_in = jnp.concatenate([vectors.reshape(emb.shape[0], -1), dense], axis=1)  # [B, F*D+Nd]
    return jnp.sum(weights, axis=1) + self.dense_linear(dense) + self.mlp(deep_in)[:, 0]
