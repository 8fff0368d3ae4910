"""The training loop: learning to the oracle, metrics files, config validation."""

import json

import pytest

from experiments.configs import ctr
from sfjax.train import config_check
from sfjax.train import evaluation
from sfjax.train import loop


def _synthetic_config(**train):
  c = ctr.get_config("smoke")
  c.train.num_devices = 1
  for k, v in train.items():
    setattr(c.train, k, v)
  return c


def test_deepfm_reaches_oracle_auc_on_synthetic_data(tmp_path):
  c = _synthetic_config(steps=600, batch_size=512, eval_every=150, log_every=300,
                        eval_batch_size=8192)
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 200_000, 50_000
  c.model.mlp_dims = (64, 64)
  final, _ = loop.train_and_evaluate(c, str(tmp_path))
  gap = final["oracle_auc"] - final["best"]["auc"]
  assert gap < 0.02, f"best AUC {final['best']['auc']:.4f} vs oracle {final['oracle_auc']:.4f}"
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in lines] == [150, 300, 450, 600]
  for r in lines:
    assert {"step", "auc", "logloss", "examples_per_sec"} <= set(r)
    assert r["examples_per_sec"] > 0
  assert json.loads(open(tmp_path / "config.json").read())["train"]["steps"] == 600
  summary = json.loads(loop.final_json_line(final))
  assert summary["oracle_auc"] == final["oracle_auc"]


def test_every_eval_example_counted_once():
  c = _synthetic_config(steps=2, eval_every=2, eval_batch_size=4096)
  c.data.synthetic.num_eval = 10_001  # not a multiple of the eval batch: last batch padded
  from sfjax.data import dataset as dataset_lib
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  m = evaluation.evaluate(trainer.backend, trainer.state, data, "eval", 4096)
  assert m["num_examples"] == 10_001


@pytest.mark.parametrize("field,value,match", [
    ("data.format", "parquet", "data.format"),
    ("embedding.optimizer", "lamb", "embedding.optimizer"),
    ("embedding.backend", "ps", "embedding.backend"),
    ("train.batch_size", 0, "train.batch_size"),
    ("optimizer.learning_rate", -1.0, "optimizer.learning_rate"),
])
def test_invalid_config_names_the_field(field, value, match):
  c = ctr.get_config()
  section, key = field.split(".")
  setattr(c[section], key, value)
  with pytest.raises(config_check.ConfigError, match=match):
    config_check.validate(c)


def test_file_format_requires_paths():
  c = ctr.get_config()
  c.data.format = "criteo"
  with pytest.raises(config_check.ConfigError, match="data.train_path"):
    config_check.validate(c)


def test_unknown_model_names_field():
  c = _synthetic_config(steps=1)
  c.model.name = "transformer9000"
  with pytest.raises(ValueError, match="model.name"):
    loop.train_and_evaluate(c, None)
