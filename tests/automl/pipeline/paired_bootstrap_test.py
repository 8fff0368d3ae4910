"""Tests of the paired AUC bootstrap."""

import numpy as np
import pytest

from sfjax.automl.pipeline import paired_bootstrap as pb
from sfjax.core import metrics


def test_weighted_auc_with_unit_weights_is_the_exact_auc_ties_included():
  rng = np.random.default_rng(0)
  y = (rng.random(3000) < 0.3).astype(np.float32)
  s = np.round(y + rng.normal(size=3000), 1)  # many ties
  np.testing.assert_allclose(pb._weighted_auc(pb._sort_scores(s), y, np.ones(3000)),
                             metrics.auc(y, s), rtol=1e-12)


def test_integer_weights_equal_repeated_rows():
  y = np.array([0, 1, 0, 1, 1, 0], np.float32)
  s = np.array([0.1, 0.4, 0.4, 0.3, 0.9, 0.2])
  w = np.array([2, 1, 0, 3, 1, 1])
  rep = np.repeat(np.arange(6), w)
  assert pb._weighted_auc(pb._sort_scores(s), y, w) == pytest.approx(metrics.auc(y[rep], s[rep]))
  assert np.isnan(pb._weighted_auc(pb._sort_scores(s), y, y * 0 + (y == 1)))  # no negatives


def test_interval_covers_the_difference_and_separates_a_real_win():
  rng = np.random.default_rng(1)
  y = (rng.random(20000) < 0.25).astype(np.float64)
  better = y + rng.normal(size=y.size)
  worse = y + 1.5 * rng.normal(size=y.size)
  r = pb.paired_auc_bootstrap(y, better, worse, num_resamples=200, seed=3)
  assert r["diff"] == pytest.approx(metrics.auc(y, better) - metrics.auc(y, worse))
  assert 0 < r["low"] < r["diff"] < r["high"] and 0 < r["stderr"] < r["diff"] / 3
  same = pb.paired_auc_bootstrap(y, better, better + 0.0, num_resamples=50)
  assert same["diff"] == 0 and same["low"] == same["high"] == same["stderr"] == 0
  # Pairing: two noisy copies of one model give a much narrower interval than two
  # independent-looking ones would (shared row noise cancels).
  close = pb.paired_auc_bootstrap(y, better, better + 0.01 * rng.normal(size=y.size),
                                  num_resamples=100)
  assert close["stderr"] < r["stderr"] / 5
  assert r == pb.paired_auc_bootstrap(y, better, worse, num_resamples=200, seed=3)


@pytest.mark.parametrize("kwargs, match", [
    ({"scores_b": np.zeros(3)}, "one entry per row"),
    ({"labels": np.array([0, 0, 0, 0])}, "both classes"),
    ({"labels": np.array([0, 2, 1, 0])}, "0/1"),
    ({"num_resamples": 1}, "num_resamples"),
    ({"confidence": 1.0}, "confidence"),
])
def test_bad_input_is_refused(kwargs, match):
  args = {"labels": np.array([0, 1, 1, 0]), "scores_a": np.arange(4.0), "scores_b": np.arange(4.0)}
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    pb.paired_auc_bootstrap(**args)
