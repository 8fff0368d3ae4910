"""The planted click model behind the synthetic CTR data: a hidden factorization machine.

Labels of the synthetic rows (`sfjax.data.generated.synthetic`) come from an FM over the
learner's own features:

  logit = bias + sum_f w_f[id_f] + sum_{f<g} <v_f[id_f], v_g[id_g]> + beta . log1p(x)
  label ~ Bernoulli(sigmoid(logit))

so a DeepFM (first-order weights, embeddings of dim >= planted_dim, log1p dense
features) can represent it exactly; the AUC/logloss of the true probabilities is
the ceiling of any learner. Per-id values are N(0, 1) (factors N(0, 1/K)) times
a per-field importance (lognormal: a few fields and field pairs dominate, as in
real data, which gives AutoFIS-style searches something to find) times a
popularity decay (rank + 1) ** -EFFECT_DECAY (rank 0 = most frequent id), so
the signal lives in ids a learner sees often enough to estimate.

Determinism: planted values come from streams keyed by (seed, field): field
tables up to `_PLANTED_TABLE_CAP` rows are indexed by id; larger fields hash
(field, id) into a table of that size (colliding ids share values; memory stays
bounded).

Calibration: on a fixed sample of rows the three logit components are
standardised and mixed with fixed variance shares; then a global scale is
bisected, with the bias solved by Newton for each scale, so the sample's mean
click probability is `_TARGET_CTR` and the *expected* AUC of the true
probabilities (labels marginalised: no sampling noise) is `_TARGET_AUC`. Scale
and shares are folded into the tables, which stay a plain FM. The pairwise (FM)
share is 0.12 by default; `component_shares(interaction_share)` plants stronger (or
weaker) interactions, the other two components keeping their ratio (issue #26: smoke
searches and AutoFIS need pairs a small budget can find).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sfjax.core.hashing import splitmix64

_TARGET_CTR = 0.25  # Criteo Kaggle has 25.6% positives
_TARGET_AUC = 0.79  # expected oracle AUC; the best published Criteo models reach ~0.81
_PLANTED_TABLE_CAP = 1 << 18  # planted rows per field before ids are hashed
_COMPONENT_SHARES = (0.65, 0.12, 0.23)  # logit variance: first order, FM, dense
_EFFECT_DECAY = 0.75  # per-id values scale as (popularity rank + 1) ** -EFFECT_DECAY
_FIELD_IMPORTANCE_SIGMA = 1.0  # log-std of the per-field importance factors
# Parameter streams (second seed word); far from the row streams of `synthetic`.
_TABLE_STREAM, _WEIGHT_STREAM = 0x7AB1E, 0x3E16


class PlantedModel(NamedTuple):
  """The hidden FM; tables are concatenated over fields.

  Attributes:
    first_order: [R] float32 first-order weight per planted row.
    factors: [R, K] float32 latent factors per planted row.
    factor_sqnorm: [R] float32 |factors|^2 (saves a [N, F, K] product per row).
    table_offsets: [F] int64 start of each field's planted rows.
    hashed: [F] bool; True where field rows > PLANTED_TABLE_CAP (ids are hashed and
      the popularity decay is applied on the fly; elsewhere it is in the table).
    hash_keys: [F] uint64 per-field hash keys.
    rank_mul, rank_add: [F] int64; rank = ((id - rank_add) * rank_mul) mod n.
    field_rows: [F] int64 rows per field (n).
    dense_weights: [Nd] float64 weights of log1p(counts).
    bias: logit bias.
  """

  first_order: np.ndarray
  factors: np.ndarray
  factor_sqnorm: np.ndarray
  table_offsets: np.ndarray
  hashed: np.ndarray
  hash_keys: np.ndarray
  rank_mul: np.ndarray
  rank_add: np.ndarray
  field_rows: np.ndarray
  dense_weights: np.ndarray
  bias: float


def component_shares(interaction_share: float | None = None) -> tuple[float, float, float]:
  """Logit variance shares (first order, FM, dense) with the FM's share `interaction_share`.

  None keeps the default mix `_COMPONENT_SHARES` exactly; otherwise first order and
  dense split the rest in their default ratio (65 : 23).

  Raises:
    ValueError: `interaction_share` outside [0, 1].
  """
  if interaction_share is None:
    return _COMPONENT_SHARES
  share = float(interaction_share)
  if not 0.0 <= share <= 1.0:  # NaN fails too
    raise ValueError(f"interaction_share must be in [0, 1], got {interaction_share!r}")
  first, _, dense = _COMPONENT_SHARES
  rest = (1.0 - share) / (first + dense)
  return (first * rest, share, dense * rest)


def _popularity_decay(ranks: np.ndarray) -> np.ndarray:
  """(ranks + 1) ** -EFFECT_DECAY as float32: rare ids carry little signal."""
  return (np.asarray(ranks) + 1.0).astype(np.float32) ** np.float32(-_EFFECT_DECAY)


def init_planted_model(seed: int, field_rows: np.ndarray, perm_mul: np.ndarray, perm_add: np.ndarray,
                       num_dense: int, planted_dim: int) -> PlantedModel:
  """Uncalibrated planted FM (bias 0); field f's table is a function of (seed, f).

  Args:
    seed: data seed.
    field_rows: [F] int64 rows per field (n).
    perm_mul, perm_add: [F] int64 popularity rank -> id bijection of the row
      sampler, id = (perm_mul * rank + perm_add) mod n (perm_mul coprime to n).
    num_dense: Nd, number of dense features.
    planted_dim: K, planted factor dimension.

  Returns:
    The planted model with bias 0.
  """
  n = np.asarray(field_rows, dtype=np.int64)
  hashed = n > _PLANTED_TABLE_CAP
  weight_rng = np.random.default_rng([seed, _WEIGHT_STREAM])
  importance = np.exp(_FIELD_IMPORTANCE_SIGMA * weight_rng.standard_normal((2, n.size)))
  rank_mul = np.asarray([pow(int(a), -1, int(m)) if m > 1 else 0 for a, m in zip(perm_mul, n, strict=True)],
                        dtype=np.int64)
  first: list[np.ndarray] = []
  factors: list[np.ndarray] = []
  for f, rows in enumerate(np.minimum(n, _PLANTED_TABLE_CAP)):
    rng = np.random.default_rng([seed, _TABLE_STREAM, f])
    w = importance[0, f] * rng.standard_normal(rows)
    v = importance[1, f] * rng.standard_normal((rows, planted_dim)) / np.sqrt(planted_dim)
    if not hashed[f]:  # table row = id: fold the popularity decay in once
      decay = _popularity_decay(((np.arange(rows) - perm_add[f]) * rank_mul[f]) % rows)
      w, v = w * decay, v * decay[:, None]
    first.append(w.astype(np.float32))
    factors.append(v.astype(np.float32))
  table_rows = np.minimum(n, _PLANTED_TABLE_CAP)
  factor_table = np.concatenate(factors)
  return PlantedModel(
      first_order=np.concatenate(first), factors=factor_table,
      factor_sqnorm=np.sum(factor_table * factor_table, axis=1),
      table_offsets=np.concatenate([[0], np.cumsum(table_rows)[:-1]]).astype(np.int64), hashed=hashed,
      hash_keys=splitmix64(np.arange(n.size, dtype=np.uint64) ^ splitmix64(np.uint64(seed))),
      rank_mul=rank_mul, rank_add=np.array(perm_add, dtype=np.int64), field_rows=n.copy(),
      dense_weights=weight_rng.standard_normal(num_dense), bias=0.0)


def _table_index(model: PlantedModel, ids: np.ndarray) -> np.ndarray:
  """[N, F] int64 planted-table rows of local ids; hashed fields go through splitmix64."""
  index = ids + model.table_offsets
  for f in np.flatnonzero(model.hashed):
    index[:, f] = model.table_offsets[f] + (
        splitmix64(ids[:, f].astype(np.uint64) ^ model.hash_keys[f]) % np.uint64(_PLANTED_TABLE_CAP)).astype(np.int64)
  return index


def logit_components(model: PlantedModel, ids: np.ndarray, dense_counts: np.ndarray) -> np.ndarray:
  """Planted logit without the bias, split into parts.

  Args:
    model: the planted model.
    ids: [N, F] int64 local ids.
    dense_counts: [N, Nd] raw counts.

  Returns:
    [3, N] float64: first-order, FM and dense parts.
  """
  index = _table_index(model, ids)
  w = model.first_order[index]  # [N, F]
  v = model.factors[index]  # [N, F, K]
  sq = model.factor_sqnorm[index]  # [N, F]
  for f in np.flatnonzero(model.hashed):
    decay = _popularity_decay(((ids[:, f] - model.rank_add[f]) * model.rank_mul[f]) % model.field_rows[f])
    w[:, f] *= decay
    v[:, f] *= decay[:, None]
    sq[:, f] *= decay * decay
  total = v.sum(axis=1)  # [N, K]
  fm = 0.5 * (np.einsum("nk,nk->n", total, total, dtype=np.float64) - sq.sum(axis=1, dtype=np.float64))
  dense = np.log1p(dense_counts.astype(np.float64)) @ model.dense_weights
  return np.stack([w.sum(axis=1, dtype=np.float64), fm, dense])


def _expit(x: np.ndarray) -> np.ndarray:
  """Stable logistic function with one exp (metrics.sigmoid computes three)."""
  e = np.exp(-np.abs(x))
  return np.where(x >= 0, 1.0, e) / (1.0 + e)


def click_probabilities(model: PlantedModel, ids: np.ndarray, dense_counts: np.ndarray) -> np.ndarray:
  """[N] float64 true click probabilities sigmoid(logit) of rows ids [N, F], dense_counts [N, Nd]."""
  return _expit(logit_components(model, ids, dense_counts).sum(axis=0) + model.bias)


def _expected_auc(probs: np.ndarray, scores: np.ndarray) -> float:
  """AUC of `scores` averaged over labels ~ Bernoulli(probs), ties counted half.

  Sum over pairs i != j of p_i (1 - p_j) [s_i > s_j] over the sum of p_i (1 - p_j):
  the expected pair counts of the Mann-Whitney statistic.
  """
  order = np.argsort(scores, kind="stable")
  p, s = np.asarray(probs, dtype=np.float64)[order], np.asarray(scores)[order]
  neg = 1.0 - p
  run_id = np.cumsum(np.r_[True, s[1:] != s[:-1]]) - 1
  neg_per_run = np.bincount(run_id, weights=neg)
  neg_below = (np.cumsum(neg_per_run) - neg_per_run)[run_id]
  wins = np.sum(p * (neg_below + 0.5 * (neg_per_run[run_id] - neg)))
  return float(wins / (p.sum() * neg.sum() - np.sum(p * neg)))


def _calibrate_logits(z: np.ndarray, target_ctr: float, target_auc: float) -> tuple[float, float]:
  """(scale, bias) so sigmoid(scale*z + bias) has the target mean and expected AUC.

  The expected AUC grows with the scale (ranking fixed by z, labels less noisy):
  bisect the scale; for each, Newton-solve the bias for the mean (monotone in it).
  """
  z = np.sort(z)

  def bias_for(scale):
    bias = float(np.log(target_ctr / (1.0 - target_ctr)))
    for _ in range(100):
      p = _expit(scale * z + bias)
      gap = p.mean() - target_ctr
      if abs(gap) < 1e-10:
        break
      bias -= float(np.clip(gap / max(np.mean(p * (1.0 - p)), 1e-12), -4.0, 4.0))
    return bias

  lo, hi = 0.0, 30.0
  for _ in range(32):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if _expected_auc(_expit(mid * z + bias_for(mid)), z) < target_auc else (lo, mid)
  scale = 0.5 * (lo + hi)
  return scale, bias_for(scale)


def calibrate_planted_model(model: PlantedModel, ids: np.ndarray, dense_counts: np.ndarray,
                            shares: tuple[float, float, float] = _COMPONENT_SHARES) -> PlantedModel:
  """Standardises, mixes and scales the logit components on a calibration sample.

  Component i becomes sqrt(share_i) * (c_i - mean_i) / std_i; `_calibrate_logits`
  scales and biases the sum to `_TARGET_CTR` and `_TARGET_AUC`; everything is folded
  into the tables (first order and dense weights linearly, FM factors by the square
  root). Components that are constant (no dense features) drop out and the other
  shares are renormalised.

  Args:
    model: an uncalibrated planted model (from `init_planted_model`).
    ids: [N, F] int64 local ids of the calibration sample.
    dense_counts: [N, Nd] raw counts of the calibration sample.
    shares: logit variance shares (first order, FM, dense), `component_shares`.

  Returns:
    The calibrated planted model.
  """
  parts = logit_components(model, ids, dense_counts)
  mean, std = parts.mean(axis=1), parts.std(axis=1)
  live = (std > 1e-12) & (np.asarray(shares) > 0)
  mix = np.where(live, shares, 0.0)
  weights = np.sqrt(mix / mix.sum()) / np.where(live, std, 1.0)
  scale, bias = _calibrate_logits(weights @ (parts - mean[:, None]), _TARGET_CTR, _TARGET_AUC)
  w = scale * weights
  return model._replace(
      first_order=(model.first_order * w[0]).astype(np.float32),
      factors=(model.factors * np.sqrt(w[1])).astype(np.float32),
      factor_sqnorm=(model.factor_sqnorm * w[1]).astype(np.float32),
      dense_weights=model.dense_weights * w[2], bias=float(bias - w @ mean))


def _factor_rows(model: PlantedModel, ids: np.ndarray) -> np.ndarray:
  """[N, F, K] float32 planted factors v_f[id_f] of rows ids [N, F] (popularity decay applied)."""
  index = _table_index(model, ids)
  v = model.factors[index]  # [N, F, K]
  for f in np.flatnonzero(model.hashed):
    v[:, f] *= _popularity_decay(((ids[:, f] - model.rank_add[f]) * model.rank_mul[f]) % model.field_rows[f])[:, None]
  return v


def pair_logit_variance(model: PlantedModel, ids: np.ndarray) -> np.ndarray:
  """Variance of each pair's FM term <v_f[id_f], v_g[id_g]> of the planted logit over rows `ids`.

  The ground truth of interaction searches (AutoFIS): the per-field importance
  makes a few pairs carry most of this variance.

  Args:
    model: the (calibrated) planted model.
    ids: [N, F] int64 local ids (a sample of a split).

  Returns:
    [F, F] float64, symmetric, zero diagonal.
  """
  v = _factor_rows(model, np.asarray(ids, np.int64)).astype(np.float64)  # [N, F, K]
  num_fields = v.shape[1]
  variance = np.zeros((num_fields, num_fields))
  for f in range(num_fields - 1):  # one field at a time: [N, F] products, not [N, F, F]
    products = np.einsum("nk,ngk->ng", v[:, f], v[:, f + 1:])
    variance[f, f + 1:] = products.var(axis=0)
  return variance + variance.T
