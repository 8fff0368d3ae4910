"""Tests for picking the fastest model within ΔAUC of the best (sfjax/automl/study/tradeoff.py),
on hand-made fronts."""

import dataclasses

import pytest

from sfjax.automl.study.tradeoff import select_within_auc


@dataclasses.dataclass
class _Trial:
  trial_id: int
  metrics: dict


# (auc, latency_ms): a front, fastest last
FRONT = [_Trial(0, {"auc": 0.800, "latency_ms": 9.0}), _Trial(1, {"auc": 0.797, "latency_ms": 4.0}),
         _Trial(2, {"auc": 0.790, "latency_ms": 2.0}), _Trial(3, {"auc": 0.700, "latency_ms": 0.5})]


@pytest.mark.parametrize("delta, chosen", [(0.0, 0), (0.002, 0), (0.003, 1), (0.005, 1),
                                           (0.01, 2), (0.099, 2), (0.1, 3), (1.0, 3)])
def test_the_fastest_within_delta_of_the_best(delta, chosen):
  assert select_within_auc(FRONT, delta).trial_id == chosen


def test_order_ties_records_and_other_metrics():
  # the front's order does not matter; a latency tie goes to the higher AUC, then the first
  assert select_within_auc(FRONT[::-1], 0.01).trial_id == 2
  tied = [_Trial(5, {"auc": 0.79, "latency_ms": 2.0}), _Trial(6, {"auc": 0.795, "latency_ms": 2.0}),
          _Trial(7, {"auc": 0.795, "latency_ms": 2.0})]
  assert select_within_auc(tied, 0.01).trial_id == 6
  # trials.jsonl records (dicts) work too, and other metric names
  records = [{"trial_id": 0, "metrics": {"test_auc": 0.7, "flops": 10.0}},
             {"trial_id": 1, "metrics": {"test_auc": 0.69, "flops": 3.0}}]
  assert select_within_auc(records, 0.02, auc="test_auc", latency="flops")["trial_id"] == 1
  assert select_within_auc(records, 0.0, auc="test_auc", latency="flops")["trial_id"] == 0


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="front is empty"):
    select_within_auc([], 0.01)
  for delta in (-0.1, float("inf"), float("nan"), True, "0.1"):
    with pytest.raises(ValueError, match="delta must be a finite number"):
      select_within_auc(FRONT, delta)
  missing = [*FRONT, _Trial(9, {"auc": 0.9})]
  with pytest.raises(ValueError, match="member 4 has no finite 'latency_ms'"):
    select_within_auc(missing, 0.01)
  with pytest.raises(ValueError, match="member 0 has no finite 'auc'"):
    select_within_auc([_Trial(0, {"auc": float("nan"), "latency_ms": 1.0})], 0.01)
