"""Run checkpoints: settings validation, orbax round trip onto another mesh, crash safety, pruning."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import table_checkpoint
from sfjax.embedding.host_table import CHUNK_ROWS
from sfjax.embedding.host_table import HostTable
from sfjax.train import checkpoint
from sfjax.train import defaults
from sfjax.train import loop
from sfjax.train.state import TrainState


def test_settings_defaults_and_errors_name_the_field():
  c = defaults.ctr_defaults()
  assert checkpoint.settings(c) == (0, 3)
  c.checkpoint.every_steps = -1
  with pytest.raises(ConfigError, match="checkpoint.every_steps"):
    checkpoint.settings(c)
  c.checkpoint.every_steps, c.checkpoint.keep = 5, 0
  with pytest.raises(ConfigError, match="checkpoint.keep"):
    checkpoint.settings(c)
  del c["checkpoint"]
  assert checkpoint.settings(c) == (0, 1)  # configs without the block: off


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


def test_a_crash_during_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
  table = _host_table()
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=table)
  table.scatter(np.array([1], np.int64), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))
  ckpt.save(_tiny_state(10), {"history": [1]})
  table.scatter(np.array([CHUNK_ROWS + 1], np.int64), np.full((1, 2), 2.0, np.float32),
                np.ones((1, 1), np.float32))

  def torn_save(table_, directory, dirty, previous):
    os.makedirs(directory)
    with open(os.path.join(directory, "chunk_00000001.npy"), "wb") as f:
      f.write(b"half")
    raise OSError("disk full")

  monkeypatch.setattr(table_checkpoint, "save_table", torn_save)
  with pytest.raises(OSError, match="disk full"):
    ckpt.save(_tiny_state(20), {"history": [1, 2]})
  monkeypatch.undo()
  # A SIGKILLed save leaves its temporary directory behind: ignored, removed by the next save.
  os.makedirs(tmp_path / "tmp.step_00000030.999" / "table")
  assert checkpoint.committed_steps(str(tmp_path)) == [10]
  assert checkpoint.read_meta(checkpoint.latest(str(tmp_path)))["history"] == [1]
  # The failed save put its dirty chunk back: the next checkpoint holds the row.
  ckpt.save(_tiny_state(20), {"history": [1, 2]})
  assert sorted(os.listdir(tmp_path)) == ["step_00000010", "step_00000020"]
  fresh = _host_table()
  restored = checkpoint.Checkpointer(str(tmp_path), keep=3, host_table=fresh).restore(
      checkpoint.latest(str(tmp_path)), _tiny_state(0))
  assert restored.step == 20 and float(restored.state.params["w"][0]) == 20.0
  chex.assert_trees_all_equal(fresh.gather(np.array([1, CHUNK_ROWS + 1])),
                              table.gather(np.array([1, CHUNK_ROWS + 1])))
  ckpt.close()


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
