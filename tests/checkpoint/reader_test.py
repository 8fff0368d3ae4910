"""`open_checkpoint`: a trained run's params, optimizer state and table, read without the run."""

import contextlib
import json
import os
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs import ctr
from sfjax.checkpoint import (
  checkpointer,
  layout,
  open_checkpoint,
  reader,
  table_format,
  table_shards,
)
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.data import dataset as dataset_lib
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable
from sfjax.embedding.initializers import init_rows
from sfjax.train import loop
from sfjax.train.state import TrainState

STEPS = 8


@pytest.fixture(scope="module", params=["device", "cache"])
def trained(request, tmp_path_factory):
  """(workdir, final state, final table (values, slots)) of a short run on one backend."""
  c = ctr.get_config("smoke")
  c.train.num_devices, c.train.steps, c.train.eval_every, c.train.batch_size = 1, STEPS, STEPS, 128
  c.embedding.backend, c.embedding.cache_rows = request.param, 0.25  # the cache evicts
  c.checkpoint.every_steps, c.checkpoint.keep = STEPS // 2, 2
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  workdir = str(tmp_path_factory.mktemp(request.param) / "run")
  _, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer)
  if trainer.backend.host_table is not None:
    table = trainer.backend.host_table.read_all()
  else:
    table = jax.device_get((state.table.values, state.table.opt_slots))
  return workdir, jax.device_get(state), table


def test_open_checkpoint_reads_the_state_the_trainer_ended_with(trained):
  workdir, state, (values, slots) = trained
  ckpt = open_checkpoint(workdir)
  assert ckpt.step == STEPS and ckpt.path.endswith(f"step_{STEPS:08d}")
  chex.assert_trees_all_equal(ckpt.params, nnx.to_pure_dict(state.params))
  # orbax keeps the values, not optax's named tuples: compare leaf by leaf, in order.
  chex.assert_trees_all_equal(jax.tree.leaves(ckpt.opt_state), jax.tree.leaves(state.opt_state))
  table = ckpt.table
  assert (table.num_rows, table.width, table.slot_width) == (values.shape + slots.shape[1:])
  got_values, got_slots = table.rows(np.arange(table.num_rows))
  chex.assert_trees_all_equal((got_values, got_slots), (values, slots))
  chunks = list(table.chunks())
  assert [lo for lo, _, _ in chunks] == list(range(0, table.num_rows, CHUNK_ROWS))
  chex.assert_trees_all_equal(np.concatenate([v for _, v, _ in chunks]), values)
  ids = np.array([table.num_rows - 1, 3, 3, 0], np.int64)  # any order, repeats
  chex.assert_trees_all_equal(table.rows(ids), (values[ids], slots[ids]))
  with pytest.raises(ValueError, match=f"step_{STEPS:08d}: row id {table.num_rows} is outside"):
    table.rows(np.array([table.num_rows]))


def test_the_path_may_be_a_workdir_its_root_or_a_checkpoint(trained, tmp_path, caplog):
  workdir, _, _ = trained
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  root = os.path.join(run, "checkpoints")
  newest, older = (os.path.join(root, f"step_{s:08d}") for s in (STEPS, STEPS // 2))
  assert open_checkpoint(root).path == newest
  assert open_checkpoint(older).step == STEPS // 2
  dense_file = next(os.path.join(d, n) for d, _, ns in os.walk(os.path.join(newest, "dense"))
                    for n in ns)
  with open(dense_file, "ab") as f:
    f.write(b"x")
  assert open_checkpoint(run).path == older  # the newest is corrupt: skipped, not renamed
  assert "skipping a corrupt checkpoint" in caplog.text and os.path.isdir(newest)
  with pytest.raises(layout.CorruptCheckpointError, match=dense_file):
    open_checkpoint(newest)
  assert open_checkpoint(newest, verify=False).step == STEPS  # meta.json alone is intact
  with pytest.raises(FileNotFoundError, match="no checkpoint here"):
    open_checkpoint(str(tmp_path))


def _tiny_state(step):
  return TrainState(jnp.int32(step), {"w": jnp.arange(3.0)}, {"m": jnp.zeros((2,))}, None)


def _host_table():
  return HostTable.create_ram(2 * CHUNK_ROWS, 2, 1, seed=3, init_stddev=0.1,
                              initial_slot_row=np.full(1, 0.5, np.float32))


def test_per_process_shards_read_as_one_table_unwritten_rows_initial(tmp_path):
  ids = np.array([0, 1, 6, CHUNK_ROWS + 3], np.int64)
  table = _host_table()
  table.scatter(ids, np.stack([ids, -ids], 1).astype(np.float32), np.ones((4, 1), np.float32))
  with contextlib.closing(checkpointer.Checkpointer(str(tmp_path), 2, host_table=table)) as ckpt:
    path = ckpt.save(_tiny_state(5), {})
  shutil.rmtree(os.path.join(path, "table"))  # rewritten as two processes' shards
  for p in range(2):
    shard = _host_table()
    mine = ids[table_shards.owned(ids, p, 2)]
    shard.scatter(mine, *table.gather(mine))
    table_format.save_table(ChangeTracker(shard),
                            table_shards.shard_directory(os.path.join(path, "table"), p, 2), None)
  got = open_checkpoint(path, verify=False)  # the manifests changed: meta's digests are stale
  assert got.table_kind == "host_chunks"
  every = np.arange(2 * CHUNK_ROWS)
  chex.assert_trees_all_equal(got.table.rows(every), table.gather(every))
  values, slots = got.table.rows(np.array([2]))  # never written: its initial value
  np.testing.assert_array_equal(values, init_rows(3, 0, np.array([2]), 2, 0.1))
  assert slots.tolist() == [[0.5]]
  chex.assert_trees_all_equal(got.params, {"w": np.arange(3.0, dtype=np.float32)})


def test_old_manifests_take_the_initial_slots_from_the_run_config(tmp_path):
  table = _host_table()
  table.scatter(np.array([1]), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))
  root = tmp_path / "run" / "checkpoints"
  with contextlib.closing(checkpointer.Checkpointer(str(root), 2, host_table=table)) as ckpt:
    path = ckpt.save(_tiny_state(5), {})
  manifest_path = os.path.join(path, "table", "manifest.json")
  manifest = json.load(open(manifest_path))
  del manifest["initial_slot_row"]  # as written before the slots were recorded
  json.dump(manifest, open(manifest_path, "w"))
  with pytest.raises(ValueError, match="does not record the initial optimizer slots"):
    _ = open_checkpoint(path, verify=False).table
  c = ctr.get_config("smoke")
  c.embedding.optimizer, c.embedding.adagrad_initial_accumulator = "rowwise_adagrad", 0.5
  (tmp_path / "run" / "config.json").write_text(c.to_json())
  assert open_checkpoint(path, verify=False).table.rows(np.array([2]))[1].tolist() == [[0.5]]


def test_restore_dense_needs_a_fitting_target(tmp_path):
  with contextlib.closing(checkpointer.Checkpointer(str(tmp_path), 2)) as ckpt:
    path = ckpt.save(_tiny_state(5)._replace(table={"values": jnp.ones((4, 2)),
                                                    "opt_slots": jnp.zeros((4, 0))}), {})
  got = open_checkpoint(path)
  dense = got.dense()
  assert dense["table"]["opt_slots"] is None  # zero-size arrays are not saved
  assert got.table.rows(np.array([3]))[1].shape == (1, 0)
  target = {"step": jnp.int32(0), "params": {"w": jnp.zeros(3)}, "opt_state": {"m": jnp.ones(2)},
            "table": {"values": jnp.zeros((4, 2)), "opt_slots": jnp.zeros((4, 0))}}
  restored = got.restore_dense(target)
  assert int(restored["step"]) == 5 and restored["table"]["opt_slots"].shape == (4, 0)
  with pytest.raises(ValueError):
    got.restore_dense(dict(target, params={"w": jnp.zeros(5)}))


def test_pure_params_unwraps_nnx_state():
  restored = {"mlp": {"hidden": {"0": {"kernel": {"value": np.ones((2, 3))}},
                                 "1": {"bias": {"value": np.zeros(3)}}}},
              "dense_linear": {"kernel": {"value": np.ones(2)}}}
  pure = reader.pure_params(restored)
  assert set(pure["mlp"]["hidden"]) == {0, 1}
  assert pure["mlp"]["hidden"][0]["kernel"].shape == (2, 3)
  assert pure["dense_linear"]["kernel"].shape == (2,)


def test_with_empty_leaves_fills_only_the_model_s_empty_leaves():
  model = {"dense": {"kernel": jax.ShapeDtypeStruct((0, 4), np.float32)},
           "mlp": {"kernel": np.ones((2, 3), np.float32)}}
  restored = {"dense": {"kernel": None}, "mlp": {"kernel": np.full((2, 3), 5.0, np.float32)}}
  got = reader.with_empty_leaves(restored, model)
  assert got["dense"]["kernel"].shape == (0, 4) and got["dense"]["kernel"].dtype == np.float32
  np.testing.assert_array_equal(got["mlp"]["kernel"], restored["mlp"]["kernel"])
  # A missing leaf of a non-empty shape stays missing (the shape check then names it).
  assert reader.with_empty_leaves({"mlp": {"kernel": None}}, model)["mlp"]["kernel"] is None
