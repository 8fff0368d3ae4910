"""Tests of sfjax.embedding.host_ps: the numpy row update equals the device row optimizer."""

import chex
import jax
import numpy as np
import pytest

from sfjax.core import ConfigError
from sfjax.embedding import host_ps, row_optimizers
from sfjax.embedding import host_table as host_table_lib


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rowwise_adagrad"])
def test_host_update_equals_device_row_optimizer(name):
  rng = np.random.default_rng(0)
  rows = rng.normal(size=(5, 4)).astype(np.float32)
  grads = rng.normal(size=(5, 4)).astype(np.float32)
  device_opt = row_optimizers.make(name, 0.05, _Settings())
  slots = np.tile(device_opt.initial_slot_row(4), (5, 1)).astype(np.float32)
  want = jax.jit(device_opt.update)(rows, slots, grads, 3)
  got = host_ps.make_host_row_optimizer(name, 0.05).update(rows, slots, grads, 3)
  chex.assert_trees_all_close(got, tuple(np.asarray(x) for x in want), rtol=1e-6, atol=1e-6)


def test_aggregate_row_grads_sums_equal_ids():
  ids = np.array([7, 2, 7, 7])
  grads = np.arange(8, dtype=np.float32).reshape(4, 2)
  uniq, summed = host_ps.aggregate_row_grads(ids, grads)
  np.testing.assert_array_equal(uniq, [2, 7])
  np.testing.assert_array_equal(summed, [[2, 3], [0 + 4 + 6, 1 + 5 + 7]])


def test_apply_row_grads_updates_each_touched_row_once():
  opt = host_ps.make_host_row_optimizer("rowwise_adagrad", 0.1)
  table = host_table_lib.HostTable.create_ram(10, 3, 1, seed=0, init_stddev=0.1,
                                              initial_slot_row=np.full((1,), 0.1, np.float32))
  before, slots0 = table.gather(np.array([4, 9]))
  grads = np.ones((3, 3), np.float32)
  assert host_ps.apply_row_grads(table, opt, np.array([4, 9, 4]), grads, 1) == 2
  after, _ = table.gather(np.array([4, 9]))
  want4, _ = opt.update(before[:1], slots0[:1], 2 * grads[:1], 1)  # id 4 twice: summed
  want9, _ = opt.update(before[1:], slots0[1:], grads[:1], 1)
  np.testing.assert_allclose(after, np.concatenate([want4, want9]), rtol=1e-6)
  np.testing.assert_array_equal(host_ps.pull_rows(table, np.array([[4], [4]])),
                                np.stack([after[0], after[0]]))
  untouched, _ = table.gather(np.array([5]))
  np.testing.assert_array_equal(untouched, host_table_lib.HostTable.create_ram(
      10, 3, 1, seed=0, init_stddev=0.1,
      initial_slot_row=np.full((1,), 0.1, np.float32)).gather(np.array([5]))[0])


def test_unknown_optimizer_names_the_field():
  with pytest.raises(ConfigError, match="embedding.optimizer"):
    host_ps.make_host_row_optimizer("adam", 0.1)


class _Settings:
  adagrad_initial_accumulator = 0.1
