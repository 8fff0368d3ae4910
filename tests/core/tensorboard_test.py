"""TensorBoard event files: which record fields become scalars, and reading them back."""

import math

import numpy as np

from sfjax.core import tensorboard


def test_scalar_items_keep_finite_numbers_and_flatten_dicts():
  record = {"step": 3, "auc": 0.5, "n": np.int64(4), "f": np.float32(0.25), "flag": True,
            "name": "x", "none": None, "nan": math.nan, "inf": math.inf, "list": [1, 2],
            "cache": {"hit_rate": 0.75, "deep": {"bytes": 10}}}
  assert dict(tensorboard._scalar_items(record)) == {
      "step": 3.0, "auc": 0.5, "n": 4.0, "f": 0.25, "cache/hit_rate": 0.75, "cache/deep/bytes": 10.0}


def test_written_scalars_read_back_and_a_purge_hides_later_steps(tmp_path):
  writer = tensorboard.EventWriter(str(tmp_path))
  assert writer.scalars(2, {"step": 2, "auc": 0.5, "name": "x"}, prefix="eval/") == 1
  writer.series("loss", 1, [3.0, 2.0, 1.0])
  writer.close()
  again = tensorboard.EventWriter(str(tmp_path), purge_step=3)  # same second: its own file
  again.series("loss", 3, [0.5])
  again.close()
  assert tensorboard.read_scalars(str(tmp_path)) == {
      "eval/auc": [(2, 0.5)], "loss": [(1, 3.0), (2, 2.0), (3, 0.5)]}
  assert tensorboard.read_scalars(str(tmp_path / "none")) == {}
