"""A tiny served model for the endpoint's tests: trained on Criteo lines, exported as a bundle.

`make_served_bundle(root)` writes synthetic Criteo TSV (`SyntheticCTR.write_criteo`),
trains a small DeepFM on it for a few steps (`sfjax.train.train_and_evaluate`), exports
the run with the serving bundle writer and returns (bundle dir, held-out raw lines).
"""

import os

from experiments.configs import ctr
from sfjax.data import SyntheticCTR
from sfjax.serving import write_bundle
from sfjax.train import train_and_evaluate

DENSE_NAMES = tuple(f"I{i}" for i in range(1, 14))
FIELD_NAMES = tuple(f"C{i}" for i in range(1, 27))


def make_served_bundle(root) -> tuple[str, list[str]]:
  """(bundle dir, 300 raw held-out Criteo lines) of a DeepFM trained 4 steps on 26 x 500 rows."""
  root = str(root)
  c = ctr.get_config("smoke")
  gen = SyntheticCTR(c.data.synthetic, seed=0)
  gen.write_criteo(f"{root}/train.tsv", "train", 2_000)
  gen.write_criteo(f"{root}/eval.tsv", "eval", 300)
  c.data.format, c.data.hash_rows = "criteo", 500
  c.data.train_path, c.data.eval_path = f"{root}/train.tsv", f"{root}/eval.tsv"
  c.model.mlp_dims = (32, 16)
  c.train.steps, c.train.eval_every, c.train.batch_size, c.train.num_devices = 4, 4, 128, 1
  c.checkpoint.every_steps = 4
  train_and_evaluate(c, os.path.join(root, "run"))
  bundle = os.path.join(root, "bundle")
  write_bundle(os.path.join(root, "run"), bundle)
  with open(f"{root}/eval.tsv") as f:
    return bundle, [line.rstrip("\n") for line in f]


def line_to_dict(line: str) -> dict:
  """A raw Criteo line as a dict record {I1..I13, C1..C26: raw value} (the label dropped)."""
  return dict(zip(DENSE_NAMES + FIELD_NAMES, line.split("\t")[1:], strict=True))
