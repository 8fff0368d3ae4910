"""Shared runner of the absl entry points under experiments/ (as subprocesses on CPU)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_module(module: str, *flags: str, timeout: int = 240) -> subprocess.CompletedProcess:
  """Runs `python -m module flags...` from the repository root on CPU; checks exit 0."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-m", module, *flags], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, r.stderr[-3000:]
  return r


@pytest.fixture
def run_bench(tmp_path):
  """`run_bench(module, *flags) -> dict`: the benchmark's final JSON line, checked equal
  to the file it wrote with `--out`."""

  def run(module: str, *flags: str) -> dict:
    out = tmp_path / f"{module.rsplit('.', 1)[-1]}.json"
    r = run_module(module, *flags, f"--out={out}")
    final = json.loads(r.stdout.strip().splitlines()[-1])
    assert final == json.loads(out.read_text())
    return final

  return run
