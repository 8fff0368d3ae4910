"""Bags, weighted bags, sequences and shared tables on both embedding backends (issue #22).

The device table is the reference: the MixCache (replicated or row-sharded, 1 or 8
devices) must give identical losses, dense parameters and tables on a data set whose
bags hold duplicate ids, per-id weights, empty bags, and a sequence that shares the
item table with the target item.
"""

from typing import Any, NamedTuple

import chex
import numpy as np
import pytest

from sfjax.train import defaults, loop
from tests.train import bag_data


def _config(backend, devices=1, **embedding):
  c = defaults.ctr_defaults()
  c.model.name, c.model.embed_dim, c.model.mlp_dims = "deepfm", 4, (16,)
  c.embedding.backend = backend
  c.embedding.optimizer, c.embedding.learning_rate, c.embedding.l2 = "adagrad", 0.1, 1e-4
  c.embedding.cache_rows = 0.0
  c.embedding.lookahead = 2
  for k, v in embedding.items():
    setattr(c.embedding, k, v)
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = 40, 16, 20, 20
  c.train.eval_batch_size, c.train.num_devices = 256, devices
  return c


class Run(NamedTuple):
  final: dict
  state: Any
  trainer: loop.Trainer
  losses: np.ndarray


def _train(config) -> Run:
  data = bag_data.BagDataset()
  trainer = loop.build_trainer(config, data.spec)
  losses = []
  final, state = loop.train_and_evaluate(config, dataset=data, trainer=trainer, loss_log=losses)
  return Run(final, state, trainer, np.asarray(losses))


def _assert_same(got: Run, ref: Run):
  chex.assert_trees_all_close(got.losses, ref.losses, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(got.state.params, ref.state.params, rtol=1e-5, atol=1e-6)
  values, slots = got.trainer.backend.host_table.read_all()
  chex.assert_trees_all_close(values, np.asarray(ref.state.table.values), rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(slots, np.asarray(ref.state.table.opt_slots), rtol=1e-5, atol=1e-6)
  assert abs(got.final["auc"] - ref.final["auc"]) < 1e-5


def test_device_backend_trains_bags_and_padding_never_reaches_the_table():
  run = _train(_config("device"))
  assert np.isfinite(run.losses).all() and run.final["auc"] > 0.5
  table = np.asarray(run.state.table.values)
  assert table.shape[0] == bag_data.LAYOUT.total_rows  # no padding row
  # Every table had rows trained, the shared item table through both features.
  fresh = loop.build_trainer(_config("device"), bag_data.spec()).state.table.values
  changed = np.any(table != np.asarray(fresh), axis=1)
  offsets = bag_data.LAYOUT.table_offsets
  for start, stop in zip(offsets, list(offsets[1:]) + [table.shape[0]], strict=True):
    assert changed[start:stop].mean() > 0.5


def test_cache_equals_device_with_bags_weights_and_a_shared_table():
  ref = _train(_config("device"))
  got = _train(_config("cache", cache_rows=0.0))
  stats = got.final["cache_stats"]
  assert stats["evictions"] > 0, stats  # a small cache: write-back exercised
  _assert_same(got, ref)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["replicated", "row"])
def test_eight_devices_cache_equals_device(sharding):
  ref = _train(_config("device", devices=8))
  got = _train(_config("cache", devices=8, cache_sharding=sharding))
  _assert_same(got, ref)


@pytest.mark.slow
def test_eight_devices_equal_one_device():
  one, eight = _train(_config("device")), _train(_config("device", devices=8))
  chex.assert_trees_all_close(eight.losses, one.losses, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(np.asarray(eight.state.table.values),
                              np.asarray(one.state.table.values), rtol=1e-5, atol=1e-6)
