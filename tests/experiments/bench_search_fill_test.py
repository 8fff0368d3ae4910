"""experiments/bench_search_fill.py: ragged and exact cohorts run the same search."""

import pytest

from experiments import bench_search_fill
from experiments.configs import bench_search_fill as bench_config
from sfjax.core.errors import ConfigError


def test_ragged_and_exact_cohorts_run_the_same_asha_search():
  final = bench_search_fill.run(bench_config.get_config("smoke"))
  assert final["benchmark"] == "bench_search_fill" and final["space"] == "ctr"
  assert final["algorithm"] == "asha" and final["num_trials"] == 8
  assert set(final["modes"]) == {"ragged", "exact"}
  ragged, exact = final["modes"]["ragged"], final["modes"]["exact"]
  # The asks do not depend on how rounds are grouped into programs, and a ragged
  # program trains each trial as alone: the same trials, the same best trial.
  assert ragged["trials"] == exact["trials"] == 8
  # Both modes train the algorithm's own proposals (issue #26): the same pairs tried.
  assert ragged["pairs_tried"] == exact["pairs_tried"] >= 1
  assert ragged["families_tried"] == 1 and ragged["optimizers_tried"] <= 5
  assert ragged["best_valid_auc"] == pytest.approx(exact["best_valid_auc"], abs=1e-5)
  assert ragged["best_test_auc"] == pytest.approx(exact["best_test_auc"], abs=1e-5)
  # Ragged programs are unions of exact ones (here promotions [4, 8) join new trials
  # [0, 4) of their bucket); only they can idle.
  assert ragged["mean_cohort_width"] > exact["mean_cohort_width"]
  assert exact["lane_utilization"] == 1.0 and 0 < ragged["lane_utilization"] <= 1.0
  assert ragged["trials_per_hour"] > 0 and exact["seconds"] > 0


@pytest.mark.parametrize("field,value,message", [
    ("modes", "ragged,fast", "config field modes: unknown ['fast']"),
    ("space", "cnn", "config field space: unknown 'cnn'")])
def test_bad_mode_or_space_is_named_before_anything_runs(field, value, message):
  config = bench_config.get_config("smoke")
  config[field] = value
  with pytest.raises(ConfigError) as err:
    bench_search_fill.run(config)
  assert message in str(err.value)
