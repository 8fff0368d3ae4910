"""`python -m experiments.export --serving`: a bundle the predictor loads, its summary line."""

import json
import os
import subprocess
import sys

import numpy as np

from sfjax.core import hold_workdir
from sfjax.serving import Features, Predictor
from tests.serving import tiny_runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_export_serving_writes_a_bundle_the_predictor_scores(tmp_path):
  run = tiny_runs.train_run(tmp_path)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  out = tmp_path / "bundle"
  r = subprocess.run([sys.executable, "-m", "experiments.export", f"--workdir={run.workdir}",
                      "--serving", f"--out={out}", "--dtype=int8"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=240)
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads(r.stdout.strip().splitlines()[-1])
  assert (summary["dtype"], summary["model"], summary["step"], summary["num_fields"]) == (
      "int8", "deepfm", 4, run.data.spec.num_fields)
  assert summary["metrics"]["auc"] == run.metrics["auc"]
  logits, ids, dense, _ = tiny_runs.trainer_logits(run)
  got = Predictor.load(str(out), batch_sizes=(512,)).logits_features(Features(ids, dense))
  assert np.corrcoef(got, logits)[0, 1] > 0.99  # int8 rows: close, not equal
  # A second owner of the workdir, a missing workdir: one line each, nothing created.
  with hold_workdir(run.workdir, "a live run"):
    r = subprocess.run([sys.executable, "-m", "experiments.export", f"--workdir={run.workdir}",
                        "--serving", f"--out={tmp_path / 'b2'}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
  assert r.stderr.strip().splitlines()[-1].startswith("error: ") and f"in use by pid {os.getpid()}" in r.stderr
  assert not (tmp_path / "b2").exists()
  r = subprocess.run([sys.executable, "-m", "experiments.export", f"--workdir={tmp_path}/none",
                      f"--out={tmp_path / 'b3'}"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=240)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
      f"error: --workdir={tmp_path}/none: no such run directory")
  assert not (tmp_path / "none").exists() and not (tmp_path / "b3").exists()
