"""`python -m experiments.export` on a tiny trained run: the summary line and the files."""

import json
import os
import subprocess
import sys

import numpy as np

from experiments.configs import ctr
from sfjax.train import loop

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_export_cli_writes_a_numpy_readable_table(tmp_path):
  c = ctr.get_config("smoke")
  c.train.num_devices, c.train.steps, c.train.eval_every, c.train.batch_size = 1, 4, 4, 128
  c.embedding.backend, c.embedding.cache_rows = "cache", 0.25
  c.checkpoint.every_steps = 4
  loop.train_and_evaluate(c, str(tmp_path / "run"))
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  r = subprocess.run([sys.executable, "-m", "experiments.export", f"--workdir={tmp_path / 'run'}",
                      f"--out={tmp_path / 'out'}"], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=240)
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.loads(r.stdout.strip().splitlines()[-1])
  assert summary["step"] == 4 and summary["mapping"] == "synthetic"
  manifest = json.load(open(tmp_path / "out" / "export.json"))
  values = np.concatenate([np.load(tmp_path / "out" / e["file"]) for e in manifest["values"]])
  assert values.shape == (summary["num_rows"], summary["width"]) and np.isfinite(values).all()
