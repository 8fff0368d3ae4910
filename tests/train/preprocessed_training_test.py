"""Training from preprocessed shards equals training from the Criteo text they came from."""

import math

import pytest

from experiments.configs import ctr
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.data import preprocessed
from sfjax.data.generated import synthetic
from sfjax.train import config_check, loop


@pytest.fixture(scope="module")
def criteo_files(tmp_path_factory):
  root = tmp_path_factory.mktemp("criteo")
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / "train_0.tsv.gz"), "train", 6_000)
  gen.write_criteo(str(root / "train_1.tsv"), "train", 4_000)
  gen.write_criteo(str(root / "eval.tsv"), "eval", 3_000)
  return root


def _config(**data):
  c = ctr.get_config("smoke")
  c.train.steps, c.train.eval_every, c.train.num_devices = 40, 20, 1
  c.train.batch_size = 512  # 40 steps = 2 epochs of 10k lines, batches straddle the boundary
  for k, v in data.items():
    c.data[k] = v
  return c


@pytest.mark.parametrize("mapping", [{"hash_rows": 3000},
                                     pytest.param({"min_count": 2}, marks=pytest.mark.slow)])
def test_text_and_shards_train_to_the_same_metrics(criteo_files, tmp_path, mapping):
  text = _config(format="criteo", train_path=f"{criteo_files}/train_*",
                 eval_path=f"{criteo_files}/eval.tsv", shuffle_buffer=0,
                 hash_rows=mapping.get("hash_rows", 0), min_count=mapping.get("min_count", 1))
  preprocessed.preprocess_files(text.data, str(tmp_path / "pre"), rows_per_shard=3000)
  binary = _config(format="preprocessed", train_path=str(tmp_path / "pre"), shuffle_buffer=0)
  losses = {}
  finals = {}
  for name, c in (("text", text), ("binary", binary)):
    losses[name] = []
    finals[name], _ = loop.train_and_evaluate(c, loss_log=losses[name])
  a, b = finals["text"], finals["binary"]
  assert a["step"] == b["step"] == 40
  assert a["auc"] > 0.55  # it learned something, so equal metrics mean something
  for key in ("auc", "logloss", "eval_auc", "eval_logloss"):
    assert math.isclose(a[key], b[key], rel_tol=0, abs_tol=1e-6), (key, a[key], b[key])
  assert losses["text"] == pytest.approx(losses["binary"], abs=1e-6)


def test_shuffled_shards_train(criteo_files, tmp_path):
  text = _config(format="criteo", train_path=f"{criteo_files}/train_*",
                 eval_path=f"{criteo_files}/eval.tsv", hash_rows=3000)
  preprocessed.preprocess_files(text.data, str(tmp_path / "pre"), rows_per_shard=1000)
  c = _config(format="preprocessed", train_path=str(tmp_path / "pre"), shuffle_buffer=4096)
  final, _ = loop.train_and_evaluate(c, dataset=dataset_lib.make_dataset(c.data, c.seed))
  assert final["step"] == 40 and math.isfinite(final["logloss"]) and final["bad_lines"] == 0


def test_config_check_for_the_preprocessed_format():
  c = _config(format="preprocessed")
  with pytest.raises(ConfigError, match=r"^config field data\.train_path: required for format "
                                        r"'preprocessed'"):
    config_check.validate(c)
  c.data.train_path = "/somewhere"
  config_check.validate(c)  # no eval_path needed: DIR/eval is the eval split
  c.data.eval_path = "/elsewhere/eval.tsv"
  with pytest.raises(ConfigError, match=r"^config field data\.eval_path: not used by format"):
    config_check.validate(c)
  c.data.eval_path, c.data.shuffle_buffer = "", -1
  with pytest.raises(ConfigError, match=r"^config field data\.shuffle_buffer:"):
    config_check.validate(c)
  assert "preprocessed" in dataset_lib.KNOWN_FORMATS
  assert dataset_lib.DIRECTORY_FORMATS == ("preprocessed",)
