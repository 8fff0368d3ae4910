"""Tests for PBT's exploit / explore decision (sfjax/automl/algorithms/pbt.py)."""

import numpy as np
import pytest

from sfjax.automl.algorithms import pbt_exploit_explore
from sfjax.automl.space import Float, Space

SCORES = np.array([0.1, 0.9, 0.5, 0.3, 0.8, 0.2, 0.7, 0.4])  # best: 1, 4; worst: 0, 5
LR = np.arange(1, 9) * 0.01


def test_bottom_quantile_copies_top_and_perturbs():
  sources, factors = set(), set()
  for seed in range(30):
    source, new = pbt_exploit_explore(SCORES, {"lr": LR}, np.random.default_rng(seed))
    assert source.shape == (8,) and source.dtype == np.int64
    for i in (1, 2, 3, 4, 6, 7):  # not in the bottom quarter: untouched
      assert source[i] == i and new["lr"][i] == LR[i]
    for i in (0, 5):
      assert source[i] in (1, 4)
      sources.add(int(source[i]))
      factor = new["lr"][i] / LR[source[i]]
      assert factor == pytest.approx(0.8) or factor == pytest.approx(1.2)
      factors.add(round(factor, 6))
  assert sources == {1, 4} and factors == {0.8, 1.2}


def test_minimize_nan_and_quantile():
  scores = np.array([3.0, np.nan, 1.0, 2.0])
  source, _ = pbt_exploit_explore(scores, {}, np.random.default_rng(0), quantile=0.5,
                                  maximize=False)
  # Best (lowest) two: members 2 and 3; worst two: NaN member 1 and member 0.
  assert source[2] == 2 and source[3] == 3
  assert source[0] in (2, 3) and source[1] in (2, 3)
  one, _ = pbt_exploit_explore([0.5], {"lr": np.array([0.1])}, np.random.default_rng(0))
  assert one.tolist() == [0]


def test_explore_is_clipped_to_bounds_and_keeps_dtypes():
  batch = np.array([64, 128, 32, 16, 256, 8, 64, 32], dtype=np.int32)
  space = Space({"lr": Float(0.01, 0.08)})
  for seed in range(20):
    source, new = pbt_exploit_explore(SCORES, {"lr": LR, "batch": batch},
                                      np.random.default_rng(seed), perturb=(0.5, 3.0),
                                      bounds={"batch": (8, 200)})
    assert new["batch"].dtype == np.int32
    for i in (0, 5):
      parent = batch[source[i]]
      assert new["batch"][i] in (np.clip(round(parent * 0.5), 8, 200),
                                 np.clip(round(parent * 3.0), 8, 200))
    _, clipped = pbt_exploit_explore(SCORES, {"lr": LR}, np.random.default_rng(seed),
                                     perturb=(0.01, 100.0), bounds=space)
    assert clipped["lr"][0] in (0.01, 0.08) and clipped["lr"][5] in (0.01, 0.08)


def test_bad_inputs():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="quantile"):
    pbt_exploit_explore(SCORES, {}, rng, quantile=0.75)
  with pytest.raises(ValueError, match=r"hparams\['lr'\] has shape \(3,\)"):
    pbt_exploit_explore(SCORES, {"lr": np.zeros(3)}, rng)
