"""`python -m experiments.pipeline` on an image pipeline: `config.application = 'vision'` picks
sfjax.vision's steps (their checks and their report). The digits smoke pipeline runs end to end
once in the suite, in-process: tests/vision/vision_steps_test.py."""

import os
import subprocess
import sys

import ml_collections
import pytest

from experiments import pipeline as pipeline_cli
from sfjax.core.errors import ConfigError
from sfjax.vision import vision_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_cli_checks_a_vision_config_with_the_vision_steps(tmp_path):
  # The digits smoke pipeline itself runs once, in tests/vision/vision_steps_test.py: here the
  # CLI only has to route a vision config to sfjax.vision's step checks (the CTR steps know
  # no `darts` step) and stop before any step runs.
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  workdir = tmp_path / "digits"
  r = subprocess.run([sys.executable, "-m", "experiments.pipeline",
                      "--config=experiments/configs/pipeline_digits.py:smoke",
                      f"--workdir={workdir}", "--config.steps.darts.steps=0"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stderr[-3000:]
  assert "config field steps.darts.steps: must be >= 1, got 0" in r.stderr
  assert not workdir.exists()


def test_the_application_field_picks_the_steps():
  config = ml_collections.ConfigDict({"application": "vision"})
  assert pipeline_cli.application(config) == (vision_steps.VISION_STEP_KINDS,
                                               vision_steps.vision_report)
  config.application = "speech"
  with pytest.raises(ConfigError, match="config field application: unknown value 'speech'"):
    pipeline_cli.application(config)
