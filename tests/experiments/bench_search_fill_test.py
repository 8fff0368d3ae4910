"""experiments/bench_search_fill.py: ragged and exact cohorts run the same search."""

import pytest

from experiments import bench_search_fill
from experiments.configs import search_ctr


def _tiny_asha():
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale = 8192, 2048, 0.0001
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 1024, 1024
  c.task.steps_per_budget_unit = 4
  c.space.families, c.space.mlp_widths = "deepfm", "8,16"
  c.study.algorithm, c.study.num_trials, c.study.cohort_width = "asha", 8, "4"
  c.study.min_budget, c.study.max_budget, c.study.eta = 1.0, 4.0, 2
  return c


def test_ragged_and_exact_cohorts_run_the_same_asha_search():
  out = bench_search_fill.measure(_tiny_asha(), ["ragged", "exact"])
  ragged, exact = out["ragged"], out["exact"]
  # The asks do not depend on how rounds are grouped into programs, and a ragged
  # program trains each trial as alone: the same trials, the same best trial.
  assert ragged["trials"] == exact["trials"] == 8
  assert ragged["best_valid_auc"] == pytest.approx(exact["best_valid_auc"], abs=1e-5)
  assert ragged["best_test_auc"] == pytest.approx(exact["best_test_auc"], abs=1e-5)
  # Ragged programs are unions of exact ones (here promotions [4, 8) join new trials
  # [0, 4) of their bucket); only they can idle.
  assert ragged["mean_cohort_width"] > exact["mean_cohort_width"]
  assert exact["lane_utilization"] == 1.0 and 0 < ragged["lane_utilization"] <= 1.0
  assert ragged["trials_per_hour"] > 0 and exact["seconds"] > 0


def test_unknown_mode_is_named():
  with pytest.raises(ValueError, match="unknown mode"):
    bench_search_fill.measure(_tiny_asha(), ["fast"])
