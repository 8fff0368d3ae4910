"""Per-process table shards: layout, restore on another process count, bad shards named.

Shards are written here from one process by giving the process index and count
explicitly: process p's table holds only the rows it owns (id % P == p).
"""

import os

import chex
import numpy as np
import pytest

from sfjax.checkpoint import table_format, table_reader, table_shards
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable

ROWS = 2 * CHUNK_ROWS + 11
WRITTEN = np.array([0, 1, 2, 3, 5, 8, 13, CHUNK_ROWS + 1, CHUNK_ROWS + 6, 2 * CHUNK_ROWS + 10],
                   np.int64)


def _table():
  return HostTable.create_ram(ROWS, 3, 2, seed=4, init_stddev=0.1,
                              initial_slot_row=np.array([0.5, 0.25], np.float32))


def _rows(ids):
  values = np.stack([ids * 1.0, ids + 0.5, -ids], axis=1).astype(np.float32)
  return values, np.stack([ids * 0.1, ids * 0.2], axis=1).astype(np.float32)


def _write_shards(table_dir, count, ids=WRITTEN):
  """One table per process with its own rows of `ids`, each saved as its shard."""
  for p in range(count):
    table = _table()
    mine = ids[table_shards.owned(ids, p, count)]
    table.scatter(mine, *_rows(mine))
    table_format.save_table(ChangeTracker(table), table_shards.shard_directory(table_dir, p, count),
                            None)


def test_layout_names_and_listing(tmp_path):
  assert table_shards._shard_dir_name(1, 2) == "process_1_of_2"
  assert table_shards.shard_directory("t", 0, 1) == "t"
  assert table_shards.shard_directory("t", 1, 2) == os.path.join("t", "process_1_of_2")
  with pytest.raises(ValueError, match=r"\[0, 2\)"):
    table_shards._shard_dir_name(2, 2)
  _write_shards(str(tmp_path / "two"), 2)
  shards = table_shards.list_shards(str(tmp_path / "two"))
  assert [(s.process, s.process_count) for s in shards] == [(0, 2), (1, 2)]
  assert table_shards.stored_count(str(tmp_path / "two")) == 2
  assert table_shards.verify_shards(str(tmp_path / "two")) > 2
  _write_shards(str(tmp_path / "one"), 1)
  assert table_shards.list_shards(str(tmp_path / "one")) == [
      table_shards.Shard(str(tmp_path / "one"), 0, 1)]


@pytest.mark.parametrize("stored,restored", [(2, 1), (2, 3), (1, 2), (2, 2)])
def test_restore_on_another_process_count_keeps_exactly_the_owned_rows(tmp_path, stored,
                                                                        restored):
  stored_dir = str(tmp_path / "stored")
  _write_shards(stored_dir, stored)
  reference = _table()
  reference.scatter(WRITTEN, *_rows(WRITTEN))
  every = np.arange(ROWS, dtype=np.int64)
  seen = np.zeros(ROWS, bool)
  for p in range(restored):
    table = _table()
    tracker = ChangeTracker(table)
    same = table_shards.load_owned(table, stored_dir, p, restored, tracker)
    assert same == (stored == restored)
    mine = every[table_shards.owned(every, p, restored)]
    chex.assert_trees_all_equal(table.gather(mine), reference.gather(mine))
    assert table.num_materialised == int(table_shards.owned(WRITTEN, p, restored).sum())
    seen[mine] = True
    # The next checkpoint: a delta on the own shard (same layout) or a base of every
    # loaded chunk (another count); either restores to the same rows.
    previous = table_shards.shard_directory(stored_dir, p, restored) if same else None
    again = str(tmp_path / f"again_{p}")
    manifest = table_format.save_table(tracker, again, previous)
    own_written = WRITTEN[table_shards.owned(WRITTEN, p, restored)]
    assert sorted(int(k) for k in manifest["chunks"]) == sorted(set(own_written // CHUNK_ROWS))
    check = _table()
    table_reader.load_table(check, again)
    chex.assert_trees_all_equal(check.gather(mine), table.gather(mine))
  assert seen.all()


def test_missing_mixed_and_mislabelled_shards_are_named(tmp_path):
  _write_shards(str(tmp_path / "t"), 2)
  os.rename(tmp_path / "t" / "process_1_of_2", tmp_path / "t" / "process_1_of_3")
  with pytest.raises(ValueError, match=r"different process counts \[2, 3\]"):
    table_shards.list_shards(str(tmp_path / "t"))
  os.rename(tmp_path / "t" / "process_1_of_3", tmp_path / "t" / "moved")
  with pytest.raises(ValueError, match=r"process_1_of_2'\] of 2 processes are missing"):
    table_shards.load_owned(_table(), str(tmp_path / "t"), 0, 1)
  with pytest.raises(ValueError, match="not a table checkpoint"):
    table_shards.list_shards(str(tmp_path))
  # process 1's rows stored as process 0's shard: refused, naming the directory
  os.rename(tmp_path / "t" / "process_0_of_2", tmp_path / "t" / "zero")
  os.rename(tmp_path / "t" / "moved", tmp_path / "t" / "process_0_of_2")
  os.rename(tmp_path / "t" / "zero", tmp_path / "t" / "process_1_of_2")
  with pytest.raises(ValueError, match=r"process_0_of_2: holds row 1, which process 1 of 2 owns"):
    table_shards.load_owned(_table(), str(tmp_path / "t"), 0, 1)


def test_a_corrupt_shard_file_is_named(tmp_path):
  _write_shards(str(tmp_path), 2)
  shard = tmp_path / "process_1_of_2"
  chunk = sorted(n for n in os.listdir(shard) if n.startswith("chunk_"))[0]
  data = bytearray((shard / chunk).read_bytes())
  data[-1] ^= 0xFF
  (shard / chunk).write_bytes(bytes(data))
  with pytest.raises(ValueError, match=f"process_1_of_2/{chunk}: table checkpoint file is corrupt"):
    table_shards.verify_shards(str(tmp_path))
  with pytest.raises(ValueError, match=f"{chunk}: table checkpoint file is corrupt"):
    table_shards.load_owned(_table(), str(tmp_path), 0, 1)
  table = _table()
  with pytest.raises(ValueError, match="process index 3"):
    table_shards.load_owned(table, str(tmp_path), 3, 2)


def test_the_sharded_reader_reads_every_shard_as_one_table(tmp_path):
  _write_shards(str(tmp_path / "t"), 2)
  reference = _table()
  reference.scatter(WRITTEN, *_rows(WRITTEN))
  reader = table_shards.ShardedTableReader(str(tmp_path / "t"))
  assert reader.chunks == (0, 1, 2) and reader.num_rows == ROWS
  for k in reader.chunks:
    values, slots, flags = reader.read(k)
    ref_values, ref_slots, ref_flags = reference.read_chunk(k)
    np.testing.assert_array_equal(flags, ref_flags)
    chex.assert_trees_all_equal((values[flags], slots[flags]),
                                (ref_values[flags], ref_slots[flags]))
  other = HostTable.create_ram(ROWS, 3, 2, seed=5, init_stddev=0.1,
                               initial_slot_row=np.array([0.5, 0.25], np.float32))
  other.scatter(np.array([1], np.int64), *_rows(np.array([1], np.int64)))
  table_format.save_table(ChangeTracker(other), str(tmp_path / "u" / "process_1_of_2"), None)
  os.rename(tmp_path / "t" / "process_0_of_2", tmp_path / "u" / "process_0_of_2")
  with pytest.raises(ValueError, match=r"process_1_of_2/manifest\.json: seed=5, the first shard"):
    table_shards.ShardedTableReader(str(tmp_path / "u"))
