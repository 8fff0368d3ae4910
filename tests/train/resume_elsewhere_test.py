"""A checkpoint restores on another device count, cache size, cache policy and cache sharding.

A finished 40-step run (checkpoints at 30 and 40) is copied without step 40; the copy
is resumed with a different setting, must train only steps 31..40 and end as the
uninterrupted run: the device count only changes how the batch is split (float
tolerance), and the cache only holds exact copies of host rows, so its size, policy
and layout (a row-sharded cache over 8 devices resumed over 4) change nothing.
"""

import os
import shutil

import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.train import loop


def _config(backend, devices=1):
  c = ctr.get_config("smoke")
  c.train.num_devices, c.train.steps, c.train.eval_every, c.train.log_every = devices, 40, 20, 100
  c.train.batch_size = 128
  c.embedding.backend, c.embedding.cache_rows = backend, 0.25
  if backend == "cache-row":  # 500 rows per device: 4000 over 8 devices (the 40 steps touch
    # 7122 rows: it evicts), 2000 over 4; a batch has <= 687 distinct rows, 2 steps in flight
    c.embedding.backend, c.embedding.cache_sharding, c.embedding.cache_rows = "cache", "row", 500
    c.embedding.unique_capacity, c.train.num_devices = 768, 8
  c.checkpoint.every_steps, c.checkpoint.keep = 10, 2
  return c


def _table(trainer, state):
  if trainer.backend.host_table is not None:
    return trainer.backend.host_table.read_all()
  return jax.device_get(state.table)


def _run(c, data, workdir):
  """(final metrics, dense state, table, the losses of the steps this call trained)."""
  trainer = loop.build_trainer(c, data.spec)
  losses = []
  metrics, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer,
                                           loss_log=losses)
  dense = jax.device_get((state.step, state.params, state.opt_state))
  return metrics, dense, _table(trainer, state), np.asarray(losses)


def _assert_trained_only_after_step_30(losses, ref_losses, tol):
  """The resumed process trained steps 31..40 (not a run from step 0), as the reference did."""
  assert len(losses) == len(ref_losses) - 30, f"trained {len(losses)} steps, not 10"
  np.testing.assert_allclose(losses, ref_losses[30:], **tol)


def _resume_copy_from_step_30(ref_dir, run_dir):
  shutil.copytree(ref_dir, run_dir)
  root = os.path.join(run_dir, "checkpoints")
  shutil.rmtree(os.path.join(root, "step_00000040"))
  assert checkpoint.committed_steps(root) == [30]


@pytest.mark.parametrize("backend,change", [
    ("device", {"train.num_devices": 8}),
    ("cache", {"train.num_devices": 8}),
    ("cache", {"embedding.cache_rows": 0.5}),
    ("cache", {"embedding.cache_policy": "lfu"}),
    ("cache-row", {"train.num_devices": 4}),  # a row-sharded cache: 8 devices -> 4
])
def test_resume_with_another_setting_equals_the_uninterrupted_run(tmp_path, backend, change):
  c = _config(backend)
  data = dataset_lib.make_dataset(c.data, c.seed)
  ref, ref_dense, ref_table, ref_losses = _run(c, data, str(tmp_path / "ref"))
  _resume_copy_from_step_30(str(tmp_path / "ref"), str(tmp_path / "run"))
  for key, value in change.items():
    block, field = key.split(".")
    setattr(c[block], field, value)
  resumed, dense, table, losses = _run(c, data, str(tmp_path / "run"))
  exact = "train.num_devices" not in change  # 8 devices sum the batch in another order
  tol = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": 1e-5, "atol": 1e-6}
  _assert_trained_only_after_step_30(losses, ref_losses, tol)
  with pytest.raises(AssertionError, match="trained 40 steps"):  # a run from step 0 is caught
    _assert_trained_only_after_step_30(ref_losses, ref_losses, tol)
  if backend == "cache-row":
    assert resumed["cache_sharding"] == "row" and resumed["num_devices"] == 4
    assert ref["cache_stats"]["evictions"] > 0  # the 8-device cache held part of the table
  chex.assert_trees_all_close(dense, ref_dense, **tol)
  chex.assert_trees_all_close(table, ref_table, **tol)
  for key in ("step", "auc", "logloss", "loss"):
    np.testing.assert_allclose(resumed[key], ref[key], **tol)
