"""xDeepFM (Lian et al., KDD 2018): linear part + CIN + DNN.

The Compressed Interaction Network builds `X^k[h] = sum_{i,j} W^k[h,i,j] *
(X^{k-1}[i] ∘ X^0[j])` (∘: elementwise over the D columns), sum-pools each
feature map over D, and concatenates the pooled maps of all layers. CIN
activation is the identity and every feature map feeds both the output and the
next layer (the paper's default, without the reference code's `split_half`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import as_layer_dims, check_inputs, check_sizes, split_first_order


class CIN(nnx.Module):
  """Compressed Interaction Network over `[B, F, D]` field vectors."""

  def __init__(self, num_fields: int, layer_dims: Sequence[int], *, rngs: nnx.Rngs):
    """Builds one `[H_k, H_{k-1}, F]` kernel per layer (lecun-normal, fan-in H_{k-1}*F).

    Args:
      num_fields: F (= H_0).
      layer_dims: feature maps per layer, H_1..H_K.
      rngs: initialisation keys.
    """
    init = jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                in_axis=(1, 2), out_axis=0)
    widths = (num_fields, *layer_dims)  # H_0 .. H_K
    self.kernels = nnx.List([nnx.Param(init(rngs.params(), (h, p, num_fields), jnp.float32))
                             for p, h in itertools.pairwise(widths)])
    self.out_features = sum(layer_dims)

  def __call__(self, x0: jax.Array) -> jax.Array:
    """Maps `x0: [B, F, D]` to the pooled feature maps `[B, sum_k H_k]`."""
    x = x0
    pooled = []
    for kernel in self.kernels:
      # [B, H_{k-1}, D] x [B, F, D] x [H_k, H_{k-1}, F] -> [B, H_k, D]; einsum picks the
      # contraction order (one [B, ., F, D]-sized intermediate either way).
      x = jnp.einsum("bhd,bmd,nhm->bnd", x, x0, kernel[...])
      pooled.append(jnp.sum(x, axis=-1))  # [B, H_k]
    return jnp.concatenate(pooled, axis=1)


class XDeepFM(nnx.Module):
  """`logit = sum_f w_f + dense @ v + Linear(CIN(v)) + MLP([v_1..v_F, dense])`.

  Rows have width D+1 (first-order weight last). The MLP's output bias is the
  model's only bias (init 0).
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """D latent columns plus one first-order weight."""
    return embed_dim + 1

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               mlp_dims: Sequence[int] = (400, 400, 400), cin_dims: Sequence[int] = (64, 64)):
    """Builds the CIN, its output projection, the DNN and the dense linear term.

    Args:
      num_fields: F.
      embed_dim: D (rows have width D+1).
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      mlp_dims: hidden widths of the DNN (`model.mlp_dims`).
      cin_dims: feature maps per CIN layer (`model.cin_dims`, at least one layer).
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "xdeepfm", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("xdeepfm", "model.mlp_dims", mlp_dims)
    cin_dims = as_layer_dims("xdeepfm", "model.cin_dims", cin_dims, allow_empty=False)
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.cin = CIN(num_fields, cin_dims, rngs=rngs)
    self.cin_head = nnx.Linear(self.cin.out_features, 1, use_bias=False, rngs=rngs)
    self.mlp = MLP(num_fields * embed_dim + num_dense, mlp_dims, 1, rngs=rngs)
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D+1]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("xdeepfm", emb, dense, num_fields=self.num_fields, width=self.embed_dim + 1,
                 num_dense=self.num_dense)
    vectors, weights = split_first_order(emb)  # [B, F, D], [B, F]
    deep_in = jnp.concatenate([vectors.reshape(emb.shape[0], -1), dense], axis=1)
    return (jnp.sum(weights, axis=1) + self.dense_linear(dense)
            + self.cin_head(self.cin(vectors))[:, 0] + self.mlp(deep_in)[:, 0])
