"""The device backend, replicated and row-sharded (`embedding.sharding=row`, issue #24 item 3).

The row-sharded table on 8 devices must train exactly as the replicated one and as one
device (losses, dense parameters, table values and optimizer slots, eval AUC; float
tolerance: 8 devices sum the batch in another order), hold each row on its owner only
(D x the rows of one device), exchange per-owner blocks (all-gather + reduce-scatter,
no all-reduce of the `[U, E]` row gradient) and compile once per block shape.
"""


import chex
import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core import background
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import row_optimizers
from sfjax.train import config_check, device_backend, loop
from tests.train import bag_data, training_runs
from tests.train import multihot_backends_test as multihot

_LR = {"sgd": 0.5, "adagrad": 0.1, "rowwise_adagrad": 0.1, "adam": 0.01, "ftrl": 0.1}


def _config(optimizer="adagrad", devices=8, sharding="row", steps=24):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 2048, 512
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.optimizer, c.embedding.learning_rate = optimizer, _LR[optimizer]
  c.embedding.l2, c.embedding.sharding = 1e-4, sharding
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = steps, 32, steps, 100
  c.train.eval_batch_size, c.train.num_devices = 512, devices
  return c


_train = training_runs.train_run


def _steps(config, steps=3):
  """(trainer, state, losses, inputs seen) after `steps` steps run through the backend."""
  data = dataset_lib.make_dataset(config.data, config.seed)
  trainer = loop.build_trainer(config, data.spec)
  inputs = trainer.backend.train_inputs(data.train_batches(config.train.batch_size, 0))
  state, losses, seen = trainer.state, [], []
  try:
    for _ in range(steps):
      x = next(inputs)
      seen.append(x)
      state, metrics, _ = trainer.run_step(state, x)
      losses.append(float(metrics["loss"]))
  finally:
    inputs.close()
  return trainer, state, np.asarray(losses), seen


def _assert_same_rows(got_trainer, got_state, ref_trainer, ref_state, tol):
  got = got_trainer.backend.table_rows(got_state)
  ref = ref_trainer.backend.table_rows(ref_state)
  chex.assert_trees_all_close(tuple(got), tuple(ref), **tol)


@pytest.mark.slow  # two step compiles: ~20 s here
def test_row_sharded_steps_equal_one_device_and_hold_rows_on_their_owners():
  tol = dict(rtol=1e-5, atol=1e-5)
  ref_trainer, ref_state, ref_losses, _ = _steps(_config(devices=1, sharding="replicated"))
  trainer, state, losses, seen = _steps(_config())
  np.testing.assert_allclose(losses, ref_losses, **tol)
  chex.assert_trees_all_close(jax.device_get(state.params), jax.device_get(ref_state.params),
                              **tol)
  _assert_same_rows(trainer, state, ref_trainer, ref_state, tol)
  # 33812 rows over 8 devices: 4227 each (4 padding rows), D x C distinct rows in all.
  backend = trainer.backend
  v = backend.num_rows
  assert (backend.sharding_name, backend.rows_per_device, backend.capacity_rows) == (
      "row", -(-v // 8), 8 * -(-v // 8))
  for leaf in state.table:
    assert [s.data.shape[0] for s in leaf.addressable_shards] == [backend.rows_per_device] * 8
  # The blocks exchanged: about U / 8 rows per device, not the padded capacity.
  x, n = seen[0]
  assert x.rows.shape[0] < backend.capacity and x.rows.shape[0] >= n
  # One program per block length seen; replaying a known shape compiles nothing.
  jitted = trainer.run_step.jitted
  assert jitted._cache_size() == len({b.rows.shape for b, _ in seen})
  jitted(state, seen[-1][0])
  assert jitted._cache_size() == len({b.rows.shape for b, _ in seen})


@pytest.mark.slow  # a step compile: ~6 s here
def test_row_sharded_step_exchanges_owner_blocks_not_an_all_reduced_gradient():
  trainer, state, _, seen = _steps(_config(), steps=1)
  x, _ = seen[0]
  text = trainer.run_step.jitted.lower(state, x).compile().as_text()
  ud, e = x.rows.shape[0] // 8, trainer.width
  gathers = [line for line in text.splitlines() if " all-gather(" in line]
  scatters = [line for line in text.splitlines() if " reduce-scatter(" in line]
  assert any(f"f32[{8 * ud},{e}]" in line for line in gathers), gathers
  assert any(f"f32[{ud},{e}]" in line for line in scatters), scatters
  reduces = [line for line in text.splitlines() if " all-reduce(" in line]
  assert not any(f",{e}]" in line and f"[{8 * ud}," in line for line in reduces), reduces


def test_unknown_table_sharding_names_the_field():
  with pytest.raises(config_check.ConfigError, match=r"embedding\.sharding.*columns"):
    config_check.validate(_config(sharding="columns"))


# Full runs (train_and_evaluate: eval AUC, the final line): slow.
@pytest.mark.slow
@pytest.mark.parametrize("optimizer", row_optimizers.ROW_OPTIMIZER_NAMES)
def test_eight_devices_row_sharded_equals_replicated_and_one_device(optimizer):
  ref = _train(_config(optimizer, devices=1, sharding="replicated"))
  replicated = _train(_config(optimizer, sharding="replicated"))
  row = _train(_config(optimizer))
  tol, row_tol = dict(rtol=1e-4, atol=1e-5), dict(rtol=1e-4, atol=1e-4)  # scale_out_test's
  for run in (replicated, row):
    chex.assert_trees_all_close(run.losses, ref.losses, **tol)
    chex.assert_trees_all_close(jax.device_get(run.state.params), jax.device_get(ref.state.params),
                                **tol)
    _assert_same_rows(run.trainer, run.state, ref.trainer, ref.state, row_tol)
    assert abs(run.final["auc"] - ref.final["auc"]) < 1e-4
  assert {k: row.final[k] for k in ("num_devices", "cache_sharding", "cache_capacity_rows")} == {
      "num_devices": 8, "cache_sharding": "row", "cache_capacity_rows": 8 * -(-33812 // 8)}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["bags", "per_table_optimizers"])
def test_row_sharded_trains_bags_and_per_table_optimizers_like_one_device(layout):
  tables = bag_data.LAYOUT if layout == "bags" else bag_data.TABLES_LAYOUT
  ref = multihot._train(multihot._config("device"), tables)
  got = multihot._train(multihot._config("device", devices=8, sharding="row"), tables)
  tol = dict(rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(got.losses, ref.losses, **tol)
  chex.assert_trees_all_close(got.state.params, ref.state.params, **tol)
  _assert_same_rows(got.trainer, got.state, ref.trainer, ref.state, tol)
  assert abs(got.final["auc"] - ref.final["auc"]) < 1e-5
  if layout == "per_table_optimizers":
    assert got.trainer.backend.batch_sharding.row_tables is not None


def test_host_priority_is_the_loaders_niceness_or_sched_idle():
  """`train.loader_nice` / `train.loader_idle` -> the priority both backends give their host
  threads (`background.IDLE`: SCHED_IDLE)."""
  train = ctr.get_config().train
  assert device_backend.host_priority(train) == 10  # the default niceness
  train.loader_nice = 3
  assert device_backend.host_priority(train) == 3
  train.loader_idle = True
  assert device_backend.host_priority(train) == background.IDLE
  assert device_backend.host_priority(ml_collections.ConfigDict({})) == 0  # an old config
