"""Evaluation: exact AUC / logloss over every real example, keys per split, empty splits named."""

import numpy as np
import pytest
from flax import nnx

from experiments.configs import ctr
from sfjax.core import metrics as metrics_lib
from sfjax.data import dataset as dataset_lib
from sfjax.data import types
from sfjax.train import evaluation, loop


def _config():
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 512, 300  # 300: last batch padded
  c.model.mlp_dims, c.model.embed_dim = (8,), 4
  c.train.steps, c.train.batch_size, c.train.num_devices = 2, 32, 1
  return c


def test_evaluate_equals_metrics_of_directly_computed_logits():
  c = _config()
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  got = evaluation.evaluate(trainer.backend, trainer.state, data, "eval", 128)
  # The same logits without VSI: every example reads its rows straight from the table.
  model = nnx.merge(trainer.graphdef, trainer.state.params)
  table = np.asarray(trainer.state.table.values)
  batches = list(data.eval_batches("eval", 128))
  assert len(batches) == 3 and batches[-1].mask.sum() == 300 - 256
  logits = np.concatenate([
      np.asarray(model(table[b.ids + data.spec.field_offsets], b.dense)) for b in batches])
  labels = np.concatenate([b.labels for b in batches])
  mask = np.concatenate([b.mask for b in batches])
  assert got["num_examples"] == 300
  assert got["auc"] == pytest.approx(metrics_lib.auc(labels, logits, mask), abs=1e-6)
  assert got["logloss"] == pytest.approx(
      metrics_lib.logloss(labels, metrics_lib.sigmoid(logits), mask), abs=1e-6)
  assert 0.0 < got["auc"] < 1.0


class _ScoreBackend:
  """A backend whose logit of an example is its first dense feature."""

  def __init__(self):
    self.synced = 0

  def sync(self, state):
    del state
    self.synced += 1

  def prepare_eval(self, batch):
    return batch.dense[:, 0]

  def eval_logits(self, state, prepared):
    del state
    return prepared


class _Splits:
  """A data set with hand-written eval splits: name -> list of (scores, labels, mask)."""

  def __init__(self, splits):
    self.eval_splits = tuple(splits)
    self._splits = splits

  def eval_batches(self, split, batch_size):
    del batch_size
    for scores, labels, mask in self._splits[split]:
      n = len(scores)
      yield types.make_batch(np.zeros((n, 1), np.int32), np.asarray(scores, np.float32)[:, None],
                             np.asarray(labels, np.float32), np.asarray(mask, np.float32))


# valid: real (score, label) = (0.1, 0), (0.4, 1), (0.5, 0), (0.9, 1); a padded row ignored.
# 3 of the 4 (positive, negative) pairs are ordered (not 0.4 < 0.5): AUC 0.75.
# test: perfectly ordered, AUC 1.
_VALID = [([0.1, 0.4], [0, 1], [1, 1]), ([0.5, 0.9, 5.0], [0, 1, 0], [1, 1, 0])]
_TEST = [([-1.0, 2.0], [0, 1], [1, 1])]


def test_evaluate_on_hand_checked_scores():
  backend = _ScoreBackend()
  m = evaluation.evaluate(backend, None, _Splits({"valid": _VALID}), "valid", 3)
  assert m["auc"] == pytest.approx(0.75) and m["num_examples"] == 4
  p = metrics_lib.sigmoid([0.1, 0.4, 0.5, 0.9])
  expected = -np.mean(np.log([1 - p[0], p[1], 1 - p[2], p[3]]))
  assert m["logloss"] == pytest.approx(expected)
  assert backend.synced == 1  # the table of record is made current first


def test_evaluate_splits_names_keys_per_split_and_auc_of_the_first():
  record = evaluation.evaluate_splits(_ScoreBackend(), None,
                                      _Splits({"valid": _VALID, "test": _TEST}), 3)
  assert set(record) == {"auc", "logloss", "valid_auc", "valid_logloss", "test_auc",
                         "test_logloss"}
  assert record["valid_auc"] == pytest.approx(0.75) and record["test_auc"] == 1.0
  assert (record["auc"], record["logloss"]) == (record["valid_auc"], record["valid_logloss"])


def test_empty_split_raises_naming_it():
  data = _Splits({"valid": _VALID, "test": []})
  with pytest.raises(ValueError, match="eval split 'test' is empty"):
    evaluation.evaluate(_ScoreBackend(), None, data, "test", 3)
  with pytest.raises(ValueError, match="'test'"):
    evaluation.evaluate_splits(_ScoreBackend(), None, data, 3)
