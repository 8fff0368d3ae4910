"""Bags, weighted bags, sequences and shared tables on both embedding backends (issue #22).

The device table is the reference: the MixCache (replicated or row-sharded, 1 or 8
devices) must give identical losses, dense parameters and tables on a data set whose
bags hold duplicate ids, per-id weights, empty bags, and a sequence that shares the
item table with the target item.
"""

import os
import shutil

import chex
import jax
import numpy as np
import pytest

from sfjax.checkpoint import export
from sfjax.core import feature_layout as fl
from sfjax.train import defaults, loop
from tests.train import bag_data
from tests.train.training_runs import Run


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


def _train(config, layout=bag_data.LAYOUT) -> Run:
  data = bag_data.BagDataset(layout=layout)
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


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
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


@pytest.mark.slow  # the fast tier keeps multihot_step_test's exactness test
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


# Per-table row optimizers, rates and initializers (issue #22 Deliver 1): user sgd 0.5,
# item adagrad 0.1, tag rowwise_adagrad 0.05 with init_stddev 0.1 (embedding.* is adagrad).
TABLES = bag_data.TABLES_LAYOUT
ECFG = defaults.ctr_defaults().embedding


def _table_rows(layout):
  offsets = list(layout.table_offsets) + [layout.total_rows]
  return [slice(a, b) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def test_initial_rows_follow_each_tables_stddev_on_both_backends():
  device = loop.build_trainer(_config("device"), bag_data.spec(TABLES))
  cache = loop.build_trainer(_config("cache"), bag_data.spec(TABLES))
  values, slots = np.asarray(device.state.table.values), np.asarray(device.state.table.opt_slots)
  host_values, host_slots = cache.backend.host_table.read_all()  # lazily initialised rows
  np.testing.assert_array_equal(host_values, values)
  np.testing.assert_array_equal(host_slots, slots)
  default, acc = ECFG.init_stddev, ECFG.adagrad_initial_accumulator
  user, item, tag = _table_rows(TABLES)
  for rows, sd in ((user, default), (item, 0.02), (tag, 0.1)):
    assert abs(values[rows].std() - sd) < 0.15 * sd and np.abs(values[rows]).max() <= sd * 1.7321
  # Slots: max width E (adagrad); sgd rows none used, rowwise_adagrad its first column.
  assert slots.shape[1] == values.shape[1]
  np.testing.assert_array_equal(slots[user], 0.0)
  np.testing.assert_array_equal(slots[item], np.float32(acc))
  np.testing.assert_array_equal(slots[tag, 0], np.float32(acc))
  np.testing.assert_array_equal(slots[tag, 1:], 0.0)
  # No override: the one-table path (no row_tables, one optimizer) as before.
  plain = loop.build_trainer(_config("device"), bag_data.spec())
  assert plain.backend.batch_sharding.row_tables is None and device.backend.batch_sharding.row_tables
  np.testing.assert_array_equal(np.asarray(plain.state.table.values)[user], values[user])


def _assert_tables_trained(run: Run):
  fresh = loop.build_trainer(_config("device"), bag_data.spec(TABLES)).state.table
  values, slots = run.trainer.backend.host_table.read_all()
  user, item, tag = _table_rows(TABLES)
  assert np.any(values[user] != np.asarray(fresh.values)[user])
  np.testing.assert_array_equal(slots[user], 0.0)  # sgd rows keep their (unused) slots
  acc = np.float32(ECFG.adagrad_initial_accumulator)
  assert np.any(slots[item] > acc) and np.any(slots[tag, 0] > acc)
  np.testing.assert_array_equal(slots[tag, 1:], 0.0)  # rowwise_adagrad uses one column


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_cache_equals_device_with_per_table_optimizers():
  ref = _train(_config("device"), TABLES)
  got = _train(_config("cache", cache_rows=0.0), TABLES)
  assert got.final["cache_stats"]["evictions"] > 0
  _assert_same(got, ref)
  _assert_tables_trained(got)


@pytest.mark.slow
@pytest.mark.parametrize("sharding", ["replicated", "row"])
def test_eight_devices_cache_equals_device_with_per_table_optimizers(sharding):
  ref = _train(_config("device", devices=8), TABLES)
  got = _train(_config("cache", devices=8, cache_sharding=sharding), TABLES)
  _assert_same(got, ref)
  _assert_tables_trained(got)


@pytest.mark.slow
def test_per_table_checkpoint_resumes_and_exports_unwritten_rows(tmp_path):
  """The cache's table checkpoint records the per-table initial rows (`tables`): a resume
  (row-sharded on 8 devices) ends as the uninterrupted run, and an export reads
  never-written rows at their own table's initial value."""
  def config(devices, **embedding):
    c = _config("cache", devices, cache_rows=0.0, **embedding)
    c.train.steps, c.checkpoint.every_steps, c.checkpoint.keep = 20, 10, 2
    return c

  data = bag_data.BagDataset(layout=TABLES)
  ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "run")
  ref_trainer = loop.build_trainer(config(1), data.spec)
  _, ref_state = loop.train_and_evaluate(config(1), ref_dir, dataset=data,
                                         trainer=ref_trainer)
  ref_values, ref_slots = ref_trainer.backend.host_table.read_all()
  manifest = export.export_checkpoint(ref_dir, str(tmp_path / "export"))
  assert fl.layout_from_json(manifest["features"]) == TABLES  # per-table settings recorded
  _, values, _ = export.read_export(str(tmp_path / "export"))
  np.testing.assert_array_equal(values, ref_values)
  shutil.copytree(ref_dir, run_dir)
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "step_00000020"))
  trainer = loop.build_trainer(config(8, cache_sharding="row"), data.spec)
  _, state = loop.train_and_evaluate(config(8, cache_sharding="row"), run_dir, dataset=data,
                                     trainer=trainer)
  values, slots = trainer.backend.host_table.read_all()
  chex.assert_trees_all_close(values, ref_values, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(slots, ref_slots, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(jax.device_get(state.params), jax.device_get(ref_state.params),
                              rtol=1e-5, atol=1e-6)
