"""Run checkpoints: settings validation, orbax round trip onto another mesh, crash safety, pruning."""

import json
import os
import shutil
import threading

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.checkpoint import layout as checkpoint_files
from sfjax.checkpoint import table_format as table_checkpoint
from sfjax.checkpoint import table_shards
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable
from sfjax.train import defaults, loop
from sfjax.train.state import TrainState


def test_settings_defaults_and_errors_name_the_field():
  c = defaults.ctr_defaults()
  assert checkpoint.checkpoint_settings(c) == (0, 3)
  c.checkpoint.every_steps = -1
  with pytest.raises(ConfigError, match="checkpoint.every_steps"):
    checkpoint.checkpoint_settings(c)
  c.checkpoint.every_steps, c.checkpoint.keep = 5, 0
  with pytest.raises(ConfigError, match="checkpoint.keep"):
    checkpoint.checkpoint_settings(c)
  del c["checkpoint"]
  assert checkpoint.checkpoint_settings(c) == (0, 1)  # configs without the block: off


def test_device_state_restores_onto_a_different_device_count(tmp_path):
  c = ctr.get_config("smoke")
  c.train.num_devices = 8
  data = dataset_lib.make_dataset(c.data, c.seed)
  saved = loop.build_trainer(c, data.spec).state
  saved = saved._replace(step=saved.step + 7,
                         table=saved.table._replace(values=saved.table.values + 1.0))
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2)
  path = ckpt.save(saved, {"history": []})
  assert path == os.path.join(str(tmp_path), "step_00000007")
  c.train.num_devices = 1
  target = loop.build_trainer(c, data.spec).state
  restored = ckpt.restore(checkpoint.latest(str(tmp_path)), target)
  ckpt.close()
  assert restored.step == 7 and restored.meta["batches_consumed"] == 7
  chex.assert_trees_all_equal(jax.device_get(restored.state), jax.device_get(saved))
  assert restored.state.table.values.sharding.mesh.size == 1


def _tiny_state(step):
  return TrainState(jnp.int32(step), {"w": jnp.full((3,), float(step))}, {"m": jnp.zeros((2,))},
                    None)


def _host_table():
  return HostTable.create_ram(2 * CHUNK_ROWS, 2, 1, seed=0, init_stddev=0.1,
                              initial_slot_row=np.zeros(1, np.float32))


@pytest.mark.parametrize("async_table", [True, False])
def test_a_crash_during_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch, async_table):
  table = _host_table()
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=table, async_table=async_table)
  table.scatter(np.array([1], np.int64), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))
  ckpt.save(_tiny_state(10), {"history": [1]})
  table.scatter(np.array([CHUNK_ROWS + 1], np.int64), np.full((1, 2), 2.0, np.float32),
                np.ones((1, 1), np.float32))

  def torn_write(snapshot, table_, directory, plan, previous):
    os.makedirs(directory)
    with open(os.path.join(directory, "delta_000000_0000.ids.npy"), "wb") as f:
      f.write(b"half")
    raise OSError("disk full")

  monkeypatch.setattr(table_checkpoint, "write_table", torn_write)
  if async_table:  # the failure surfaces at the next wait / save, naming the last good one
    ckpt.save(_tiny_state(20), {"history": [1, 2]})
    with pytest.raises(checkpoint.CheckpointSaveError,
                       match=r"step_00000020 was not saved \(OSError: disk full\); the last "
                             r"good checkpoint is .*step_00000010"):
      ckpt.wait()
  else:
    with pytest.raises(OSError, match="disk full"):
      ckpt.save(_tiny_state(20), {"history": [1, 2]})
  monkeypatch.undo()
  # A SIGKILLed save leaves its temporary directory behind: ignored, removed by the next save;
  # a live process's (another run on this directory) is never touched.
  dead = int(open("/proc/sys/kernel/pid_max").read()) + 1  # no process has this pid
  os.makedirs(tmp_path / f"tmp.step_00000030.{dead}" / "table")
  os.makedirs(tmp_path / f"tmp.step_00000030.{os.getppid()}" / "table")
  assert checkpoint.committed_steps(str(tmp_path)) == [10]
  assert checkpoint.read_meta(checkpoint.latest(str(tmp_path)))["history"] == [1]
  # The failed save put its dirty row back: the next checkpoint holds it.
  ckpt.save(_tiny_state(20), {"history": [1, 2]})
  ckpt.wait()
  assert sorted(os.listdir(tmp_path)) == ["step_00000010", "step_00000020",
                                          f"tmp.step_00000030.{os.getppid()}"]
  fresh = _host_table()
  restored = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=fresh).restore(
      checkpoint.latest(str(tmp_path)), _tiny_state(0))
  assert restored.step == 20 and float(restored.state.params["w"][0]) == 20.0
  chex.assert_trees_all_equal(fresh.gather(np.array([1, CHUNK_ROWS + 1])),
                              table.gather(np.array([1, CHUNK_ROWS + 1])))
  ckpt.close()


def test_an_async_save_holds_the_table_as_it_was_while_training_writes_on(tmp_path, monkeypatch):
  table = _host_table()
  ids = np.arange(0, 2 * CHUNK_ROWS, 1000, dtype=np.int64)
  table.scatter(ids, np.ones((ids.size, 2), np.float32), np.ones((ids.size, 1), np.float32))
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=table,
                                 snapshot_budget_bytes=1)  # one copy at a time, then writes wait
  started, release = threading.Event(), threading.Event()
  real_write = table_checkpoint.write_table

  def slow_write(*args):
    started.set()
    release.wait(10)
    return real_write(*args)

  monkeypatch.setattr(table_checkpoint, "write_table", slow_write)
  expected = table.gather(ids)
  ckpt.save(_tiny_state(5), {})  # returns before the table files are written
  assert started.wait(10) and checkpoint.committed_steps(str(tmp_path)) == []
  table.scatter(ids[:3], np.full((3, 2), 7.0, np.float32), np.ones((3, 1), np.float32))  # copied

  def writes_beyond_the_budget():
    table.scatter(ids[-3:], np.full((3, 2), 8.0, np.float32), np.ones((3, 1), np.float32))

  waiter = threading.Thread(target=writes_beyond_the_budget)
  waiter.start()
  waiter.join(0.3)
  assert waiter.is_alive()  # chunk 1 cannot be copied (budget): the write waits for the writer
  release.set()
  waiter.join(10)
  assert not waiter.is_alive()
  assert ckpt.wait() == os.path.join(str(tmp_path), "step_00000005")
  assert ckpt.last_save["kind"] == "base" and ckpt.last_save["snapshot_waits"] >= 1
  ckpt.close()
  fresh = _host_table()
  checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=fresh).restore(
      checkpoint.latest(str(tmp_path)), _tiny_state(0))
  chex.assert_trees_all_equal(fresh.gather(ids), expected)  # the table at save time
  # The rows written while the save ran are dirty for the next one.
  assert sorted(ckpt.tracker.pop_dirty_rows().tolist()) == sorted([*ids[:3], *ids[-3:]])


def test_keeps_the_newest_and_refuses_the_other_backend(tmp_path):
  table = _host_table()
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2, host_table=table)
  for step in (1, 2, 3):
    table.scatter(np.array([step], np.int64), np.ones((1, 2), np.float32),
                  np.ones((1, 1), np.float32))
    ckpt.save(_tiny_state(step), {})
  ckpt.close()
  assert checkpoint.committed_steps(str(tmp_path)) == [2, 3]
  dense_only = checkpoint.Checkpointer(str(tmp_path), keep=2)
  with pytest.raises(ValueError, match="same embedding.backend"):
    dense_only.restore(checkpoint.latest(str(tmp_path)), _tiny_state(0))
  dense_only.close()
  wider = _tiny_state(0)._replace(params={"w": jnp.zeros((5,))})
  with pytest.raises(ValueError, match="step_00000003: does not fit this run's state"):
    checkpoint.Checkpointer(str(tmp_path), 2, host_table=_host_table()).restore(
        checkpoint.latest(str(tmp_path)), wider)


def test_verify_names_a_corrupt_file_and_find_resumable_skips_it(tmp_path, caplog):
  table = _host_table()
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=table)
  for step in (1, 2):
    table.scatter(np.array([step], np.int64), np.ones((1, 2), np.float32),
                  np.ones((1, 1), np.float32))
    ckpt.save(_tiny_state(step), {})
  ckpt.close()
  newest = os.path.join(str(tmp_path), "step_00000002")
  meta = checkpoint.verify(newest)
  assert "dense/" in "".join(meta["files"]) and "table/manifest.json" in meta["files"]
  dense_file = next(os.path.join(newest, rel) for rel in meta["files"] if rel.startswith("dense"))
  with open(dense_file, "ab") as f:
    f.write(b"x")
  with pytest.raises(checkpoint.CorruptCheckpointError, match=dense_file):
    checkpoint.verify(newest)
  assert checkpoint.find_resumable(str(tmp_path)) == os.path.join(str(tmp_path), "step_00000001")
  assert "step_00000002 is corrupt" in caplog.text
  assert sorted(os.listdir(tmp_path)) == ["corrupt.step_00000002", "step_00000001"]
  assert checkpoint.find_resumable(str(tmp_path / "none")) is None
  os.remove(os.path.join(str(tmp_path), "step_00000001", "table", "manifest.json"))
  with pytest.raises(checkpoint.CorruptCheckpointError, match="every checkpoint .* is corrupt"):
    checkpoint.find_resumable(str(tmp_path))


def test_zero_width_optimizer_slots_round_trip(tmp_path):
  """SGD rows have no optimizer slots ([V, 0]); orbax refuses zero-size arrays."""
  c = ctr.get_config("smoke")
  c.train.num_devices, c.embedding.optimizer = 1, "sgd"
  data = dataset_lib.make_dataset(c.data, c.seed)
  saved = loop.build_trainer(c, data.spec).state
  assert saved.table.opt_slots.size == 0
  saved = saved._replace(step=saved.step + 3,
                         table=saved.table._replace(values=saved.table.values * 2.0))
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1)
  ckpt.save(saved, {})
  restored = ckpt.restore(checkpoint.latest(str(tmp_path)), loop.build_trainer(c, data.spec).state)
  ckpt.close()
  chex.assert_trees_all_equal(jax.device_get(restored.state), jax.device_get(saved))


def test_meta_is_taken_at_save_time_not_when_written(tmp_path, monkeypatch):
  table = _host_table()
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1, host_table=table)
  release = threading.Event()
  real_write = table_checkpoint.write_table
  monkeypatch.setattr(table_checkpoint, "write_table",
                      lambda *a: (release.wait(10), real_write(*a))[1])
  pending = [1, 2]
  ckpt.save(_tiny_state(3), {"pending_unique_counts": pending})
  pending.append(3)  # the loop goes on while the table is written
  release.set()
  assert checkpoint.read_meta(ckpt.wait())["pending_unique_counts"] == [1, 2]
  ckpt.close()


def test_a_checkpoint_of_two_process_shards_restores_in_one_process(tmp_path):
  """The table of a 2-process checkpoint (process p's rows, id % 2 == p, in
  table/process_p_of_2/) restores whole in one process, whose next save is a base."""
  ids = np.array([0, 1, 2, 5, CHUNK_ROWS + 3, CHUNK_ROWS + 4], np.int64)
  values = np.stack([ids, -ids], 1).astype(np.float32)
  table = _host_table()
  table.scatter(ids, values, np.ones((ids.size, 1), np.float32))
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=table)
  path = ckpt.save(_tiny_state(7), {"history": []})
  ckpt.close()
  shutil.rmtree(os.path.join(path, "table"))  # rewritten as the two processes' shards
  for p in range(2):
    shard = _host_table()
    mine = ids[ids % 2 == p]
    shard.scatter(mine, *table.gather(mine))
    table_checkpoint.save_table(ChangeTracker(shard), table_shards.shard_directory(
        os.path.join(path, "table"), p, 2), None)
  meta = checkpoint.read_meta(path)
  meta.update(table="host_shards", processes=2, files=checkpoint_files.digests(path, True))
  meta[checkpoint_files.META_CRC] = checkpoint_files.meta_crc(meta)
  with open(os.path.join(path, checkpoint.META_FILE), "w", encoding="utf-8") as f:
    json.dump(meta, f)
  assert checkpoint.find_resumable(str(tmp_path)) == path
  fresh = _host_table()
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=fresh)
  restored = ckpt.restore(path, _tiny_state(0))
  assert restored.step == 7 and fresh.num_materialised == ids.size
  chex.assert_trees_all_equal(fresh.gather(ids), table.gather(ids))
  ckpt.save(_tiny_state(8), {"history": []})  # a base of every restored chunk (no shard is ours)
  ckpt.wait()
  assert ckpt.last_save["kind"] == "base" and ckpt.last_save["chunks"] == 2
  again = _host_table()
  checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=again).restore(
      checkpoint.latest(str(tmp_path)), _tiny_state(0))
  chex.assert_trees_all_equal(again.gather(ids), table.gather(ids))
  ckpt.close()
