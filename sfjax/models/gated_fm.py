"""AutoFIS's model (Liu et al., KDD 2020): an FM or DeepFM whose field pairs pass gates.

  logit = b + Σ_f w_f + dense·v + Σ_{(i,j) in pairs} α_ij BN(<e_i, e_j>) [+ MLP([e_1..e_F, dense])]

Rows have width D + 1 (the first-order weight last). `gates` α [P] is an
`nnx.Param`: AutoFIS trains it with gRDA (`sfjax.structure.autofis`), which sets
most gates exactly to 0, and freezes it when it retrains on the kept pairs.
BN is batch norm without scale or shift (the paper's point: the scale of
<e_i, e_j> must not stand in for α): batch moments while training, running
moments after `model.eval()`; its moments are `nnx.BatchStat`s, so the model
trains through `sfjax.train.step.make_train_step(..., model_variables=True)`.
The batch moments are over every example of the batch: train batches are full
(a `TrialData`'s are); evaluation uses the running moments. Without `pair_norm`
(the retrained model) the pair terms enter as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import (
    as_layer_dims,
    check_inputs,
    check_sizes,
    split_first_order,
)

_BN_EPS = 1e-5


def all_field_pairs(num_fields: int) -> tuple[tuple[int, int], ...]:
  """Every pair (i, j), 0 <= i < j < F, in row-major order."""
  i, j = np.triu_indices(num_fields, 1)
  return tuple((int(a), int(b)) for a, b in zip(i, j, strict=True))


def check_pairs(pairs: Sequence[Sequence[int]], num_fields: int,
                key: str = "model.pairs") -> tuple[tuple[int, int], ...]:
  """`pairs` as a tuple of (i, j) int pairs.

  Raises:
    ValueError: naming `key` unless every pair has 0 <= i < j < num_fields.
  """
  out = tuple(tuple(int(x) for x in p) for p in pairs)
  if any(len(p) != 2 or not 0 <= p[0] < p[1] < num_fields for p in out):
    raise ValueError(f"{key}: every pair must be (i, j) with 0 <= i < j < {num_fields}, got "
                     f"{[list(p) for p in out]}")
  return tuple((i, j) for i, j in out)


def _pair_inner_products(vectors: jax.Array, pairs: np.ndarray) -> jax.Array:
  """<e_i, e_j> per example and pair.

  Args:
    vectors: [B, F, D] field embeddings.
    pairs: [P, 2] int field indices.

  Returns:
    [B, P] inner products.
  """
  pairs = np.asarray(pairs, np.int32).reshape(-1, 2)
  return jnp.einsum("bpe,bpe->bp", vectors[:, pairs[:, 0]], vectors[:, pairs[:, 1]])


class GatedFM(nnx.Module):
  """The gated FM / DeepFM above (registered as 'gated_fm').

  Attributes:
    pairs: the gated pairs (i, j), i < j (static).
    gates: [P] Param, the gate α of each pair.
    pair_norm: the BN (None without `pair_norm` or without pairs).
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """D latent columns plus one first-order weight."""
    return embed_dim + 1

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               mlp_dims: Sequence[int] = (), pairs: Sequence[Sequence[int]] | None = None,
               pair_norm: bool = True, bn_momentum: float = 0.99, gate_init: float = 1.0):
    """Builds the gates, the BN, the dense term and the optional MLP.

    Args:
      num_fields: F.
      embed_dim: D (rows have width D + 1).
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      mlp_dims: MLP hidden widths (`model.mlp_dims`; () = the FM variant, no MLP).
      pairs: the gated pairs (None: every pair, `all_field_pairs`).
      pair_norm: batch-normalise the pair products (the search) or not (the retrain).
      bn_momentum: decay of the BN's running moments.
      gate_init: the initial value of every gate.
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "gated_fm", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("gated_fm", "model.mlp_dims", mlp_dims)
    if not 0.0 <= bn_momentum <= 1.0:
      raise ValueError(f"gated_fm: model.bn_momentum must be in [0, 1], got {bn_momentum!r}")
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.pairs = check_pairs(all_field_pairs(num_fields) if pairs is None else pairs, num_fields)
    self.bias = nnx.Param(jnp.zeros((), jnp.float32))
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    # Dense weights start at 0, not at DenseLinear's N(0, 1/Nd): measured on planted data,
    # the random start cost AutoFIS's 400-step retrain 0.025 test AUC.
    self.dense_linear.kernel[...] = jnp.zeros((num_dense,), jnp.float32)
    self.gates = nnx.Param(jnp.full((len(self.pairs),), gate_init, jnp.float32))
    self.pair_norm = (nnx.BatchNorm(len(self.pairs), use_bias=False, use_scale=False,
                                    momentum=bn_momentum, epsilon=_BN_EPS,
                                    use_fast_variance=False, rngs=rngs)
                      if pair_norm and self.pairs else None)
    self.mlp = (MLP(num_fields * embed_dim + num_dense, mlp_dims, 1, rngs=rngs)
                if mlp_dims else None)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D+1]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("gated_fm", emb, dense, num_fields=self.num_fields, width=self.embed_dim + 1,
                 num_dense=self.num_dense)
    vectors, weights = split_first_order(emb)  # [B, F, D], [B, F]
    logits = self.bias[...] + jnp.sum(weights, axis=1) + self.dense_linear(dense)
    if self.pairs:
      products = _pair_inner_products(vectors, np.asarray(self.pairs))  # [B, P]
      if self.pair_norm is not None:
        products = self.pair_norm(products)
      logits = logits + products @ self.gates[...]
    if self.mlp is not None:
      deep_in = jnp.concatenate([vectors.reshape(emb.shape[0], -1), dense], axis=1)
      logits = logits + self.mlp(deep_in)[:, 0]
    return logits
