"""`python -m experiments.pipeline`'s errors: one line, exit 2, a busy workdir named (the
smoke pipeline itself, killed and rerun, is pipeline_ctr_test.py)."""

import os
import subprocess
import sys

from sfjax.core import workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(workdir, *flags):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  return subprocess.run([sys.executable, "-m", "experiments.pipeline",
                         "--config=experiments/configs/pipeline_ctr.py:smoke",
                         f"--workdir={workdir}", *flags],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_an_unknown_top_level_key_names_the_closest_in_one_line(tmp_path):
  r = _run(tmp_path / "w", "--config.sed=1")
  assert r.returncode == 2 and r.stderr.count("\n") == 1
  assert r.stderr.startswith("error: config field sed: unknown key; did you mean seed?")
  assert not (tmp_path / "w").exists()


def test_a_second_pipeline_on_a_busy_workdir_fails_at_once_naming_the_holder(tmp_path):
  with workdir_lock.hold_workdir(str(tmp_path), "the test"):
    r = _run(tmp_path)
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert r.stderr.strip().splitlines()[-1].startswith(
      f"error: {tmp_path} is in use by pid {os.getpid()} on ")
  assert not (tmp_path / "steps").exists()
