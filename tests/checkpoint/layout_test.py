"""The checkpoint directory on disk: names, meta.json's CRC, verify (per-process table
shards included) and the choice of the resume point."""

import contextlib
import errno
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.checkpoint import layout as checkpoint_files
from sfjax.checkpoint import table_format, table_shards
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.checkpoint.read_retry import CheckpointReadError
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable
from sfjax.train.state import TrainState


def _state(step):
  return TrainState(jnp.int32(step), {"w": jnp.full((3,), float(step))}, {"m": jnp.zeros((2,))},
                    None)


def _table():
  return HostTable.create_ram(2 * CHUNK_ROWS, 2, 1, seed=0, init_stddev=0.1,
                              initial_slot_row=np.zeros(1, np.float32))


def _reseal(path, **changes):
  """Rewrites meta.json of checkpoint `path` with `changes` and a matching CRC-32."""
  meta = checkpoint_files.read_meta(path)
  meta.update(changes)
  meta[checkpoint_files.META_CRC] = checkpoint_files.meta_crc(meta)
  with open(os.path.join(path, checkpoint_files.META_FILE), "w", encoding="utf-8") as f:
    json.dump(meta, f)


def test_names_and_committed_steps_ignore_leftovers(tmp_path):
  assert checkpoint_files.step_dir_name(42) == "step_00000042"
  assert checkpoint_files.committed_steps(None) == [] and checkpoint_files.latest(None) is None
  with contextlib.closing(checkpoint.Checkpointer(str(tmp_path), keep=5)) as ckpt:
    ckpt.save(_state(3), {})
    ckpt.save(_state(12), {})
  for leftover in ("tmp.step_00000020.of2", "corrupt.step_00000015", "step_00000030"):
    os.makedirs(tmp_path / leftover)  # step_30 has no meta.json: not committed
  assert checkpoint_files.committed_steps(str(tmp_path)) == [3, 12]
  assert checkpoint_files.latest(str(tmp_path)) == str(tmp_path / "step_00000012")


def test_meta_crc_and_the_shard_count_are_checked(tmp_path):
  table = _table()
  table.scatter(np.array([1, CHUNK_ROWS + 2], np.int64), np.ones((2, 2), np.float32),
                np.ones((2, 1), np.float32))
  with contextlib.closing(checkpoint.Checkpointer(str(tmp_path), keep=2, host_table=table)) as ckpt:
    path = ckpt.save(_state(4), {"history": []})
  meta = checkpoint_files.verify(path)
  assert meta["processes"] == 1 and meta["table"] == "host_chunks"
  assert "table/manifest.json" in meta["files"]
  _reseal(path, processes=2)  # the table holds one process's checkpoint
  with pytest.raises(checkpoint_files.CorruptCheckpointError,
                     match=r"table: holds the shards of 1 processes, .*meta\.json says 2"):
    checkpoint_files.verify(path)
  text = (tmp_path / "step_00000004" / "meta.json").read_text().replace('"history"', '"histori"')
  (tmp_path / "step_00000004" / "meta.json").write_text(text)
  with pytest.raises(checkpoint_files.CorruptCheckpointError, match="CRC-32 mismatch"):
    checkpoint_files.read_meta(path)


def test_digests_cover_every_shard_manifest(tmp_path):
  os.makedirs(tmp_path / "dense")
  (tmp_path / "dense" / "x").write_bytes(b"abc")
  for p in range(2):
    table = _table()
    table.scatter(np.array([p], np.int64), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))
    table_format.save_table(ChangeTracker(table),
                            table_shards.shard_directory(str(tmp_path / "table"), p, 2), None)
  files = checkpoint_files.digests(str(tmp_path), with_table=True)
  assert sorted(files) == ["dense/x", "table/process_0_of_2/manifest.json",
                           "table/process_1_of_2/manifest.json"]
  assert files["dense/x"]["bytes"] == 3


def test_find_resumable_sets_a_corrupt_newest_aside(tmp_path):
  with contextlib.closing(checkpoint.Checkpointer(str(tmp_path), keep=3)) as ckpt:
    ckpt.save(_state(1), {})
    newest = ckpt.save(_state(2), {})
  dense = os.path.join(newest, "dense")
  victim = next(os.path.join(d, f) for d, _, fs in os.walk(dense) for f in fs)
  with open(victim, "ab") as f:
    f.write(b"x")
  assert checkpoint_files.find_resumable(str(tmp_path)) == str(tmp_path / "step_00000001")
  assert os.path.isdir(tmp_path / "corrupt.step_00000002")
  shutil.rmtree(tmp_path / "step_00000001")
  os.makedirs(tmp_path / "step_00000001")
  (tmp_path / "step_00000001" / "meta.json").write_text("{")
  with pytest.raises(checkpoint_files.CorruptCheckpointError, match="every checkpoint under"):
    checkpoint_files.find_resumable(str(tmp_path))


def test_a_read_error_is_retried_and_a_persistent_one_is_not_called_corruption(
    tmp_path, monkeypatch):
  with contextlib.closing(checkpoint.Checkpointer(str(tmp_path), keep=3,
                                                  host_table=_table())) as ckpt:
    ckpt.save(_state(1), {})
    newest = ckpt.save(_state(2), {})
  real_open, failures = open, {}

  def flaky_open(file, mode="r", *args, **kwargs):  # EIO for the first `limit` reads of a file
    path = str(file)
    if path.startswith(newest) and "r" in mode and failures.get(path, 0) < limit:
      failures[path] = failures.get(path, 0) + 1
      raise OSError(errno.EIO, "Input/output error")
    return real_open(file, mode, *args, **kwargs)

  monkeypatch.setattr("builtins.open", flaky_open)
  monkeypatch.setattr("time.sleep", lambda s: None)
  limit = 2  # transient: retried
  assert checkpoint_files.find_resumable(str(tmp_path)) == newest
  assert {os.path.basename(p) for p in failures} >= {"meta.json", "manifest.json"}
  failures.clear()
  limit = 10  # persistent: a named error, and nothing set aside
  with pytest.raises(CheckpointReadError, match=f"^\\[Errno 5\\] {newest}/meta.json: still "
                     "unreadable after 4 attempts"):
    checkpoint_files.find_resumable(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["step_00000001", "step_00000002"]


def test_only_own_or_ended_owners_leftovers_are_removable():
  me, alive = os.getpid(), os.getppid()
  dead = int(open("/proc/sys/kernel/pid_max").read()) + 1  # no process has this pid
  assert checkpoint_files.removable_leftover(f"tmp.step_00000010.{me}", me)
  assert checkpoint_files.removable_leftover(f"old.step_00000010.{me}", me)
  assert checkpoint_files.removable_leftover(f"tmp.step_00000010.{dead}", me)
  assert checkpoint_files.removable_leftover("tmp.step_00000010.of2", me)  # the collective save
  assert not checkpoint_files.removable_leftover(f"tmp.step_00000010.{alive}", me)
  assert not checkpoint_files.removable_leftover(f"old.step_00000010.{alive}", me)
  for name in ("step_00000010", "corrupt.step_00000010", f"tmp.step_00000010.x{me}"):
    assert not checkpoint_files.removable_leftover(name, me)
