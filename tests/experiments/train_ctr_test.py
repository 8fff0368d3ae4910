"""The absl entry point: overrides, metrics.jsonl, final JSON line, bad keys."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*args, timeout=240):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  return subprocess.run([sys.executable, "-m", "experiments.train_ctr", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)


def test_cli_overrides_and_outputs(tmp_path):
  r = _run("--config=experiments/configs/ctr.py:smoke", f"--workdir={tmp_path}",
           "--config.train.steps=20", "--config.train.eval_every=10", "--config.model.name=dcnv2",
           "--config.embedding.optimizer=ftrl", "--config.seed=3")
  assert r.returncode == 0, r.stderr[-3000:]
  final = json.loads(r.stdout.strip().splitlines()[-1])
  assert final["step"] == 20 and 0.4 < final["auc"] <= 1.0 and "oracle_auc" in final
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [x["step"] for x in records] == [10, 20]
  cfg = json.load(open(tmp_path / "config.json"))
  assert cfg["model"]["name"] == "dcnv2" and cfg["seed"] == 3
  assert "examples/s" in r.stderr and "ETA" in r.stderr


def test_cli_rejects_unknown_key(tmp_path):
  r = _run("--config=experiments/configs/ctr.py:smoke", f"--workdir={tmp_path}",
           "--config.train.stepz=20")
  assert r.returncode != 0
  assert "stepz" in r.stderr


def test_cli_rejects_bad_value_naming_field(tmp_path):
  r = _run("--config=experiments/configs/ctr.py:smoke", f"--workdir={tmp_path}",
           "--config.data.format=parquet")
  assert r.returncode != 0
  assert "data.format" in r.stderr
