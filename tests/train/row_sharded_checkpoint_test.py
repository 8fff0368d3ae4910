"""A row-sharded device table's checkpoint restores on another device count and layout.

A 40-step run (checkpoints at 30 and 40) is copied without step 40 and resumed under
another layout: saved row-sharded on 8 devices (33812 rows: 4227 per device, 4 padding
rows), resumed on 1 device, on 8 replicated and row-sharded on 4 (8453 per device, no
padding); and saved replicated on 1 device, resumed row-sharded on 8. Each resume trains
steps 31..40 only and ends as the uninterrupted run (float tolerance: the devices sum
the batch in another order). The checkpoint reader gives the table in row order.
"""

import os
import shutil

import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import reader
from sfjax.data import dataset as dataset_lib
from sfjax.train import loop

TOL = dict(rtol=1e-4, atol=1e-4)


def _config(devices, sharding):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 2048, 256
  c.model.mlp_dims, c.model.embed_dim = (16,), 4
  c.embedding.optimizer, c.embedding.learning_rate, c.embedding.l2 = "adagrad", 0.1, 1e-4
  c.embedding.sharding = sharding
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = 40, 32, 20, 100
  c.train.eval_batch_size, c.train.num_devices = 256, devices
  c.checkpoint.every_steps, c.checkpoint.keep = 10, 2
  return c


def _run(c, workdir):
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  losses = []
  metrics, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer,
                                           loss_log=losses)
  return (metrics, jax.device_get(state.params), tuple(trainer.backend.table_rows(state)),
          np.asarray(losses))


@pytest.fixture(scope="module")
def row_ref(tmp_path_factory):
  """The uninterrupted row-sharded run on 8 devices, and its workdir."""
  workdir = str(tmp_path_factory.mktemp("row8") / "ref")
  return workdir, _run(_config(8, "row"), workdir)


def _resume(ref_dir, run_dir, config):
  shutil.copytree(ref_dir, run_dir)
  shutil.rmtree(os.path.join(run_dir, "checkpoints", "step_00000040"))
  return _run(config, run_dir)


def _assert_same_run(got, ref):
  metrics, params, table, losses = got
  ref_metrics, ref_params, ref_table, ref_losses = ref
  assert len(losses) == 10, f"trained {len(losses)} steps, not steps 31..40"
  np.testing.assert_allclose(losses, ref_losses[30:], **TOL)
  chex.assert_trees_all_close(params, ref_params, **TOL)
  chex.assert_trees_all_close(table, ref_table, **TOL)
  assert abs(metrics["auc"] - ref_metrics["auc"]) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("devices,sharding", [(1, "replicated"), (8, "replicated"), (4, "row")])
def test_saved_on_eight_row_sharded_resumes_elsewhere(tmp_path, row_ref, devices, sharding):
  ref_dir, ref = row_ref
  got = _resume(ref_dir, str(tmp_path / "run"), _config(devices, sharding))
  _assert_same_run(got, ref)
  assert got[0]["cache_sharding"] == sharding and got[0]["num_devices"] == devices


@pytest.mark.slow
def test_row_sharded_checkpoint_reads_in_row_order(row_ref):
  ref_dir, ref = row_ref
  ckpt = reader.open_checkpoint(ref_dir)
  assert ckpt.meta[reader.TABLE_LAYOUT_KEY] == {"row_shards": 8, "rows_per_shard": 4227}
  table = ckpt.table
  assert table.num_rows == 33812  # the padding rows dropped
  values, slots = table.rows(np.arange(table.num_rows))
  chex.assert_trees_all_close((values, slots), ref[2], **TOL)


@pytest.mark.slow
def test_saved_on_one_device_resumes_row_sharded_on_eight(tmp_path):
  ref_dir = str(tmp_path / "ref")
  ref = _run(_config(1, "replicated"), ref_dir)
  got = _resume(ref_dir, str(tmp_path / "run"), _config(8, "row"))
  _assert_same_run(got, ref)
