"""DIN (Zhou et al., KDD 2018, "Deep Interest Network"): target attention over a history.

A user's behaviour sequence (the items they clicked, most recent last) is pooled with
weights that depend on the candidate item, so the interest vector changes with the ad:

  a_i      = ActivationUnit([h_i, t, h_i - t, h_i * t])   (a scalar per history item)
  interest = sum_i m_i a_i h_i                            (m_i: 1 for a real item, 0 for padding)
             [/ max(1, sum_i m_i) with din_pooling='mean']
             [a := softmax over the real items of a, with din_pooling='softmax']
  fields   = v_1..v_F with v_seq := interest
  logit    = sum_{f != seq} w_f + dense @ u + FM2(fields) + MLP([fields, dense])

`t` is the target item's vector (a one-hot feature reading the same table as the
history, so `h_i` and `t` live in one space and `h_i * t` compares them), `h_i` the
history's vectors. As in the paper the weights are NOT softmax-normalised: the paper
keeps `sum_i a_i` free so the interest's norm carries how strongly the history
matches the target (Section 4.3). The paper's base model sum-pools the history; DIN
replaces that pooled vector by the interest (the paper's Fig. 2, FuxiCTR's and
DeepCTR's DIN), so field `sequence_field` of the pooled fields (its mean, from
`sfjax.models.behavior.pooling`) is swapped for the interest before the MLP.

Activation: PReLU (He et al., 2015; the paper's Table 4 reports it beside Dice). Dice
normalises by the batch's statistics, so an example's logit would depend on the other
examples of its batch, padding rows included, and on train vs eval mode: the house
models keep every variable an `nnx.Param` that `__call__` only reads. The top MLP is
the shared `layers.MLP` (ReLU).

Base model: DeepFM's (first-order weights, the FM's pairwise term and the MLP over the
same fields; rows of width D+1, the first-order weight last), not the paper's bare
Embedding&MLP: the attention then adds to the strongest one-hot baseline instead of
replacing its FM. On MovieLens-100k (seed 0, ctr.py:movielens_din) the bare version
reached test AUC 0.7882 and the DeepFM base 0.7949 (0.7975 with a one-layer (32,)
unit), against 0.7966 for the one-genre one-hot DeepFM. The history's items are
attended by their vectors; the pooled history's first-order weight is dropped with
its vector.

`din_pooling='mean'` divides the interest by the number of real history items: the
weighted MEAN of the history, not its sum, so the interest's scale no longer grows with
the history's length. On MovieLens-100k (ctr.py:movielens_din, 20-rating histories,
3 seeds, 2026-12-07) the sum overfitted early (best valid AUC at step 550-600: valid
0.7845, test 0.7960) and the mean did not (best at 700-1000: valid 0.7883, test 0.7991,
both with the (32,) unit), level with DeepFM's mean-pooled history (valid 0.7884, test
0.7988). `sum` (the paper's) stays the default.

`din_pooling='softmax'` normalises the weights over the real items instead (FuxiCTR's
`din_use_softmax`; DIEN's and BST's attention): `sum_i a_i = 1`, so the interest is a
convex mix of the history that no longer carries how strongly it matches. Same runs
(3 seeds, 2026-12-07, AMD EPYC): valid 0.7884, test 0.8001 against the mean's 0.7885 /
0.7991, a tie on validation, so `ctr.py:movielens_din` keeps `mean`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.core.errors import ConfigError
from sfjax.core.feature_layout import FeatureLayout
from sfjax.models.fm import fm_pairwise
from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import (
    as_count,
    as_layer_dims,
    check_inputs,
    check_sizes,
    split_first_order,
)

_PRELU_INIT = 0.25  # He et al. (2015)'s initial negative slope
# `model.din_pooling`: the paper's weighted sum | weighted mean | softmax-weighted mix
DIN_POOLINGS = ("sum", "mean", "softmax")


class PReLU(nnx.Module):
  """`max(0, x) + alpha * min(0, x)` with one learned slope per unit."""

  def __init__(self, width: int):
    """Slopes `alpha: [W]`, initialised to 0.25."""
    self.alpha = nnx.Param(jnp.full((width,), _PRELU_INIT, jnp.float32))

  def __call__(self, x: jax.Array) -> jax.Array:
    """Maps `x: [..., W]` to `[..., W]`."""
    return jnp.where(x >= 0, x, self.alpha[...] * x)


class ActivationUnit(nnx.Module):
  """DIN's local activation unit: `[h, t, h - t, h * t]` -> PReLU MLP -> one weight."""

  def __init__(self, embed_dim: int, hidden_dims: Sequence[int], *, rngs: nnx.Rngs):
    """Builds Linear+PReLU layers of widths `hidden_dims` from 4*D, then a Linear to 1.

    Args:
      embed_dim: D, the width of the history and target vectors.
      hidden_dims: hidden widths (`model.din_attention_dims`).
      rngs: initialisation keys.
    """
    dims = (4 * embed_dim, *hidden_dims)
    self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(dims)])
    self.act = nnx.List([PReLU(b) for b in dims[1:]])
    self.out = nnx.Linear(dims[-1], 1, rngs=rngs)

  def __call__(self, history: jax.Array, target: jax.Array) -> jax.Array:
    """Maps `history: [B, L, D]`, `target: [B, D]` to unnormalised weights `[B, L]`."""
    t = jnp.broadcast_to(target[:, None, :], history.shape)  # [B, L, D]
    x = jnp.concatenate([history, t, history - t, history * t], axis=-1)  # [B, L, 4D]
    for layer, act in zip(self.hidden, self.act, strict=True):
      x = act(layer(x))
    return self.out(x)[..., 0]


def target_attention(unit: ActivationUnit, history: jax.Array, mask: jax.Array,
                     target: jax.Array, pooling: str = "sum") -> jax.Array:
  """The interest `sum_i m_i a_i h_i`: `history [B, L, D]`, `mask [B, L]`, `target [B, D]` -> `[B, D]`.

  Padding items are zeroed BEFORE the unit and their weights after it (`jnp.where`,
  not a product), so a padded item changes neither the value nor any gradient, even
  if its row holds inf or NaN. `pooling='mean'` divides by the real items' count
  (`max(1, sum_i m_i)`: an empty history's interest stays 0); `pooling='softmax'` takes
  the weights' softmax over the real items (padding scores the dtype's lowest value, so
  its share is exactly 0; an empty history's interest stays 0).
  """
  real = mask > 0  # [B, L]
  history = jnp.where(real[..., None], history, 0.0)
  scores = unit(history, target)  # [B, L]
  if pooling == "softmax":
    scores = jax.nn.softmax(jnp.where(real, scores, jnp.finfo(scores.dtype).min), axis=1)
  weights = jnp.where(real, scores, 0.0)  # [B, L]
  interest = jnp.einsum("bl,bld->bd", weights, history)
  if pooling == "mean":
    return interest / jnp.maximum(jnp.sum(real, axis=1, keepdims=True), 1).astype(interest.dtype)
  return interest


def _layout_error(message: str) -> ConfigError:
  return ConfigError(f"config field model.name: model.name=din {message}")


class DIN(nnx.Module):
  """DeepFM over the fields with `v_seq := interest(history, v_target)` (module docstring).

  Called by `pooling.PooledInput` (it sets `reads_sequences`) with the pooled fields
  and each sequence feature unpooled; the history read is `sequences[0]`, the first
  sequence feature of the layout (`layout_args`). Rows have width D+1.
  """

  reads_sequences = True

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """D latent columns plus one first-order weight (the DeepFM base)."""
    return embed_dim + 1

  @staticmethod
  def layout_args(layout: FeatureLayout | None) -> dict[str, int]:
    """The fields DIN reads: `{'target_field': f_t, 'sequence_field': f_s}`.

    `f_s` is the layout's first sequence feature, `f_t` the first one-hot feature
    reading the same table (the candidate item of the history's item table).

    Raises:
      ConfigError: no layout, no sequence feature, or no such target.
    """
    if layout is None:
      raise _layout_error("needs a data set with a feature layout holding a 'sequence' feature "
                          "(this data set has one one-hot id per field)")
    sequences = layout.sequence_features()
    if not sequences:
      raise _layout_error("needs a 'sequence' feature; the layout has "
                          f"{[f'{f.name}:{f.kind}' for f in layout.features]}")
    seq = sequences[0]
    table = layout.features[seq].table
    for f, spec in enumerate(layout.features):
      if spec.kind == "one_hot" and spec.table == table:
        return {"target_field": f, "sequence_field": seq}
    raise _layout_error(f"needs a one_hot target feature reading table {table!r} of the "
                        f"sequence {layout.features[seq].name!r}; none does")

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               target_field: int, sequence_field: int,
               mlp_dims: Sequence[int] = (400, 400, 400),
               din_attention_dims: Sequence[int] = (80, 40), din_pooling: str = "sum"):
    """Builds the activation unit and the top MLP.

    Args:
      num_fields: F, pooled fields (features of the layout).
      embed_dim: D.
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      target_field: the candidate item's field (from `layout_args`).
      sequence_field: the history's field (from `layout_args`); its pooled slot is
        replaced by the interest.
      mlp_dims: hidden widths of the top MLP (`model.mlp_dims`); a Linear to 1 follows.
      din_attention_dims: hidden widths of the activation unit (`model.din_attention_dims`).
      din_pooling: 'sum' (the paper's), 'mean' (`model.din_pooling`; the interest
        divided by the real history items' count) or 'softmax' (the weights' softmax over
        the real items).
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "din", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    mlp_dims = as_layer_dims("din", "model.mlp_dims", mlp_dims)
    din_attention_dims = as_layer_dims("din", "model.din_attention_dims", din_attention_dims)
    target_field = as_count("din", "target_field", target_field, low=0)
    sequence_field = as_count("din", "sequence_field", sequence_field, low=0)
    if din_pooling not in DIN_POOLINGS:
      raise ValueError(f"din: din_pooling must be one of {DIN_POOLINGS}, got {din_pooling!r}")
    if max(target_field, sequence_field) >= num_fields or target_field == sequence_field:
      raise ValueError(f"din: target_field={target_field} and sequence_field={sequence_field} "
                       f"must be two different fields of {num_fields}")
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.target_field, self.sequence_field = target_field, sequence_field
    self.pooling = din_pooling
    self.attention = ActivationUnit(embed_dim, din_attention_dims, rngs=rngs)
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    self.mlp = MLP(num_fields * embed_dim + num_dense, mlp_dims, 1, rngs=rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array,
               sequences: tuple[tuple[jax.Array, jax.Array], ...] | None = None) -> jax.Array:
    """Maps `emb: [B, F, D]`, `dense: [B, Nd]` and `sequences` to logits `[B]`.

    Args:
      emb: the pooled fields.
      dense: the dense features.
      sequences: `((values [B, L, D], mask [B, L]), ...)`, one pair per sequence
        feature in layout order; the history is the first.

    Raises:
      ValueError: without sequences, or a history of another shape.
    """
    check_inputs("din", emb, dense, num_fields=self.num_fields, width=self.embed_dim + 1,
                 num_dense=self.num_dense)
    if not sequences:
      raise ValueError("din: needs the unpooled history (sequences=((values, mask), ...)); "
                       "build it with a feature layout holding a 'sequence' feature")
    history, mask = sequences[0]
    if history.ndim != 3 or history.shape[0] != emb.shape[0] or history.shape[2] != self.embed_dim + 1:
      raise ValueError(f"din: history values must be [{emb.shape[0]}, L, {self.embed_dim + 1}], got "
                       f"shape {tuple(history.shape)}")
    history = history[..., :-1]  # the vectors; the items' first-order weights are not attended
    vectors, first = split_first_order(emb)  # [B, F, D], [B, F]
    if tuple(mask.shape) != tuple(history.shape[:2]):
      raise ValueError(f"din: history mask must be {tuple(history.shape[:2])}, got "
                       f"{tuple(mask.shape)}")
    interest = target_attention(self.attention, history, mask, vectors[:, self.target_field],
                                self.pooling)
    s = self.sequence_field
    fields = jnp.concatenate([vectors[:, :s], interest[:, None], vectors[:, s + 1:]], axis=1)
    first = jnp.concatenate([first[:, :s], first[:, s + 1:]], axis=1)  # the interest has none
    deep_in = jnp.concatenate([fields.reshape(emb.shape[0], -1), dense], axis=1)  # [B, F*D+Nd]
    return (jnp.sum(first, axis=1) + self.dense_linear(dense) + fm_pairwise(fields)
            + self.mlp(deep_in)[:, 0])
