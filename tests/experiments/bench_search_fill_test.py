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


def test_group_only_groups_the_same_proposals_at_every_ask_batch():
  # Issue #26's width target without training: a random search's proposals, grouped.
  config = bench_config.get_config("widths")
  config.search.study.num_trials, config.group_seeds = 16, 2
  config.search.task.data.synthetic.num_train = 4096
  final = bench_search_fill.run(config)
  assert final["mode"] == "group_only" and final["num_trials"] == 16
  asks = final["asks"]
  assert set(asks) == {"8", "32"}
  # grouping never changes what is asked: one digest, the same pairs at both batches
  assert asks["8"]["configs_digest"] == asks["32"]["configs_digest"]
  assert asks["8"]["pairs_tried"] == asks["32"]["pairs_tried"] >= 10
  for ask in asks.values():  # every trial in exactly one call of at most 8 lanes
    assert ask["mean_cohort_width"] * ask["programs"] == pytest.approx(16 * 2)
    assert 1.0 <= ask["mean_cohort_width"] <= 8.0
  # a larger ask has more proposals to share programs
  assert asks["32"]["mean_cohort_width"] > asks["8"]["mean_cohort_width"]
