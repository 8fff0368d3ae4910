"""`python -m experiments.plot` on a real (tiny) cache run: PNGs beside metrics.jsonl, and the
run's TensorBoard event files hold every step's loss and each eval."""

import json
import os
import subprocess
import sys

from experiments.configs import ctr
from sfjax.core import tensorboard
from sfjax.train import loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_plot_cli_writes_the_run_figures(tmp_path):
  c = ctr.get_config("smoke")
  c.train.steps, c.train.eval_every, c.train.num_devices = 12, 6, 1
  c.embedding.backend, c.embedding.cache_rows = "cache", 32768
  loop.train_and_evaluate(c, str(tmp_path))
  scalars = tensorboard.read_scalars(str(tmp_path))
  assert [s for s, _ in scalars["train/loss"]] == list(range(1, 13))
  assert [s for s, _ in scalars["eval/eval_auc"]] == [6, 12]
  assert "eval/cache_hit_rate" in scalars

  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-m", "experiments.plot", f"--workdir={tmp_path}"], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert sorted(os.path.basename(p) for p in out["plots"]) == ["cache_curves.png",
                                                              "training_curves.png"]
  for path in out["plots"]:
    assert os.path.getsize(path) > 1000
  empty = tmp_path / "empty"
  empty.mkdir()
  r = subprocess.run([sys.executable, "-m", "experiments.plot", f"--workdir={empty}"], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "no metrics.jsonl, trials.jsonl or report.json" in r.stderr
