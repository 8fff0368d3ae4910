"""Tests for Pareto fronts (sfjax/automl/pareto.py)."""

import numpy as np
import pytest

from sfjax.automl.pareto import non_dominated_sort, pareto_front

# (auc, params, latency_ms): maximise auc, minimise the others.
POINTS = np.array([
    [0.80, 2e6, 5.0],  # 0: front
    [0.79, 1e6, 5.0],  # 1: front (fewer params)
    [0.78, 2e6, 6.0],  # 2: dominated by 0 and 1
    [0.81, 3e6, 9.0],  # 3: front (best auc)
    [0.79, 1e6, 5.0],  # 4: equal to 1, so on the front too
    [0.70, 5e5, 1.0],  # 5: front (smallest and fastest)
    [0.70, 6e5, 1.0],  # 6: dominated by 5
    [np.nan, 1e5, 0.5],  # 7: NaN metric: left out
])
DIRECTIONS = ("maximize", "minimize", "minimize")


def test_pareto_front_by_hand():
  assert pareto_front(POINTS, DIRECTIONS).tolist() == [0, 1, 3, 4, 5]


def test_non_dominated_sort_by_hand():
  fronts = [f.tolist() for f in non_dominated_sort(POINTS, DIRECTIONS)]
  assert fronts == [[0, 1, 3, 4, 5], [2, 6], [7]]


def test_directions_matter():
  points = np.array([[1.0, 1.0], [2.0, 2.0], [1.0, 2.0]])
  assert pareto_front(points, ("minimize", "minimize")).tolist() == [0]
  assert pareto_front(points, ("maximize", "maximize")).tolist() == [1]
  assert pareto_front(points, ("minimize", "maximize")).tolist() == [2]
  assert pareto_front(np.zeros((0, 2)), ("minimize", "minimize")).tolist() == []


def test_bad_inputs():
  with pytest.raises(ValueError, match="2 directions for 3 objectives"):
    pareto_front(POINTS, ("maximize", "minimize"))
  with pytest.raises(ValueError, match="'up'"):
    pareto_front(POINTS, ("up", "minimize", "minimize"))
  with pytest.raises(ValueError, match=r"\[N, M\]"):
    pareto_front(np.zeros(3), ("minimize",))
