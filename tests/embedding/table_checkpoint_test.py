"""Host-table checkpoints: chunked, incremental (hard links), verified, refusing the wrong table."""

import json
import os

import chex
import numpy as np
import pytest

from sfjax.embedding import table_checkpoint
from sfjax.embedding.host_table import CHUNK_ROWS
from sfjax.embedding.host_table import HostTable

ROWS = 3 * CHUNK_ROWS + 5  # three full chunks and a short one


def _table(num_rows=ROWS, seed=1):
  return HostTable.create_ram(num_rows, 3, 2, seed=seed, init_stddev=0.1,
                              initial_slot_row=np.array([0.5, 0.25], np.float32))


def _write(table, ids, value):
  ids = np.asarray(ids, np.int64)
  table.scatter(ids, np.full((ids.size, 3), value, np.float32),
                np.full((ids.size, 2), -value, np.float32))


def test_round_trip_writes_only_chunks_with_rows(tmp_path):
  src = _table()
  _write(src, [0, 7, 3 * CHUNK_ROWS + 4], 1.5)
  manifest = table_checkpoint.save_table(src, str(tmp_path / "c1"), src.pop_dirty_chunks(), None)
  assert sorted(manifest["chunks"]) == ["0", "3"]  # chunks 1 and 2 hold no written row
  assert sorted(os.listdir(tmp_path / "c1")) == ["chunk_00000000.npy", "chunk_00000003.npy",
                                                 "manifest.json"]
  dst = _table()
  assert table_checkpoint.load_table(dst, str(tmp_path / "c1")) == 2
  assert dst.num_materialised == 3
  ids = np.array([0, 7, 8, CHUNK_ROWS, 3 * CHUNK_ROWS + 4], np.int64)
  chex.assert_trees_all_equal(dst.gather(ids), src.gather(ids))


def test_unchanged_chunks_are_hard_links_of_the_previous_checkpoint(tmp_path):
  table = _table()
  _write(table, [1, CHUNK_ROWS + 1], 1.0)
  table_checkpoint.save_table(table, str(tmp_path / "a"), table.pop_dirty_chunks(), None)
  _write(table, [CHUNK_ROWS + 2], 2.0)  # only chunk 1 changes
  dirty = table.pop_dirty_chunks()
  assert dirty.tolist() == [1]
  table_checkpoint.save_table(table, str(tmp_path / "b"), dirty, str(tmp_path / "a"))
  same = os.path.samefile(tmp_path / "a" / "chunk_00000000.npy", tmp_path / "b" / "chunk_00000000.npy")
  changed = os.path.samefile(tmp_path / "a" / "chunk_00000001.npy",
                             tmp_path / "b" / "chunk_00000001.npy")
  assert same and not changed
  for name in os.listdir(tmp_path / "a"):  # b is self-contained: a can be deleted
    os.remove(tmp_path / "a" / name)
  restored = _table()
  table_checkpoint.load_table(restored, str(tmp_path / "b"))
  ids = np.array([1, CHUNK_ROWS + 1, CHUNK_ROWS + 2, 5], np.int64)
  chex.assert_trees_all_equal(restored.gather(ids), table.gather(ids))


def test_corrupt_chunk_is_named(tmp_path):
  table = _table()
  _write(table, [2], 1.0)
  table_checkpoint.save_table(table, str(tmp_path / "c"), table.pop_dirty_chunks(), None)
  path = tmp_path / "c" / "chunk_00000000.npy"
  data = bytearray(path.read_bytes())
  data[-1] ^= 0xFF
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError, match="chunk_00000000.npy: table checkpoint chunk is corrupt"):
    table_checkpoint.load_table(_table(), str(tmp_path / "c"))
  with pytest.raises(ValueError, match="chunk_00000000.npy: table checkpoint chunk is corrupt"):
    table_checkpoint.verify_table(str(tmp_path / "c"))  # checks without loading
  path.write_bytes(bytes(data[:100]))  # truncated
  with pytest.raises(ValueError, match="chunk_00000000.npy: .*size 100 vs"):
    table_checkpoint.verify_table(str(tmp_path / "c"))
  path.unlink()
  with pytest.raises(ValueError, match="chunk_00000000.npy: unreadable"):
    table_checkpoint.verify_table(str(tmp_path / "c"))


def test_verify_table_counts_good_chunks(tmp_path):
  table = _table()
  _write(table, [2, CHUNK_ROWS + 1], 1.0)
  table_checkpoint.save_table(table, str(tmp_path / "c"), table.pop_dirty_chunks(), None)
  assert table_checkpoint.verify_table(str(tmp_path / "c")) == 2


def test_refuses_another_table_or_a_used_one(tmp_path):
  table = _table()
  _write(table, [2], 1.0)
  table_checkpoint.save_table(table, str(tmp_path / "c"), table.pop_dirty_chunks(), None)
  with pytest.raises(ValueError, match="seed=1"):
    table_checkpoint.load_table(_table(seed=2), str(tmp_path / "c"))
  with pytest.raises(ValueError, match="num_rows"):
    table_checkpoint.load_table(_table(num_rows=10), str(tmp_path / "c"))
  with pytest.raises(ValueError, match="freshly created"):
    table_checkpoint.load_table(table, str(tmp_path / "c"))
  manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
  assert manifest["chunks"]["0"]["file"] == "chunk_00000000.npy"
  (tmp_path / "c" / "manifest.json").write_text("{")
  with pytest.raises(ValueError, match="manifest.json: unreadable"):
    table_checkpoint.load_table(_table(), str(tmp_path / "c"))


def test_discard_mmap_table_removes_only_a_host_table(tmp_path):
  path = tmp_path / "host"
  table = HostTable.create_mmap(str(path), 10, 2, 1, seed=0, init_stddev=0.1,
                                initial_slot_row=np.zeros(1, np.float32))
  table.close()
  assert table_checkpoint.discard_mmap_table(str(path)) and not path.exists()
  assert not table_checkpoint.discard_mmap_table(str(path))
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("keep")
  with pytest.raises(ValueError, match="not a host table directory"):
    table_checkpoint.discard_mmap_table(str(other))
  assert (other / "notes.txt").exists()
