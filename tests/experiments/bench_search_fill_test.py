"""experiments/bench_search_fill.py: ragged and exact cohorts run the same search."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TINY_ASHA = (
    "--config=experiments/configs/search_ctr.py:smoke",
    "--config.task.data.synthetic.num_train=8192", "--config.task.data.synthetic.num_eval=2048",
    "--config.task.data.synthetic.cardinality_scale=0.0001", "--config.task.batch_size=64",
    "--config.task.eval_rows=1024", "--config.task.eval_batch_size=1024",
    "--config.task.steps_per_budget_unit=4", "--config.space.families=deepfm",
    "--config.space.mlp_widths=8,16", "--config.study.algorithm=asha",
    "--config.study.num_trials=8", "--config.study.cohort_width=4",
    "--config.study.min_budget=1.0", "--config.study.max_budget=4.0", "--config.study.eta=2")


def test_ragged_and_exact_cohorts_run_the_same_asha_search(run_bench):
  final = run_bench("experiments.bench_search_fill", *TINY_ASHA, "--modes=ragged,exact")
  assert final["benchmark"] == "bench_search_fill" and final["space"] == "ctr"
  assert final["algorithm"] == "asha" and final["num_trials"] == 8
  ragged, exact = final["modes"]["ragged"], final["modes"]["exact"]
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


def test_unknown_mode_is_named_before_anything_runs():
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-m", "experiments.bench_search_fill", *TINY_ASHA,
                      "--modes=ragged,fast"], cwd=ROOT, env=env, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode != 0 and "--modes: unknown mode(s) ['fast']" in r.stderr
