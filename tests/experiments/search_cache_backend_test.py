"""`python -m experiments.search` over a table 37x larger than the device cache (issue #26
item 2): the cohorts train through one shared host table (`task.embedding_backend=cache`)
and the study reports its trials; a multi-fidelity algorithm is refused up front."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_TRIALS = 4
# ~34k table rows (cardinality 1e-3) behind a 900-row cache; batch 32 (832 unique at most).
CACHE = ("--config=experiments/configs/search_ctr.py:smoke", "--config.space.families=lr,fm",
         "--config.study.algorithm=random", f"--config.study.num_trials={NUM_TRIALS}",
         "--config.study.cohort_width=2", "--config.study.ask_batch=4",
         "--config.task.steps_per_budget_unit=5", "--config.task.eval_rows=1024",
         "--config.task.batch_size=32", "--config.task.data.synthetic.cardinality_scale=0.001",
         "--config.task.compact_rows=false", "--config.task.embedding_backend=cache",
         "--config.task.cache_rows=900", "--config.task.cache_lookahead=1")


def _run(workdir, *args, timeout=300):
  return subprocess.run([sys.executable, "-m", "experiments.search", *CACHE,
                         f"--workdir={workdir}", *args], cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""),
                        capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # a subprocess search (~40 s on 2 cores)
@pytest.mark.timeout(400)
def test_search_through_a_shared_host_table_reports_its_trials(tmp_path):
  r = _run(tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads(r.stdout.strip().splitlines()[-1])
  assert summary["num_trials_done"] == NUM_TRIALS and summary["num_failed"] == 0
  with open(tmp_path / "trials.jsonl") as f:
    trials = [json.loads(line) for line in f]
  assert sorted(t["trial_id"] for t in trials) == list(range(NUM_TRIALS))
  assert all(t["status"] == "done" and 0 < t["metrics"]["auc"] < 1 for t in trials)
  with open(tmp_path / "search.json") as f:
    assert json.load(f)["task"]["embedding_backend"] == "cache"


@pytest.mark.slow  # a subprocess (imports JAX)
@pytest.mark.timeout(120)
def test_multi_fidelity_search_is_refused(tmp_path):
  r = _run(tmp_path, "--config.study.algorithm=asha", timeout=120)
  assert r.returncode != 0
  assert "task.embedding_backend=cache: trials cannot resume" in r.stderr
