"""DCN-V2 (Wang et al., WWW 2021): a cross network of explicit feature crosses + an MLP.

Cross layer l: `x_{l+1} = x0 * (W_l x_l + b_l) + x_l` on `x0 = [v_1..v_F, dense]`
(width d = F*D + Nd). Full-rank W_l is [d, d]; with `cross_rank = r > 0` it is
the low-rank product `U_l V_l^T` (U, V: [d, r]) of the paper's cost-efficient
variant, costing O(d*r) instead of O(d^2) per example. (No mixture of experts.)

Structures (`cross_structure`):
  "stacked"  (default, the paper's best on Criteo): MLP(cross(x0)) -> logit.
  "parallel": [cross(x0), MLP_hidden(x0)] -> Linear -> logit.
Both add a linear term on dense features (a direct path that costs nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import as_count, as_layer_dims, check_inputs, check_sizes

CROSS_STRUCTURES = ("stacked", "parallel")


class CrossLayer(nnx.Module):
  """One DCN-V2 cross layer, full-rank (`rank = 0`) or low-rank (`rank > 0`)."""

  def __init__(self, dim: int, rank: int, *, rngs: nnx.Rngs):
    """Builds W (or U, V) with glorot-uniform init and a zero bias.

    Args:
      dim: d, the width of x0.
      rank: 0 for a full [d, d] matrix, r > 0 for factors V [d, r] and U^T [r, d].
      rngs: initialisation keys.
    """
    init = jax.nn.initializers.glorot_uniform()
    self.rank = rank
    if rank > 0:
      self.down = nnx.Param(init(rngs.params(), (dim, rank), jnp.float32))  # V
      self.up = nnx.Param(init(rngs.params(), (rank, dim), jnp.float32))  # U^T
    else:
      self.kernel = nnx.Param(init(rngs.params(), (dim, dim), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((dim,), jnp.float32))

  def __call__(self, x0: jax.Array, x: jax.Array) -> jax.Array:
    """Maps x0, x_l `[B, d]` to x_{l+1} `[B, d]`."""
    if self.rank > 0:
      mixed = (x @ self.down[...]) @ self.up[...]
    else:
      mixed = x @ self.kernel[...]
    return x0 * (mixed + self.bias[...]) + x


class DCNv2(nnx.Module):
  """DCN-V2 on `x0 = [flattened field vectors, dense]`; rows have width D."""

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """No first-order weights: rows are the D-dim vectors."""
    return embed_dim

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               mlp_dims: Sequence[int] = (400, 400, 400), cross_layers: int = 3,
               cross_rank: int = 0, cross_structure: str = "stacked"):
    """Builds the cross layers, the MLP and the dense linear term.

    Args:
      num_fields: F.
      embed_dim: D.
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      mlp_dims: hidden widths of the MLP (`model.mlp_dims`).
      cross_layers: number of cross layers (`model.cross_layers`, >= 0).
      cross_rank: 0 = full-rank W; r > 0 = low-rank U V^T (`model.cross_rank`).
      cross_structure: "stacked" or "parallel" (see the module docstring).
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "dcnv2", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("dcnv2", "model.mlp_dims", mlp_dims)
    cross_layers = as_count("dcnv2", "model.cross_layers", cross_layers, low=0)
    cross_rank = as_count("dcnv2", "model.cross_rank", cross_rank, low=0)
    if cross_structure not in CROSS_STRUCTURES:
      raise ValueError(f"dcnv2: model.cross_structure must be one of {CROSS_STRUCTURES}, "
                       f"got {cross_structure!r}")
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.cross_structure = cross_structure
    dim = num_fields * embed_dim + num_dense
    self.cross = nnx.List([CrossLayer(dim, cross_rank, rngs=rngs) for _ in range(cross_layers)])
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    if cross_structure == "stacked":
      self.mlp = MLP(dim, mlp_dims, 1, rngs=rngs)
      self.head = None
    else:
      self.mlp = MLP(dim, mlp_dims, None, rngs=rngs)
      self.head = nnx.Linear(dim + self.mlp.out_features, 1, rngs=rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("dcnv2", emb, dense, num_fields=self.num_fields, width=self.embed_dim,
                 num_dense=self.num_dense)
    x0 = jnp.concatenate([emb.reshape(emb.shape[0], -1), dense], axis=1)  # [B, d]
    x = x0
    for layer in self.cross:
      x = layer(x0, x)
    if self.head is None:
      out = self.mlp(x)[:, 0]
    else:
      out = self.head(jnp.concatenate([x, self.mlp(x0)], axis=1))[:, 0]
    return out + self.dense_linear(dense)
