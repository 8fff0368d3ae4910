"""Exact AUC / logloss against brute-force references."""

import numpy as np
import pytest

from sfjax.core import metrics


def _pairwise_auc(y, s):
  pos, neg = s[y == 1], s[y == 0]
  diff = pos[:, None] - neg[None, :]
  return ((diff > 0).sum() + 0.5 * (diff == 0).sum()) / (pos.size * neg.size)


def _trapezoid_auc(y, s):
  # ROC by thresholding at every distinct score, ties as diagonal segments.
  thresholds = np.unique(s)[::-1]
  tpr = [0.0] + [(s[y == 1] >= t).mean() for t in thresholds]
  fpr = [0.0] + [(s[y == 0] >= t).mean() for t in thresholds]
  return float(np.trapezoid(tpr, fpr))


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_references_with_ties(seed):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, 600)
  s = np.round(rng.normal(size=600) + 0.7 * y, 1)  # many ties
  got = metrics.auc(y, s)
  assert abs(got - _pairwise_auc(y, s)) < 1e-6
  assert abs(got - _trapezoid_auc(y, s)) < 1e-6


def test_auc_hand_case_and_mask():
  y = np.array([0, 0, 1, 1, 1])
  s = np.array([0.1, 0.4, 0.35, 0.8, 0.4])
  # pairs: (0.35 vs .1 win, vs .4 lose), (.8 win win), (.4 win, tie) -> 4.5/6
  assert metrics.auc(y, s) == pytest.approx(4.5 / 6)
  mask = np.array([1, 0, 1, 1, 1])
  assert metrics.auc(y, s, mask) == pytest.approx(1.0)
  assert np.isnan(metrics.auc(np.ones(3), np.arange(3)))


def test_logloss():
  y = np.array([1.0, 0.0])
  p = np.array([0.8, 0.3])
  assert metrics.logloss(y, p) == pytest.approx(-(np.log(0.8) + np.log(0.7)) / 2)
  assert metrics.logloss(y, p, np.array([1, 0])) == pytest.approx(-np.log(0.8))
  assert np.isfinite(metrics.logloss(y, np.array([0.0, 1.0])))


def test_sigmoid_stable():
  x = np.array([-1000.0, 0.0, 1000.0])
  np.testing.assert_allclose(metrics.sigmoid(x), [0.0, 0.5, 1.0])
