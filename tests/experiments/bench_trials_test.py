"""Smoke run of experiments/bench_trials.py: the final JSON line and --out file."""


def test_bench_trials_smoke(run_bench):
  final = run_bench("experiments.bench_trials", "--widths=1,2", "--steps=3",
                    "--cardinality_scale=1e-4", "--eval_rows=256", "--model=fm",
                    "--joint=3", "--joint_batch=3")
  assert final["benchmark"] == "bench_trials" and final["steps_per_trial"] == 3
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
