"""experiments/bench_trials.py in-process at smoke size: cohorts vs sequential, and the joint space."""

import pytest

from experiments import bench_trials
from experiments.configs import bench_trials as bench_config
from sfjax.core.errors import ConfigError


def test_bench_trials_smoke():
  config = bench_config.get_config("smoke")
  config.xla_cpu_dots = "eigen"
  final = bench_trials.run(config)
  assert final["benchmark"] == "bench_trials" and final["steps_per_trial"] == 3
  assert final["xla_cpu_dots"] == "eigen"
  assert final["eval_examples"] == 256 and final["arch"].startswith("fm/")
  rows = final["results"]
  assert [row["trials"] for row in rows] == [1, 2]
  for row in rows:
    assert row["failed"] == 0 and row["cohort_trials_per_hour"] > 0 and row["sequential_trials_per_hour"] > 0
    assert abs(row["speedup"] - row["sequential_seconds"] / row["cohort_seconds"]) < 1e-9
    assert row["max_auc_diff_vs_sequential"] < 1e-4  # the cohort computes the same trials
  joint = final["joint_space"]
  assert joint["trials"] == 3 and joint["failed"] == 0
  # Architecture-aware rounds: the round's 3 draws share one shape bucket, so one cohort.
  assert joint["fill"] and joint["buckets"] == 1 and joint["cohorts"] == 1
  assert joint["mean_cohort_width"] == 3
  assert joint["max_auc_diff_vs_sequential"] < 1e-4  # padded cohort == each trial alone
  assert joint["cohort_trials_per_hour"] > 0 and joint["sequential_trials_per_hour"] > 0


@pytest.mark.parametrize("widths", [(), (2, 0)])
def test_bad_widths_are_named(widths):
  config = bench_config.get_config("smoke")
  config.widths = widths
  with pytest.raises(ConfigError, match="config field widths: must list positive integers"):
    bench_trials.run(config)


def test_dispatch_search_config_runs_the_benchmarks_search_per_schedule():
  config = bench_config.get_config("dispatch")
  assert config.executor == "dask" and config.workers == 4 and config.widths == ()
  for schedule in bench_trials.SCHEDULES:
    search = bench_trials.dispatch_search_config(config, schedule)
    st = search.study
    assert (st.dispatch, st.executor, st.dask_workers) == (schedule, "dask", 4)
    assert (st.algorithm, st.num_trials, st.ask_batch, st.cohort_width) == ("asha", 32, 8, "4")
    assert len(search.space.families.split(",")) >= 3  # one shape bucket per family
    assert search.task.steps_per_budget_unit == config.steps


@pytest.mark.slow  # two Dask LocalClusters (each starts its worker processes)
@pytest.mark.timeout(600)
def test_bench_trials_dispatch_smoke():
  final = bench_trials.run(bench_config.get_config("dispatch_smoke"))
  assert final["results"] == []  # only the schedules
  schedules = final["dispatch"]["schedules"]
  assert set(schedules) == {"rounds", "async"}
  for name, row in schedules.items():
    assert (row["schedule"], row["executor"], row["slots"]) == (name, "dask", 2)
    assert row["num_trials_done"] == row["trials"] == 6 and row["num_failed"] == 0
    assert 0 < row["worker_busy_fraction"] <= 1 and row["trials_per_hour"] > 0
    assert final["worker_busy_fraction"][name] == row["worker_busy_fraction"]
    assert final["trials_per_hour"][name] == row["trials_per_hour"]
