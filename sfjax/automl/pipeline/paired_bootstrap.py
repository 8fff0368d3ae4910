"""Paired bootstrap of an AUC difference: is model A's win over model B beyond noise?

Both models score the same held-out rows; each resample draws rows with
replacement (Efron & Tibshirani 1993, ch. 13) and the same draw weights both
models' AUC, so the interval is of the paired difference. A resample's AUC is
computed from row weights (how often each row was drawn) over one fixed sort of
each model's scores, O(N) per resample instead of a new sort; ties count one
half (average ranks), as `sfjax.core.metrics.auc`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class _SortedScores(NamedTuple):
  """One model's scores sorted once, for weighted AUCs.

  Attributes:
    order: [N] int64 row order by ascending score.
    group_starts: [G] int64 start (in sorted order) of each run of equal scores.
  """

  order: np.ndarray
  group_starts: np.ndarray


def _sort_scores(scores: np.ndarray) -> _SortedScores:
  """Sorts [N] scores and finds the runs of ties."""
  order = np.argsort(scores, kind="stable")
  s = np.asarray(scores)[order]
  starts = np.concatenate([[0], np.flatnonzero(s[1:] != s[:-1]) + 1]).astype(np.int64)
  return _SortedScores(order, starts)


def _weighted_auc(sorted_scores: _SortedScores, labels: np.ndarray, weights: np.ndarray) -> float:
  """AUC of one model with per-row weights [N] (e.g. bootstrap draw counts).

  Returns NaN when the weighted positives or negatives sum to 0.
  """
  w = np.asarray(weights, dtype=np.float64)[sorted_scores.order]
  y = np.asarray(labels, dtype=np.float64)[sorted_scores.order]
  pos = np.add.reduceat(w * y, sorted_scores.group_starts)  # [G]
  neg = np.add.reduceat(w * (1.0 - y), sorted_scores.group_starts)
  total_pos, total_neg = pos.sum(), neg.sum()
  if total_pos <= 0 or total_neg <= 0:
    return float("nan")
  below = np.cumsum(neg) - neg  # weighted negatives with a strictly lower score
  return float(np.sum(pos * (below + 0.5 * neg)) / (total_pos * total_neg))


def paired_auc_bootstrap(labels: np.ndarray, scores_a: np.ndarray, scores_b: np.ndarray,
                         num_resamples: int = 1000, seed: int = 0,
                         confidence: float = 0.95) -> dict[str, Any]:
  """Bootstrap interval of AUC(a) - AUC(b) on the same rows.

  Args:
    labels: [N] 0/1 labels of the held-out rows.
    scores_a, scores_b: [N] the two models' scores (logits or probabilities) of those rows.
    num_resamples: bootstrap resamples (>= 2).
    seed: seed of the row draws.
    confidence: the interval's coverage, in (0, 1).

  Returns:
    {'auc_a', 'auc_b', 'diff' (auc_a - auc_b on all rows), 'low', 'high' (percentile
    interval of the resampled differences), 'stderr' (their standard deviation),
    'confidence', 'num_resamples', 'num_examples'}.

  Raises:
    ValueError: shapes differ, labels are not 0/1 of both classes, or a bad setting.
  """
  labels = np.asarray(labels, dtype=np.float64).ravel()
  scores_a, scores_b = np.asarray(scores_a).ravel(), np.asarray(scores_b).ravel()
  n = labels.size
  if scores_a.shape != (n,) or scores_b.shape != (n,):
    raise ValueError(f"paired bootstrap: labels [{n}] and scores {scores_a.shape} / "
                     f"{scores_b.shape} must have one entry per row")
  if not np.all((labels == 0) | (labels == 1)) or labels.min() == labels.max():
    raise ValueError("paired bootstrap: labels must be 0/1 with both classes present")
  if isinstance(num_resamples, bool) or int(num_resamples) != num_resamples or num_resamples < 2:
    raise ValueError(f"paired bootstrap: num_resamples must be an integer >= 2, got {num_resamples!r}")
  if not 0 < confidence < 1:
    raise ValueError(f"paired bootstrap: confidence must be in (0, 1), got {confidence!r}")
  sa, sb = _sort_scores(scores_a), _sort_scores(scores_b)
  ones = np.ones(n)
  auc_a, auc_b = _weighted_auc(sa, labels, ones), _weighted_auc(sb, labels, ones)
  rng = np.random.default_rng(seed)
  diffs = np.empty(int(num_resamples))
  for r in range(diffs.size):
    w = np.bincount(rng.integers(0, n, n), minlength=n)
    diffs[r] = _weighted_auc(sa, labels, w) - _weighted_auc(sb, labels, w)
  diffs = diffs[np.isfinite(diffs)]
  tail = 100 * (1 - confidence) / 2
  return {"auc_a": auc_a, "auc_b": auc_b, "diff": auc_a - auc_b,
          "low": float(np.percentile(diffs, tail)), "high": float(np.percentile(diffs, 100 - tail)),
          "stderr": float(np.std(diffs, ddof=1)), "confidence": float(confidence),
          "num_resamples": int(diffs.size), "num_examples": int(n)}
