"""MixCache backend: equals the on-device reference (the oracle), fails cleanly, never recompiles."""

import functools
import threading
import traceback

import chex
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import row_optimizers
from sfjax.train import config_check, loop
from tests.train import training_runs


def _config(optimizer, backend, **embedding):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 4096, 2048
  c.data.synthetic.zipf_exponent = 1.1
  c.model.mlp_dims = (16,)
  c.model.embed_dim = 4
  c.embedding.optimizer = optimizer
  c.embedding.learning_rate = {"sgd": 0.5, "adagrad": 0.1, "rowwise_adagrad": 0.1, "adam": 0.01,
                               "ftrl": 0.1}[optimizer]
  c.embedding.l2 = 1e-4
  c.embedding.backend = backend
  c.embedding.cache_rows = 0.05
  c.embedding.lookahead = 2
  for k, v in embedding.items():
    setattr(c.embedding, k, v)
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = 48, 32, 24, 24
  c.train.eval_batch_size, c.train.num_devices = 1024, 1
  return c


_train = training_runs.train_run


@functools.cache
def _cache_run(optimizer, policy, keep_upcoming):
  """One cache-backend training of `_config` (shared by the tests of this module: the
  reference equality and the kept-rows test read the same keep_upcoming=0 run)."""
  return _train(_config(optimizer, "cache", cache_policy=policy, keep_upcoming=keep_upcoming))


def _host_rows(run):
  return run.trainer.backend.host_table.read_all()


# One optimizer with slots in the fast tier; the rest in `make test-all` (tests/conftest.py).
OPTIMIZERS = [pytest.param(name, marks=() if name == "adagrad" else pytest.mark.slow)
              for name in row_optimizers.ROW_OPTIMIZER_NAMES]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_cache_training_equals_device_reference(optimizer):
  ref = _train(_config(optimizer, "device"))
  # keep_upcoming=0: the policy alone, so evicted rows come back while their write-back is
  # in flight (the ordering rule); the default keeps them (next test).
  got = _cache_run(optimizer, "lru", 0)
  stats = got.final["cache_stats"]
  assert stats["evictions"] > 0 and stats["d2h_rows"] > 0, stats  # write-back was exercised
  assert stats["ordering_waits"] > 0, stats  # an evicted id was re-admitted within the window
  cache_rows = got.trainer.backend.num_slots
  assert cache_rows == round(0.05 * got.trainer.backend.num_rows)
  chex.assert_trees_all_close(got.losses, ref.losses, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(got.state.params, ref.state.params, rtol=1e-5, atol=1e-6)
  values, slots = _host_rows(got)
  chex.assert_trees_all_close(values, np.asarray(ref.state.table.values), rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(slots, np.asarray(ref.state.table.opt_slots), rtol=1e-5, atol=1e-6)
  assert abs(got.final["auc"] - ref.final["auc"]) < 1e-5
  # hits + misses = unique ids; bytes follow rows.
  assert stats["hits"] + stats["misses"] == stats["unique_ids"]
  assert stats["h2d_bytes"] == stats["h2d_rows"] * stats["row_bytes"]


@pytest.mark.parametrize("optimizer,slot_width,row_bytes", [
    ("adagrad", 17, 4 * (17 + 17)), ("rowwise_adagrad", 1, 4 * (17 + 1))])
def test_host_table_state_bytes_per_row(optimizer, slot_width, row_bytes):
  """Row-wise Adagrad keeps one accumulator per row on the host and in the cache, not E."""
  c = _config(optimizer, "cache")
  c.model.name, c.model.embed_dim = "deepfm", 16  # E = 16 + 1 first-order column
  trainer = loop.build_trainer(c, dataset_lib.make_dataset(c.data, c.seed).spec)
  table = trainer.backend.host_table
  assert (trainer.width, table.width, table.slot_width) == (17, 17, slot_width)
  assert 4 * (table.width + table.slot_width) == row_bytes  # what CacheStats.row_bytes counts
  assert trainer.state.table.opt_slots.shape == (trainer.backend.num_slots, slot_width)
  _, slots = table.gather(np.array([0, table.num_rows - 1], np.int64))  # lazily initialised
  np.testing.assert_array_equal(
      slots, np.full((2, slot_width), c.embedding.adagrad_initial_accumulator, np.float32))


@pytest.mark.parametrize("policy", ["lru", pytest.param("lfu", marks=pytest.mark.slow)])
def test_keeping_the_next_batch_rows_removes_every_write_back_wait(policy):
  # The policy alone (keep_upcoming=0) equals the device reference (the test above).
  plain = _cache_run("adagrad", policy, 0)
  got = _cache_run("adagrad", policy, -1)  # keep_upcoming=-1: lookahead - 1
  stats, before = got.final["cache_stats"], plain.final["cache_stats"]
  assert before["ordering_waits"] > 0 and stats["evictions"] > 0, (before, stats)
  assert stats["ordering_waits"] == 0, stats
  assert stats["hits"] > before["hits"], (stats["hits"], before["hits"])  # kept rows are hit
  np.testing.assert_array_equal(got.losses, plain.losses)  # other victims, the same training
  chex.assert_trees_all_equal(_host_rows(got), _host_rows(plain))
  chex.assert_trees_all_equal(got.state.params, plain.state.params)


@pytest.mark.slow  # another policy of test_cache_training_equals_device_reference
def test_lfu_and_longer_lookahead_also_match():
  ref = _train(_config("adagrad", "device"))
  got = _train(_config("adagrad", "cache", cache_policy="lfu", lookahead=3,
                       cache_rows=3000.0))
  assert got.final["cache_stats"]["evictions"] > 0
  chex.assert_trees_all_close(got.losses, ref.losses, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(_host_rows(got)[0], np.asarray(ref.state.table.values),
                              rtol=1e-5, atol=1e-6)


def test_cache_on_eight_devices_matches_one_device_reference():
  ref = _train(_config("adam", "device"))
  c = _config("adam", "cache")
  c.train.num_devices = 8
  got = _train(c)
  assert len(got.state.table.values.sharding.device_set) == 8
  chex.assert_trees_all_close(got.losses, ref.losses, rtol=1e-4, atol=1e-5)
  chex.assert_trees_all_close(_host_rows(got)[0], np.asarray(ref.state.table.values),
                              rtol=1e-4, atol=1e-5)


def test_mmap_table_trained_flushed_reopened(tmp_path):
  path = str(tmp_path / "table")
  ref = _train(_config("adam", "device"))
  got = _train(_config("adam", "cache", host_storage="mmap", host_path=path))
  got.trainer.backend.host_table.close()
  table = host_table_lib.HostTable.open_mmap(path, writable=False)
  assert table.num_rows == ref.state.table.values.shape[0] > got.trainer.backend.num_slots
  values, slots = table.read_all()
  chex.assert_trees_all_close(values, np.asarray(ref.state.table.values), rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(slots, np.asarray(ref.state.table.opt_slots), rtol=1e-5, atol=1e-6)


def test_step_compiles_once_for_both_backends():
  for backend in ("device", "cache"):
    run = _train(_config("sgd", backend))
    assert len(set(np.diff(run.losses))) > 1
    # The cache step compiles once per (unique-row bucket, swap bucket) pair it used (rows
    # sized by the step's unique ids, fill / evict buffers by its misses), never again.
    buckets = run.final.get("cache_stats", {}).get("steps_per_shape", {None: 48})
    assert run.trainer.run_step.jitted._cache_size() == len(buckets), (backend, buckets)
    assert sum(buckets.values()) >= 48  # (the pipeline may have planned steps ahead)


def test_too_small_cache_fails_at_start_naming_minimum():
  c = _config("sgd", "cache", cache_rows=100.0)
  with pytest.raises(config_check.ConfigError, match=r"minimum capacity is 1664 rows"):
    loop.train_and_evaluate(c)


class _FailingData:
  """Wraps a dataset; its train stream raises after `fail_after` batches."""

  def __init__(self, inner, fail_after):
    self._inner, self._fail_after = inner, fail_after
    self.spec, self.eval_splits, self.oracle, self.stats = inner.spec, inner.eval_splits, None, {}

  def train_batches(self, batch_size, seed):
    for i, b in enumerate(self._inner.train_batches(batch_size, seed)):
      if i == self._fail_after:
        raise OSError("disk vanished while reading shard 7")
      yield b

  def eval_batches(self, split, batch_size):
    return self._inner.eval_batches(split, batch_size)


@pytest.mark.parametrize("backend", [pytest.param("device", marks=pytest.mark.slow), "cache"])
def test_stage_failure_propagates_and_threads_stop(backend):
  c = _config("adagrad", backend)
  data = _FailingData(dataset_lib.make_dataset(c.data, c.seed), fail_after=10)
  with pytest.raises(OSError, match="shard 7") as info:
    loop.train_and_evaluate(c, dataset=data)
  assert "train_batches" in "".join(traceback.format_tb(info.value.__traceback__))
  alive = [t.name for t in threading.enumerate() if t.name.startswith("sfjax-") and t.is_alive()]
  assert not alive, alive


def test_cache_rows_setting_validation():
  from sfjax.train import backends
  assert backends.cache_rows(0.25, 1000) == 250
  assert backends.cache_rows(300.0, 1000) == 300
  with pytest.raises(config_check.ConfigError, match="embedding.cache_rows"):
    backends.cache_rows(12.5, 1000)
