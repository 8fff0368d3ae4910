"""Training on 8 fake CPU devices: replicated and row-sharded MixCache equal the 1-device reference.

For every row optimizer: same per-step losses, same dense parameters and the same
final table (the host table after the flush) as the whole table on one device, to
float tolerance (8 devices sum the batch in another order). Replicated caches stay
bit-identical across the devices; the row-sharded cache holds cache_rows x 8 rows.
"""


import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import row_optimizers
from sfjax.train import config_check, loop
from tests.train import training_runs
from tests.train.training_runs import Run

_LR = {"sgd": 0.5, "adagrad": 0.1, "rowwise_adagrad": 0.1, "adam": 0.01, "ftrl": 0.1}
_STEPS = 24


def _config(optimizer, backend="cache", devices=8, sharding="replicated", cache_rows=1700.0):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 2048, 512
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.optimizer, c.embedding.learning_rate = optimizer, _LR[optimizer]
  c.embedding.l2 = 1e-4
  c.embedding.backend, c.embedding.cache_sharding = backend, sharding
  c.embedding.cache_rows, c.embedding.lookahead = cache_rows, 2
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = _STEPS, 32, _STEPS, 100
  c.train.eval_batch_size, c.train.num_devices = 512, devices
  return c


_train = training_runs.train_run


def _assert_matches_reference(got: Run, ref: Run):
  tol = dict(rtol=1e-4, atol=1e-5)
  chex.assert_trees_all_close(got.losses, ref.losses, **tol)
  chex.assert_trees_all_close(jax.device_get(got.state.params),
                              jax.device_get(ref.state.params), **tol)
  # Rows: Adagrad's first step divides g by sqrt(g^2 + 1e-6), which amplifies the
  # rounding of a gradient summed over 8 devices in another order (seen: 2.4e-5).
  row_tol = dict(rtol=1e-4, atol=1e-4)
  values, slots = got.trainer.backend.host_table.read_all()
  chex.assert_trees_all_close(values, np.asarray(ref.state.table.values), **row_tol)
  chex.assert_trees_all_close(slots, np.asarray(ref.state.table.opt_slots), **row_tol)


# One optimizer with slots in the fast tier; the rest in `make test-all` (tests/conftest.py).
OPTIMIZERS = [pytest.param(name, marks=() if name == "adagrad" else pytest.mark.slow)
              for name in row_optimizers.ROW_OPTIMIZER_NAMES]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_eight_devices_replicated_and_row_sharded_equal_one_device(optimizer):
  ref = _train(_config(optimizer, backend="device", devices=1))
  replicated = _train(_config(optimizer, sharding="replicated"))
  # 250 rows per device: 2000 in all, more than the 1664 the window needs; one device's
  # 250 could not hold a single batch.
  row = _train(_config(optimizer, sharding="row", cache_rows=250.0))
  for run in (replicated, row):
    stats = run.final["cache_stats"]
    assert stats["evictions"] > 0 and stats["d2h_rows"] > 0, stats  # write-backs happened
    _assert_matches_reference(run, ref)
  # Replicas of the replicated cache are bit-identical on all 8 devices after training.
  for leaf in replicated.state.table:
    shards = [np.asarray(s.data) for s in leaf.addressable_shards]
    assert len(shards) == 8 and all(np.array_equal(shards[0], s) for s in shards[1:])
  _check_row_sharded_layout(row)
  assert (ref.final["num_devices"], ref.final["cache_sharding"], ref.final["cache_capacity_rows"]
          ) == (1, "replicated", ref.trainer.backend.num_rows)


def _check_row_sharded_layout(row: Run):
  """The final line, the capacity (8 x 250 distinct rows), the owners, the compile count."""
  assert {k: row.final[k] for k in ("num_devices", "num_processes", "cache_sharding",
                                     "cache_capacity_rows")} == {
      "num_devices": 8, "num_processes": 1, "cache_sharding": "row", "cache_capacity_rows": 2000}
  # The planner filled all 8 x 250 slots with distinct rows (a replicated cache of 250
  # rows per device would hold 250), 250 owned by each device.
  backend = row.trainer.backend
  slots, ids = backend.planner.occupied()
  assert slots.size == 2000 == np.unique(ids).size
  physical = backend.layout.physical(slots)
  np.testing.assert_array_equal(np.bincount(physical // 250, minlength=8), [250] * 8)
  # Each device's shard holds its own 250 rows, all filled (a never-filled row is zeros).
  for leaf in row.state.table:
    assert [s.data.shape[0] for s in leaf.addressable_shards] == [250] * 8
  for shard in row.state.table.values.addressable_shards:
    assert int(np.any(np.asarray(shard.data) != 0, axis=1).sum()) == 250
  # The compiled step never recompiles: one program per (row blocks, swap bucket) used.
  shapes = row.final["cache_stats"]["steps_per_shape"]
  assert row.trainer.run_step.jitted._cache_size() == len(shapes)
  assert sum(shapes.values()) >= _STEPS


def test_row_sharded_step_compiles_once_per_shape_and_not_again():
  config = _config("adagrad", sharding="row", cache_rows=250.0)
  data = dataset_lib.make_dataset(config.data, config.seed)
  trainer = loop.build_trainer(config, data.spec)
  inputs = trainer.backend.train_inputs(data.train_batches(32, 0))
  try:
    state, seen = trainer.state, {}
    for _ in range(8):
      x = next(inputs)
      key = (x.batch.rows.shape, x.swap.fill_slots.shape)
      seen[key] = x
      state, _, _ = trainer.run_step(state, x)
    jitted = trainer.run_step.jitted
    assert jitted._cache_size() == len(seen)
    for x in list(seen.values()):  # replaying known shapes adds no program
      state, _, _ = jitted(state, x.batch, x.swap)
    assert jitted._cache_size() == len(seen)
  finally:
    inputs.close()
    trainer.backend.close()


def test_small_row_sharded_cache_error_names_the_per_device_rows():
  with pytest.raises(config_check.ConfigError,
                     match=r"cache_rows: a cache of 800 rows \(100 per device x 8 devices"):
    _train(_config("sgd", sharding="row", cache_rows=100.0))


def test_unknown_cache_sharding_names_the_field():
  c = _config("sgd", sharding="columns")
  with pytest.raises(config_check.ConfigError, match=r"embedding\.cache_sharding.*columns"):
    config_check.validate(c)


def test_replicated_gradient_all_reduce_runs_over_the_bucketed_unique_rows():
  config = _config("adagrad", sharding="replicated")
  data = dataset_lib.make_dataset(config.data, config.seed)
  trainer = loop.build_trainer(config, data.spec)
  inputs = trainer.backend.train_inputs(data.train_batches(32, 0))
  try:
    x = next(inputs)
    text = trainer.run_step.jitted.lower(trainer.state, x.batch, x.swap).compile().as_text()
  finally:
    inputs.close()
    trainer.backend.close()
  u, b_f, e = x.batch.rows.shape[0], 32 * data.spec.num_fields, trainer.width
  assert x.plan.num_unique <= u < b_f  # the step's unique ids, bucketed, not B x F
  reduces = [line for line in text.splitlines() if " all-reduce(" in line]
  # DeepFM's default step (`model.split_input`) gathers the latent vectors and the
  # first-order weights as two blocks: their gradients are reduced as [U, E-1] and [U].
  whole = any(f"f32[{u},{e}]" in line for line in reduces)
  split = any(f"f32[{u},{e - 1}]" in line and f"f32[{u}]" in line for line in reduces)
  assert whole or split, reduces
  assert not any(f"[{b_f}" in line for line in reduces), reduces
