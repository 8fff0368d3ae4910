"""DeepFM (Guo et al., IJCAI 2017): an FM and an MLP sharing the embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.fm import fm_pairwise
from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import as_layer_dims, check_inputs, check_sizes, split_first_order


class DeepFM(nnx.Module):
  """`logit = sum_f w_f + dense @ v + FM2(v_1..v_F) + MLP([v_1..v_F, dense])`.

  Rows have width D+1 (first-order weight last). The MLP's output bias is the
  model's only bias (init 0). The hot path is one reshape of the vectors to
  `[B, F*D]` and the sum-square FM trick: no loop over fields.
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """D latent columns plus one first-order weight."""
    return embed_dim + 1

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               mlp_dims: Sequence[int] = (400, 400, 400), split_input: bool = False):
    """Builds the MLP and the dense linear term.

    Args:
      num_fields: F.
      embed_dim: D (rows have width D+1).
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      mlp_dims: hidden widths of the MLP (`model.mlp_dims`); a Linear to 1 follows.
      split_input: `model.split_input`: the train step calls `from_unique_rows` (the
        same parameters and logits up to float rounding, a faster step on CPU).
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "deepfm", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("deepfm", "model.mlp_dims", mlp_dims)
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    self.mlp = MLP(num_fields * embed_dim + num_dense, mlp_dims, 1, rngs=rngs)
    self.reads_unique_rows = bool(split_input)  # read by `sfjax.train.step.call_model`

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D+1]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("deepfm", emb, dense, num_fields=self.num_fields, width=self.embed_dim + 1,
                 num_dense=self.num_dense)
    vectors, weights = split_first_order(emb)  # [B, F, D], [B, F]
    deep_in = jnp.concatenate([vectors.reshape(emb.shape[0], -1), dense], axis=1)  # [B, F*D+Nd]
    return (jnp.sum(weights, axis=1) + self.dense_linear(dense) + fm_pairwise(vectors)
            + self.mlp(deep_in)[:, 0])

  def from_unique_rows(self, rows: jax.Array, vids: jax.Array, dense: jax.Array) -> jax.Array:
    """`self(rows[vids], dense)` laid out for speed (`model.split_input`, issue #27).

    Two gathers, one per block the model reads: the latent vectors `[B, F, D]` (whose
    reshape `[B, F*D]` is the MLP's input with no copy) and the first-order weights
    `[B, F]`; the FM term reads the gathered vectors, and the MLP's first layer
    multiplies the vectors and the dense features by their own kernel rows
    (`MLP.call_on_parts`): no `[B, F*D+Nd]` concatenation, no input gradient for the
    dense features. Equal to `__call__` up to float rounding; 4-9% less step time than
    it on 2-core CPUs (bench_train, interleaved); the train step's default
    (`model.split_input=True`).

    Args:
      rows: [U, D+1] the batch's unique rows.
      vids: [B, F] int32 positions in `rows`, all in range (VSI builds them so).
      dense: [B, Nd] dense features.

    Returns:
      [B] logits.
    """
    width = self.embed_dim + 1
    if rows.ndim != 2 or rows.shape[1] != width:
      raise ValueError(f"deepfm: rows must be [U, {width}] (unique rows x embedding width), "
                       f"got shape {tuple(rows.shape)}")
    if vids.ndim != 2 or vids.shape[1] != self.num_fields:
      raise ValueError(f"deepfm: vids must be [B, {self.num_fields}] (batch x fields), got "
                       f"shape {tuple(vids.shape)}")
    if dense.shape != (vids.shape[0], self.num_dense):
      raise ValueError(f"deepfm: dense must be [{vids.shape[0]}, {self.num_dense}] (batch x "
                       f"dense features), got shape {tuple(dense.shape)}")
    # mode='clip': in-range ids gather as `take` does, without its out-of-range fill.
    vectors = jnp.take(rows[:, :-1], vids, axis=0, mode="clip")  # [B, F, D]
    weights = jnp.take(rows[:, -1], vids, axis=0, mode="clip")  # [B, F]
    deep = self.mlp.call_on_parts([vectors.reshape(vids.shape[0], -1), dense])
    return (jnp.sum(weights, axis=1) + self.dense_linear(dense) + fm_pairwise(vectors)
            + deep[:, 0])
