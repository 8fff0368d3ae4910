"""The absl entry point `python -m experiments.preprocess`: text files in, a trainable DIR out."""

import json
import os
import subprocess
import sys

from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.data.generated import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(*flags):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  return subprocess.run([sys.executable, "-m", "experiments.preprocess", *flags], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=240)


def test_cli_preprocesses_and_refuses_a_used_directory(tmp_path):
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(tmp_path / "train.tsv"), "train", 900)
  gen.write_criteo(str(tmp_path / "eval.tsv.gz"), "eval", 200)
  out = tmp_path / "pre"
  flags = ("--config=experiments/configs/ctr.py", "--config.data.format=criteo",
           f"--config.data.train_path={tmp_path}/train.tsv",
           f"--config.data.eval_path={tmp_path}/eval.tsv.gz", "--config.data.min_count=2",
           f"--out={out}", "--rows_per_shard=400")
  r = _run(*flags)
  assert r.returncode == 0, r.stderr[-3000:]
  final = json.loads(r.stdout.strip().splitlines()[-1])
  assert final["mapping"] == "vocabulary" and final["source_format"] == "criteo"
  assert final["splits"]["train"] == {"num_examples": 900, "num_shards": 3, "bad_lines": 0}
  assert sorted(os.listdir(out)) == ["eval", "mapping.json", "spec.json", "train", "vocabulary"]

  c = ctr.get_config().data
  c.format, c.train_path = "preprocessed", str(out)
  data = dataset_lib.make_dataset(c, seed=0)
  assert list(data.spec.field_rows) == final["field_rows"] and data.eval_splits == ("eval",)

  again = _run(*flags)
  assert again.returncode != 0 and f"{out}: output directory is not empty" in again.stderr
  assert _run(*flags, "--overwrite").returncode == 0


def test_cli_errors_are_one_line_naming_the_path(tmp_path):
  flags = ("--config=experiments/configs/ctr.py", "--config.data.format=criteo",
           f"--config.data.eval_path={tmp_path}/none.tsv", f"--out={tmp_path / 'pre'}")
  r = _run(*flags, f"--config.data.train_path={tmp_path}")
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert r.stderr.strip().splitlines()[-1].startswith(
      f"error: config field data.train_path: {tmp_path} is a directory; format 'criteo' reads files")
  r = _run(*flags, f"--config.data.train_path={tmp_path}/none.tsv")
  assert r.returncode == 2
  assert r.stderr.strip().splitlines()[-1] == (
      f"error: config field data.train_path: {tmp_path}/none.tsv matches no file")
  assert not (tmp_path / "pre").exists()
