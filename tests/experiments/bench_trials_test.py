"""Smoke run of experiments/bench_trials.py: the final JSON line and --out file."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_trials_smoke(tmp_path):
  out = tmp_path / "bench.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-m", "experiments.bench_trials", "--widths=1,2", "--steps=3",
                      "--cardinality_scale=1e-4", "--eval_rows=256", "--model=fm", f"--out={out}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert r.returncode == 0, r.stderr[-3000:]
  final = json.loads(r.stdout.strip().splitlines()[-1])
  assert final == json.loads(out.read_text())
  assert final["benchmark"] == "bench_trials" and final["steps_per_trial"] == 3
  assert final["eval_examples"] == 256 and final["arch"].startswith("fm/")
  rows = final["results"]
  assert [row["trials"] for row in rows] == [1, 2]
  for row in rows:
    assert row["failed"] == 0 and row["cohort_trials_per_hour"] > 0 and row["sequential_trials_per_hour"] > 0
    assert abs(row["speedup"] - row["sequential_seconds"] / row["cohort_seconds"]) < 1e-9
    assert row["max_auc_diff_vs_sequential"] < 1e-4  # the cohort computes the same trials
