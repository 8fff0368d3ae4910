"""Embedding backends: registries, settings errors naming the field, one compile, equal eval."""

import chex
import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import row_optimizers
from sfjax.train import backends, config_check, loop
from tests.train import device_backend_test


def _config(backend="device", **embedding):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 512, 256
  c.model.mlp_dims, c.model.embed_dim = (8,), 4
  c.embedding.backend, c.embedding.cache_rows = backend, 0.5
  for k, v in embedding.items():
    setattr(c.embedding, k, v)
  c.train.steps, c.train.batch_size, c.train.num_devices = 2, 32, 1
  return c


@pytest.fixture(scope="module")
def data():
  c = _config()
  return dataset_lib.make_dataset(c.data, c.seed)


def test_unknown_backend_names_the_field():
  c = _config("ps")
  with pytest.raises(ConfigError, match=r"embedding\.backend: unknown backend 'ps' "
                                        r"\(known: device, cache\)"):
    backends.make_backend(c, None, 4, None, None, None, None)


def test_registries_name_every_backend_and_storage():
  assert backends.BACKENDS == {"device": backends.DeviceBackend, "cache": backends.CacheBackend}
  assert set(backends.HOST_STORAGES) == {"ram", "mmap"}
  for name in backends.BACKENDS:  # config validation derives its names from the registry
    config_check.validate(_config(name))


@pytest.mark.parametrize("setting,total,rows", [
    (0.05, 1000, 50), (0.5, 3, 2), (1e-6, 100, 1), (300, 1000, 300), (300.0, 1000, 300),
    (1, 10, 1)])
def test_cache_rows_fraction_or_count(setting, total, rows):
  assert backends.cache_rows(setting, total) == rows


@pytest.mark.parametrize("setting", [-1, 2.5, 1.0000001, float("nan"), float("inf")])
def test_bad_cache_rows_names_the_field(setting):
  with pytest.raises(ConfigError, match="embedding.cache_rows"):
    backends.cache_rows(setting, 1000)


@pytest.mark.parametrize("total,least,rows,why", [
    (100_000, 1000, 5000, "5% of the 100000-row table"),  # 5% suffices: as the old default
    (33_820, 53_248, 53_248, "the minimum for the batch"),  # 5% (1691) is too small
])
def test_auto_cache_rows_is_five_percent_raised_to_the_minimum_and_says_so(total, least, rows, why,
                                                                           caplog):
  with caplog.at_level("INFO", logger="absl"):
    assert backends.cache_rows(0, total, least) == rows
    assert backends.cache_rows(0.0, total, least) == rows
  assert f"embedding.cache_rows=0 (auto): {rows} rows, {why}" in caplog.text
  assert backends.cache_rows(0.05, 100_000, least) == 5000  # an explicit value is kept


def test_default_cache_backend_trains_out_of_the_box(caplog):
  # The defaults' batch (1024 x 26 fields, lookahead 2) needs 53248 cache rows; 5% of
  # the default table is 1691 rows (it failed at start: issue #25, item 6).
  c = ctr.get_config()
  c.embedding.backend = "cache"
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 4096, 2048
  c.train.steps, c.train.eval_every, c.train.num_devices = 2, 2, 1
  with caplog.at_level("INFO", logger="absl"):
    final, _ = loop.train_and_evaluate(c)
  assert final["step"] == 2 and np.isfinite(final["logloss"])
  assert final["cache_capacity_rows"] == 2 * 1024 * 26
  assert "embedding.cache_rows=0 (auto): 53248 rows, the minimum for the batch" in caplog.text
  c.embedding.cache_rows = 0.05  # the old default, explicit: names the smallest valid value
  with pytest.raises(ConfigError, match=r"set embedding.cache_rows >= 53248 \(or 0 to choose"):
    loop.train_and_evaluate(c)


def test_mmap_storage_needs_host_path(data):
  e = ml_collections.ConfigDict({"host_path": ""})
  with pytest.raises(ConfigError, match="embedding.host_path"):
    backends.HOST_STORAGES["mmap"](e, 10, 4, 1, seed=0, init_stddev=0.01,
                                   initial_slot_row=np.zeros(1, np.float32))
  with pytest.raises(ConfigError, match="embedding.host_path"):  # the trainer's path to it
    loop.build_trainer(_config("cache", host_storage="mmap", host_path=""), data.spec)


@pytest.mark.parametrize("backend,num_devices", [  # the cache's: cache_backend_test (fast)
    ("device", 1), *(pytest.param(*case, marks=pytest.mark.slow)
                     for case in (("cache", 1), ("device", 8), ("cache", 8)))])
def test_make_step_compiles_once(data, backend, num_devices):
  c = _config(backend)
  c.train.num_devices = num_devices
  trainer = loop.build_trainer(c, data.spec)
  assert trainer.backend.name == backend and callable(trainer.run_step.jitted)
  inputs = trainer.backend.train_inputs(data.train_batches(c.train.batch_size, c.seed))
  try:
    state, losses, swap_sizes = trainer.state, [], set()
    for _ in range(2):
      step_inputs = next(inputs)
      if backend == "cache":  # fill / evict buffers come in a few bucketed sizes
        swap_sizes.add(step_inputs.swap.fill_slots.shape[0])
      state, metrics, num_unique = trainer.run_step(state, step_inputs)
      losses.append(float(metrics["loss"]))
      assert 0 < num_unique <= trainer.backend.capacity
  finally:
    inputs.close()
    trainer.backend.close()
  assert int(state.step) == 2 and np.all(np.isfinite(losses))
  # One program per swap size seen (one for the device backend): no other recompile.
  assert trainer.run_step.jitted._cache_size() == max(1, len(swap_sizes))
  assert len(state.table.values.sharding.device_set) == num_devices  # replicated on the mesh


def _compiled_steps(config):
  """(the step's XLA options, its compiled text, the losses of 3 steps) of a trainer of
  `config` (`device_backend_test._steps`' run)."""
  trainer, state, losses, seen = device_backend_test._steps(config)
  trainer.backend.close()
  first = seen[0]
  args = (first.batch, first.swap) if config.embedding.backend == "cache" else (first[0],)
  text = trainer.run_step.jitted.lower(state, *args).compile().as_text()
  return trainer.backend.compiler_options, text, losses


@pytest.mark.parametrize("backend", ["device", "cache"])
def test_the_steps_dots_follow_xla_cpu_dots(backend):
  runs = {}
  for choice in ("eigen", "xla"):
    c = _config(backend)
    c.train.xla_cpu_dots = choice
    runs[choice] = _compiled_steps(c)
  options, text, eigen_losses = runs["eigen"]
  assert options == {"xla_cpu_experimental_ynn_fusion_type": ""}
  assert "dot(" in text and "__ynn_fusion" not in text  # Eigen: XLA's own dot thunks
  assert runs["xla"][0] == {}
  np.testing.assert_allclose(eigen_losses, runs["xla"][2], rtol=1e-5)  # float rounding only


def test_cache_eval_equals_device_eval(data):
  device = loop.build_trainer(_config("device"), data.spec)
  cache = loop.build_trainer(_config("cache"), data.spec)
  chex.assert_trees_all_equal(cache.state.params, device.state.params)  # same seed
  batch = next(data.eval_batches("eval", 64))
  cache.backend.sync(cache.state)  # no pipeline yet: flushes the host table
  got = cache.backend.eval_logits(cache.state, cache.backend.prepare_eval(batch))
  want = device.backend.eval_logits(device.state, device.backend.prepare_eval(batch))
  chex.assert_shape((got, want), (64,))
  chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-6)
  assert len(set(np.asarray(want).tolist())) > 1  # the rows really differ per example
  cache.backend.close()


# ---- embedding.placement (sfjax/embedding/placement.py) -----------------------------------

def test_placement_names_the_backend_and_sharding(data):
  for chosen, want in (("replicated", ("device", "replicated")), ("row", ("device", "row")),
                       ("cache", ("cache", "replicated"))):
    c = _config(placement=chosen)
    got = backends.resolve_placement(c, data.spec, 4, None, 8)
    assert (got.embedding.backend, got.embedding.sharding) == want
    assert (c.embedding.backend, c.embedding.sharding) == ("device", "replicated")  # a copy
  plain = _config()
  assert backends.resolve_placement(plain, data.spec, 4, None, 8) is plain  # '' = as set


def _auto(device_bytes, **plan):
  c = _config(placement="auto")
  c.embedding.plan.device_bytes, c.embedding.plan.host_bytes = device_bytes, 1 << 30
  for k, v in plan.items():
    setattr(c.embedding.plan, k, v)
  return c


def test_auto_placement_follows_the_plan_of_the_runs_table(data):
  # One table of V rows, width 4 + 4 Adagrad slots: 32 B a row.
  v = data.spec.total_rows
  row_opt = row_optimizers.row_optimizer_from_config(_config().embedding)  # adagrad
  assert row_opt.slot_width(4) == 4
  whole, share = 32 * v, 32 * -(-v // 8)
  def chosen(c):
    got = backends.resolve_placement(c, data.spec, 4, row_opt, 8).embedding
    return got.backend, got.sharding
  assert chosen(_auto(4 * whole)) == ("device", "replicated")  # 25% of the budget: fits
  assert chosen(_auto(4 * whole - 1)) == ("device", "row")
  assert chosen(_auto(share)) == ("device", "row")
  assert chosen(_auto(share - 1)) == ("cache", "replicated")


def test_auto_placement_without_a_device_budget_names_the_field(data):
  c = _config(placement="auto")
  if jax.local_devices()[0].memory_stats():
    pytest.skip("this device reports its memory limit")
  with pytest.raises(ConfigError, match=r"^config field embedding\.plan\.device_bytes: required"):
    backends.resolve_placement(c, data.spec, 4, None, 8)


@pytest.mark.parametrize("field,value,match", [
    ("sharding", "columns", r"embedding\.sharding: unknown value 'columns'"),
    ("placement", "everywhere", r"embedding\.placement: unknown value 'everywhere'"),
    ("plan.device_bytes", -1.0, r"embedding\.plan\.device_bytes: must be a finite number >= 0"),
    ("plan.replicate_fraction", 1.5, r"embedding\.plan\.replicate_fraction: must be <= 1"),
    ("plan.unique_fraction", 0.0, r"embedding\.plan\.unique_fraction: must be a finite number > 0"),
], ids=["sharding", "placement", "device_bytes", "replicate_fraction", "unique_fraction"])
def test_placement_settings_are_validated_naming_the_field(field, value, match):
  c = _config()
  target = c.embedding
  *parents, leaf = field.split(".")
  for p in parents:
    target = target[p]
  target[leaf] = value
  with pytest.raises(ConfigError, match=r"^config field " + match):
    config_check.validate(c)


def test_row_sharding_belongs_to_the_device_backend():
  with pytest.raises(ConfigError, match=r"embedding\.sharding: 'row' splits the device backend"):
    config_check.validate(_config("cache", sharding="row"))
