"""Exact CTR metrics over a whole evaluation set (host-side numpy).

AUC is the Mann-Whitney statistic with tied scores given their average rank,
which equals the area under the ROC curve traced with ties as diagonal steps.
Computed in float64 over every (masked-in) example: no binning, no sampling.
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-7


def _flat_masked(labels, scores, mask):
  labels = np.asarray(labels, dtype=np.float64).reshape(-1)
  scores = np.asarray(scores, dtype=np.float64).reshape(-1)
  if labels.shape != scores.shape:
    raise ValueError(f"labels {labels.shape} and scores {scores.shape} differ in shape")
  if mask is not None:
    keep = np.asarray(mask).reshape(-1) > 0
    labels, scores = labels[keep], scores[keep]
  return labels, scores


def auc(labels, scores, mask=None) -> float:
  """Exact ROC AUC with average ranks for ties.

  Args:
    labels: [N] in {0, 1}.
    scores: [N] any monotone score (logits or probabilities).
    mask: optional [N]; examples with mask <= 0 are ignored.

  Returns:
    AUC in [0, 1], or NaN when only one class is present.
  """
  labels, scores = _flat_masked(labels, scores, mask)
  pos = labels > 0.5
  n_pos = int(pos.sum())
  n_neg = labels.size - n_pos
  if n_pos == 0 or n_neg == 0:
    return float("nan")
  order = np.argsort(scores, kind="mergesort")
  sorted_scores = scores[order]
  # Average rank (1-based) of each run of equal scores.
  run_start = np.r_[True, sorted_scores[1:] != sorted_scores[:-1]]
  run_id = np.cumsum(run_start) - 1
  starts = np.flatnonzero(run_start)
  ends = np.r_[starts[1:], sorted_scores.size]
  avg_rank = (starts + ends + 1) / 2.0
  ranks = np.empty_like(scores)
  ranks[order] = avg_rank[run_id]
  rank_sum = ranks[pos].sum()
  return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels, probs, mask=None) -> float:
  """Mean binary cross-entropy of probabilities (clipped to [1e-7, 1-1e-7])."""
  labels, probs = _flat_masked(labels, probs, mask)
  if labels.size == 0:
    return float("nan")
  p = np.clip(probs, _EPS, 1.0 - _EPS)
  return float(-np.mean(labels * np.log(p) + (1.0 - labels) * np.log1p(-p)))


def sigmoid(x) -> np.ndarray:
  """Numerically stable logistic function in float64."""
  x = np.asarray(x, dtype=np.float64)
  return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))
