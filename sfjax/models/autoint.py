"""AutoInt (Song et al., CIKM 2019): multi-head self-attention over fields.

Each interacting layer maps field vectors `[B, F, D_in]` to `[B, F, H*A]`:
per head, queries/keys/values are linear maps, attention is a softmax over
fields (scaled by 1/sqrt(A), as in Transformers; the paper leaves it unscaled),
and the result is `ReLU(concat_heads(attention) + W_res x)`.

This is AutoInt+ (the paper's variant with a parallel DNN): the logit is
`Linear(flatten(attention output)) + MLP([v_1..v_F, dense]) + dense @ w`, so the
dense features reach the model through the MLP and a linear term. Rows have width D.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import as_count, as_layer_dims, check_inputs, check_sizes


class InteractingLayer(nnx.Module):
  """One multi-head self-attention layer over fields with a projected residual."""

  def __init__(self, in_dim: int, num_heads: int, head_dim: int, *, rngs: nnx.Rngs):
    """Builds the query/key/value/residual projections (no biases, lecun-normal).

    Args:
      in_dim: D_in, the width of each field vector.
      num_heads: H.
      head_dim: A, the per-head width.
      rngs: initialisation keys.
    """
    out = num_heads * head_dim
    self.num_heads, self.head_dim = num_heads, head_dim
    self.query = nnx.Linear(in_dim, out, use_bias=False, rngs=rngs)
    self.key = nnx.Linear(in_dim, out, use_bias=False, rngs=rngs)
    self.value = nnx.Linear(in_dim, out, use_bias=False, rngs=rngs)
    self.residual = nnx.Linear(in_dim, out, use_bias=False, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """Maps `x: [B, F, D_in]` to `[B, F, H*A]`."""
    b, f, _ = x.shape
    # Head-major [B, H, F, A] so both attention products are plain batched matmuls
    # (about 2x faster on XLA:CPU than einsums over [B, F, H, A] at B=4096, F=26).
    def split(t: jax.Array) -> jax.Array:  # [B, F, H*A] -> [B, H, F, A]
      return jnp.transpose(t.reshape(b, f, self.num_heads, self.head_dim), (0, 2, 1, 3))

    q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))  # [B, H, F, A]
    scores = (q @ jnp.swapaxes(k, -1, -2)) / math.sqrt(self.head_dim)  # [B, H, F, F]
    mixed = jax.nn.softmax(scores, axis=-1) @ v  # [B, H, F, A]
    mixed = jnp.transpose(mixed, (0, 2, 1, 3)).reshape(b, f, -1)  # [B, F, H*A]
    return jax.nn.relu(mixed + self.residual(x))


class AutoInt(nnx.Module):
  """AutoInt+ on width-D rows: interacting layers + parallel MLP + dense linear."""

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """No first-order weights: rows are the D-dim vectors."""
    return embed_dim

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               mlp_dims: Sequence[int] = (400, 400, 400), attention_layers: int = 2,
               attention_heads: int = 2, attention_dim: int = 16):
    """Builds the interacting layers, their logit projection and the MLP.

    Args:
      num_fields: F.
      embed_dim: D.
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      mlp_dims: hidden widths of the parallel MLP (`model.mlp_dims`).
      attention_layers: interacting layers (`model.attention_layers`, >= 1).
      attention_heads: H (`model.attention_heads`, >= 1).
      attention_dim: A, per-head width (`model.attention_dim`, >= 1).
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "autoint", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("autoint", "model.mlp_dims", mlp_dims)
    attention_layers = as_count("autoint", "model.attention_layers", attention_layers, low=1)
    heads = as_count("autoint", "model.attention_heads", attention_heads, low=1)
    head_dim = as_count("autoint", "model.attention_dim", attention_dim, low=1)
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    widths = (embed_dim,) + (heads * head_dim,) * attention_layers
    self.interacting = nnx.List([InteractingLayer(a, heads, head_dim, rngs=rngs)
                                 for a in widths[:-1]])
    self.attention_head = nnx.Linear(num_fields * widths[-1], 1, use_bias=False, rngs=rngs)
    self.mlp = MLP(num_fields * embed_dim + num_dense, mlp_dims, 1, rngs=rngs)
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("autoint", emb, dense, num_fields=self.num_fields, width=self.embed_dim,
                 num_dense=self.num_dense)
    b = emb.shape[0]
    x = emb
    for layer in self.interacting:
      x = layer(x)  # [B, F, H*A]
    attention_logit = self.attention_head(x.reshape(b, -1))[:, 0]
    deep_in = jnp.concatenate([emb.reshape(b, -1), dense], axis=1)  # [B, F*D+Nd]
    return attention_logit + self.mlp(deep_in)[:, 0] + self.dense_linear(dense)
