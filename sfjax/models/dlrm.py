"""DLRM (Naumov et al., 2019): bottom MLP on dense, dot interactions, top MLP."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.models.layers import MLP
from sfjax.models.validation import as_layer_dims, check_inputs, check_sizes


def pairwise_dot_interactions(vectors: jax.Array) -> jax.Array:
  """Dot products of every pair i < j of N vectors (the strict upper triangle).

  Args:
    vectors: [B, N, D].

  Returns:
    [B, N*(N-1)/2], ordered row-major over (i, j) with i < j.
  """
  n = vectors.shape[1]
  gram = jnp.einsum("bnd,bmd->bnm", vectors, vectors)  # [B, N, N]
  rows, cols = np.triu_indices(n, k=1)
  return gram[:, rows, cols]


def num_interactions(num_fields: int, num_dense: int) -> int:
  """How many pairwise dots DLRM forms: N*(N-1)/2 with N = F + (1 if Nd > 0)."""
  n = num_fields + (1 if num_dense > 0 else 0)
  return n * (n - 1) // 2


class DLRM(nnx.Module):
  """`logit = top_MLP([z, dots(z, v_1..v_F)])` with `z = bottom_MLP(dense)`.

  The bottom MLP is Linear+ReLU for each of `bottom_mlp_dims`, then Linear+ReLU
  to D (so z joins the field embeddings, as in the reference implementation's
  "dot" interaction, which keeps z itself in the top-MLP input too). With Nd = 0
  there is no z: the top MLP sees the F*(F-1)/2 field dots only. Rows have width D.
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """No first-order weights: rows are the D-dim vectors."""
    return embed_dim

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               mlp_dims: Sequence[int] = (400, 400, 400),
               bottom_mlp_dims: Sequence[int] = (64, 16)):
    """Builds the bottom and top MLPs.

    Args:
      num_fields: F.
      embed_dim: D.
      num_dense: Nd (may be 0; then F must be >= 2 so some pair exists).
      rngs: initialisation keys.
      mlp_dims: hidden widths of the top MLP (`model.mlp_dims`); a Linear to 1 follows.
      bottom_mlp_dims: hidden widths of the bottom MLP (`model.bottom_mlp_dims`).
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "dlrm", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("dlrm", "model.mlp_dims", mlp_dims)
    bottom_mlp_dims = as_layer_dims("dlrm", "model.bottom_mlp_dims", bottom_mlp_dims)
    pairs = num_interactions(num_fields, num_dense)
    if pairs == 0:
      raise ValueError(f"dlrm: needs at least two vectors to interact, got num_fields="
                       f"{num_fields} and num_dense={num_dense}")
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.bottom: MLP | None
    if num_dense > 0:
      self.bottom = MLP(num_dense, (*bottom_mlp_dims, embed_dim), None, rngs=rngs)
      top_in = pairs + embed_dim
    else:
      self.bottom = None
      top_in = pairs
    self.top = MLP(top_in, mlp_dims, 1, rngs=rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("dlrm", emb, dense, num_fields=self.num_fields, width=self.embed_dim,
                 num_dense=self.num_dense)
    if self.bottom is None:
      top_in = pairwise_dot_interactions(emb)  # [B, P]
    else:
      z = self.bottom(dense)  # [B, D]
      dots = pairwise_dot_interactions(jnp.concatenate([z[:, None, :], emb], axis=1))
      top_in = jnp.concatenate([z, dots], axis=1)  # [B, D + P]
    return self.top(top_in)[:, 0]
