"""`python -m experiments.pipeline` on an image pipeline: `config.application = 'vision'` picks
sfjax.vision's steps; the report holds the searched result against the baseline."""

import json
import os
import subprocess
import sys

import ml_collections
import pytest

from experiments import pipeline as pipeline_cli
from sfjax.core.errors import ConfigError
from sfjax.vision import vision_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_digits_smoke_pipeline_from_the_cli(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-m", "experiments.pipeline",
                      "--config=experiments/configs/pipeline_digits.py:smoke",
                      f"--workdir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  report = json.loads(r.stdout.strip().splitlines()[-1])
  assert [(s["name"], s["status"]) for s in report["steps"]] == [
      ("darts", "done"), ("hpo", "done"), ("fully_train", "done")]
  assert 0 < report["baseline_test_accuracy"] <= 1 and 0 < report["final_test_accuracy"] <= 1
  assert report["final_step"] == "fully_train"


def test_the_application_field_picks_the_steps():
  config = ml_collections.ConfigDict({"application": "vision"})
  assert pipeline_cli.application(config) == (vision_steps.VISION_STEP_KINDS,
                                               vision_steps.vision_report)
  config.application = "speech"
  with pytest.raises(ConfigError, match="config field application: unknown value 'speech'"):
    pipeline_cli.application(config)
