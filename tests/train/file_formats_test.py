"""End to end on files: synthetic rows written as Criteo TSV (.gz) and trained from disk."""

import pytest

from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.data.generated import synthetic
from sfjax.train import loop


@pytest.fixture(scope="module")
def criteo_files(tmp_path_factory):
  root = tmp_path_factory.mktemp("criteo")
  cfg = ctr.get_config("smoke").data.synthetic
  gen = synthetic.SyntheticCTR(cfg, seed=0)
  gen.write_criteo(str(root / "train_0.tsv.gz"), "train", 15_000)
  gen.write_criteo(str(root / "train_1.tsv"), "train", 15_000)
  gen.write_criteo(str(root / "eval.tsv.gz"), "eval", 5_000)
  return root


@pytest.mark.parametrize("mapping", [{"hash_rows": 2000},
                                     pytest.param({"min_count": 2}, marks=pytest.mark.slow)])
def test_train_from_criteo_files(criteo_files, mapping):
  c = ctr.get_config("smoke")
  c.data.format = "criteo"
  c.data.train_path = f"{criteo_files}/train_*"
  c.data.eval_path = f"{criteo_files}/eval.tsv.gz"
  c.data.hash_rows = mapping.get("hash_rows", 0)
  c.data.min_count = mapping.get("min_count", 1)
  c.train.steps, c.train.eval_every, c.train.num_devices = 120, 120, 1
  data = dataset_lib.make_dataset(c.data, c.seed)
  final, _ = loop.train_and_evaluate(c, dataset=data)
  assert final["step"] == 120 and final["bad_lines"] == 0
  assert final["auc"] > 0.65, final["auc"]  # the planted signal survives the hex round trip
  spec = data.spec
  assert spec.num_fields == 26 and spec.num_dense == 13
  if "hash_rows" in mapping:
    assert set(spec.field_rows) == {2000}
