"""The planted click model behind the synthetic multi-hot data (`sfjax.data.generated.multihot`).

Every table t holds hidden per-row values: a first-order weight w_t[r] and a vector
v_t[r] in R^K, both scaled by a popularity decay (rank + 1) ** -EFFECT_DECAY (rank 0 =
the most frequent id), so the signal lives in ids a learner sees often. The logit has
four parts, each a function of what the learner sees:

  first_order  sum over the one-hot fields f of w_f[id_f]
  bags         sum over bags b of <pool_b(v_b[bag ids], weights), v_p(b)[id_p(b)]>:
               the bag's pooled vectors (its own pooling: sum / mean / sqrtn, per-id
               weights) dotted with the vector of a partner one-hot field (user for even
               bags, the target item for odd ones) -- bag CONTENTS matter, not only sizes
  history      max over the history items h_j of cos(v_item[target], v_item[h_j]):
               target-vs-history similarity. A max is what target attention (DIN, a
               softmax over the history weighted by its similarity to the target)
               approximates; a mean-pooled history sees only the average similarity.
  dense        beta . x

  logit = bias + logit_scale * sum_i sqrt(share_i) * (part_i - mean_i) / std_i
  label ~ Bernoulli(sigmoid(logit))

Calibration (`calibrate_multihot_model`): the parts' means and standard deviations
come from a calibration sample no split yields; the shares are the parts' variance
fractions of logit_scale^2 (they need not sum to 1, so a zero share removes a part
and lowers the oracle AUC instead of being renormalised away); the bias is solved
by Newton so the sample's mean click probability is `target_ctr`.

Determinism: table t's values come from `default_rng([seed, _TABLE_STREAM, t])`, the
dense weights from `default_rng([seed, _DENSE_STREAM])`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sfjax.core.feature_layout import FeatureLayout

PARTS = ("first_order", "bags", "history", "dense")
_EFFECT_DECAY = 0.5  # per-id values scale as (popularity rank + 1) ** -EFFECT_DECAY
# Parameter streams (second seed word); far from the row streams of `multihot`.
_TABLE_STREAM, _DENSE_STREAM = 0x7AB2E, 0x3E17


class MultihotPlanted(NamedTuple):
  """The hidden model; per-table values concatenated in the layout's table order.

  Attributes:
    first_order: [V] float32 first-order weight per row of the concatenated table.
    vectors: [V, K] float32 planted vector per row.
    unit_item: [I, K] float32 the item table's vectors normalised to unit length.
    dense_weights: [Nd] float64 weights of the dense features.
    part_means: [4] float64 calibration means of the parts (PARTS order).
    part_weights: [4] float64 logit_scale * sqrt(share) / std per part.
    bias: logit bias.
  """

  first_order: np.ndarray
  vectors: np.ndarray
  unit_item: np.ndarray
  dense_weights: np.ndarray
  part_means: np.ndarray
  part_weights: np.ndarray
  bias: float


class FeatureRoles(NamedTuple):
  """Which features of the layout play which part in the planted logit.

  Attributes:
    one_hot: indices of the one-hot features (first-order part).
    bags: (bag feature, partner one-hot feature) pairs (bag part).
    target: the target item feature; history: the sequence feature of its table.
  """

  one_hot: tuple[int, ...]
  bags: tuple[tuple[int, int], ...]
  target: int
  history: int


def _popularity_decay(ranks: np.ndarray) -> np.ndarray:
  return (np.asarray(ranks, np.float64) + 1.0) ** -_EFFECT_DECAY


def init_multihot_model(seed: int, layout: FeatureLayout, perm_mul: np.ndarray, perm_add: np.ndarray,
                        item_table: int, num_dense: int, planted_dim: int) -> MultihotPlanted:
  """Uncalibrated planted values (part means 0, weights 1, bias 0).

  Args:
    seed: data seed.
    layout: the data set's feature layout (tables in row order).
    perm_mul, perm_add: [T] int64 popularity rank -> id bijection of each table,
      id = (perm_mul * rank + perm_add) mod rows.
    item_table: index of the table the target and the history read.
    num_dense: Nd.
    planted_dim: K.

  Returns:
    The planted model before calibration.
  """
  first, vectors = [], []
  for t, table in enumerate(layout.tables):
    rows = int(table.num_rows)
    rng = np.random.default_rng([seed, _TABLE_STREAM, t])
    inverse = pow(int(perm_mul[t]), -1, rows) if rows > 1 else 0
    decay = _popularity_decay(((np.arange(rows) - perm_add[t]) * inverse) % rows)
    first.append((rng.standard_normal(rows) * decay).astype(np.float32))
    v = rng.standard_normal((rows, planted_dim)) / np.sqrt(planted_dim)
    vectors.append((v * decay[:, None]).astype(np.float32))
  item = vectors[item_table].astype(np.float64)
  unit = item / np.maximum(np.linalg.norm(item, axis=1, keepdims=True), 1e-12)
  return MultihotPlanted(
      first_order=np.concatenate(first), vectors=np.concatenate(vectors),
      unit_item=unit.astype(np.float32),
      dense_weights=np.random.default_rng([seed, _DENSE_STREAM]).standard_normal(num_dense),
      part_means=np.zeros(len(PARTS)), part_weights=np.ones(len(PARTS)), bias=0.0)


def _pool(values: np.ndarray, weights: np.ndarray, pooling: str) -> np.ndarray:
  """`values [N, L, K]`, `weights [N, L]` -> [N, K], as `sfjax.models.behavior.pooling.pool_bag`."""
  total = np.einsum("nlk,nl->nk", values, weights)
  if pooling == "sum":
    return total
  norm = weights.sum(axis=1) if pooling == "mean" else np.sqrt((weights * weights).sum(axis=1))
  return total / np.where(norm > 0, norm, 1.0)[:, None]


def multihot_logit_parts(model: MultihotPlanted, layout: FeatureLayout, roles: FeatureRoles,
                         ids: np.ndarray, weights: np.ndarray, dense: np.ndarray) -> np.ndarray:
  """The raw (uncalibrated) logit parts of rows.

  Args:
    model: the planted model.
    layout: the feature layout.
    roles: which features feed which part.
    ids: [N, S] int64 local ids, -1 in padding columns.
    weights: [N, S] float32 per-id weights, 0 in padding columns.
    dense: [N, Nd] float32 dense features.

  Returns:
    [4, N] float64 parts in PARTS order.
  """
  offsets = layout.column_offsets
  rows = np.where(ids >= 0, ids + offsets, 0)  # [N, S] rows of the concatenated table

  def one(f):
    return rows[:, layout.columns(f).start]

  first = sum(model.first_order[one(f)].astype(np.float64) for f in roles.one_hot)
  bags = np.zeros(ids.shape[0])
  for bag, partner in roles.bags:
    cols = layout.columns(bag)
    pooled = _pool(model.vectors[rows[:, cols]], weights[:, cols], layout.features[bag].pooling)
    bags += np.einsum("nk,nk->n", pooled, model.vectors[one(partner)], dtype=np.float64)
  item_offset = offsets[layout.columns(roles.target).start]
  hist_cols = layout.columns(roles.history)
  target = model.unit_item[one(roles.target) - item_offset]  # [N, K]
  hist = model.unit_item[np.maximum(ids[:, hist_cols], 0)]  # [N, L, K]
  sims = np.einsum("nk,nlk->nl", target, hist, dtype=np.float64)
  sims = np.where(ids[:, hist_cols] >= 0, sims, -np.inf).max(axis=1)
  history = np.where(np.isfinite(sims), sims, 0.0)  # an empty history adds nothing
  dense_part = dense.astype(np.float64) @ model.dense_weights
  return np.stack([first, bags, history, dense_part])


def _expit(x: np.ndarray) -> np.ndarray:
  e = np.exp(-np.abs(x))
  return np.where(x >= 0, 1.0, e) / (1.0 + e)


def multihot_probabilities(model: MultihotPlanted, parts: np.ndarray) -> np.ndarray:
  """[N] float64 click probabilities from raw parts [4, N] (`multihot_logit_parts`)."""
  return _expit(model.part_weights @ (parts - model.part_means[:, None]) + model.bias)


def _bias_for_ctr(z: np.ndarray, target_ctr: float) -> float:
  """The bias b with mean(sigmoid(z + b)) = target_ctr (Newton; monotone in b)."""
  bias = float(np.log(target_ctr / (1.0 - target_ctr)))
  for _ in range(100):
    p = _expit(z + bias)
    gap = p.mean() - target_ctr
    if abs(gap) < 1e-10:
      break
    bias -= float(np.clip(gap / max(np.mean(p * (1.0 - p)), 1e-12), -4.0, 4.0))
  return bias


def calibrate_multihot_model(model: MultihotPlanted, parts: np.ndarray, shares, logit_scale: float,
                             target_ctr: float) -> MultihotPlanted:
  """Standardises and mixes the parts (see the module docstring) and solves the bias.

  Args:
    model: an uncalibrated model (`init_multihot_model`).
    parts: [4, N] raw parts of the calibration sample.
    shares: [4] variance shares of the parts (>= 0); a constant part drops out.
    logit_scale: standard deviation of the logit when the shares sum to 1.
    target_ctr: mean click probability of the calibration sample.

  Returns:
    The calibrated model.
  """
  mean, std = parts.mean(axis=1), parts.std(axis=1)
  live = std > 1e-12
  root_shares = np.sqrt(np.asarray(shares, np.float64))
  weights = np.where(live, logit_scale * root_shares / np.where(live, std, 1.0), 0.0)
  bias = _bias_for_ctr(weights @ (parts - mean[:, None]), target_ctr)
  return model._replace(part_means=mean, part_weights=weights, bias=bias)
