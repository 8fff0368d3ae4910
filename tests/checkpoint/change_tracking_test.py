"""What changed in a host table since a checkpoint: dirty rows and chunks, copy-on-write snapshots."""

import threading

import chex
import numpy as np
import pytest

from sfjax.checkpoint.change_tracking import ChangeTracker, _DirtyRows
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable


def test_dirty_rows_are_distinct_sorted_and_survive_compaction():
  rows = _DirtyRows(compact_at=4)
  rows.add(np.array([9, 3, 3], np.int64))
  rows.add(np.array([3, 1], np.int64))  # past compact_at: deduplicated, still all there
  rows.add(np.zeros((0,), np.int64))
  assert rows.count() == 3
  assert rows.pop().tolist() == [1, 3, 9]
  assert rows.pop().tolist() == []
  rows.mark([5, 2])  # a failed checkpoint puts its rows back
  assert rows.pop().tolist() == [2, 5]


def test_added_ids_are_copied():
  rows = _DirtyRows()
  ids = np.array([4, 2], np.int64)
  rows.add(ids)
  ids[:] = 0
  assert rows.pop().tolist() == [2, 4]


def _table(num_rows=3 * CHUNK_ROWS):
  return HostTable.create_ram(num_rows, 2, 1, seed=0, init_stddev=0.1,
                              initial_slot_row=np.zeros(1, np.float32))


def _write(table, ids, value):
  ids = np.asarray(ids, np.int64)
  table.scatter(ids, np.full((ids.size, 2), value, np.float32), np.ones((ids.size, 1), np.float32))


def test_writes_mark_rows_and_chunks_until_popped():
  table = _table(2 * CHUNK_ROWS + 3)
  tracker = ChangeTracker(table)
  assert tracker.pop_dirty_chunks().tolist() == [] and tracker.num_dirty_rows() == 0
  _write(table, [5, 2 * CHUNK_ROWS + 1], 1.0)
  _write(table, [5], 2.0)
  assert tracker.num_dirty_rows() == 2
  assert tracker.pop_dirty_chunks().tolist() == [0, 2]
  assert tracker.pop_dirty_chunks().tolist() == []
  assert tracker.pop_dirty_rows().tolist() == [5, 2 * CHUNK_ROWS + 1]
  tracker.mark_dirty_chunks([1])  # a failed checkpoint puts them back
  tracker.mark_dirty_rows([7])
  assert tracker.pop_dirty_chunks().tolist() == [1] and tracker.pop_dirty_rows().tolist() == [7]


def test_rows_written_before_tracking_count_restored_rows_do_not():
  table = _table()
  _write(table, [3, CHUNK_ROWS + 4], 1.0)
  tracker = ChangeTracker(table)  # a late tracker: the first base must hold these rows
  assert tracker.pop_dirty_rows().tolist() == [3, CHUNK_ROWS + 4]
  assert tracker.pop_dirty_chunks().tolist() == [0, 1]
  table.load_rows(np.array([2 * CHUNK_ROWS], np.int64), np.ones((1, 2), np.float32),
                  np.ones((1, 1), np.float32))  # a restore: no change since the checkpoint
  assert tracker.pop_dirty_rows().tolist() == [] and tracker.pop_dirty_chunks().tolist() == []


def test_detach_stops_tracking():
  table = _table()
  tracker = ChangeTracker(table)
  _write(table, [1], 1.0)
  tracker.detach()
  tracker.detach()  # idempotent
  _write(table, [CHUNK_ROWS + 1], 1.0)
  assert tracker.pop_dirty_rows().tolist() == [1]
  other = ChangeTracker(table)  # a new tracker sees both rows the table holds
  assert other.pop_dirty_rows().tolist() == [1, CHUNK_ROWS + 1]


def test_snapshot_reads_chunks_as_they_were():
  table = _table()
  tracker = ChangeTracker(table)
  _write(table, [1, CHUNK_ROWS], 1.0)
  before = [table.read_chunk(k) for k in range(3)]
  snap = tracker.begin_snapshot([0, 1, 2], budget_bytes=1 << 30)
  with pytest.raises(RuntimeError, match="still open"):
    tracker.begin_snapshot([0], budget_bytes=0)
  _write(table, [1, 2 * CHUNK_ROWS + 3], 5.0)  # chunks 0 and 2 copied first
  assert snap.copies_made == 2 and snap.copied_bytes > 0
  for k in (2, 0, 1):
    chex.assert_trees_all_equal(snap.read_chunk(k), before[k])
  assert snap.copied_bytes == 0
  with pytest.raises(KeyError, match="chunk 0"):
    snap.read_chunk(0)  # each chunk once
  _write(table, [3], 6.0)  # read already: no copy
  assert snap.copies_made == 2
  snap.close()
  tracker.begin_snapshot([], budget_bytes=0).close()  # a closed snapshot frees the slot


def test_a_write_over_budget_waits_for_the_reader_and_close_releases_it():
  table = _table()
  snap = ChangeTracker(table).begin_snapshot([0, 1], budget_bytes=1)
  _write(table, [1], 1.0)  # the first copy is always allowed
  done = threading.Event()
  writer = threading.Thread(target=lambda: (_write(table, [CHUNK_ROWS + 1], 2.0), done.set()))
  writer.start()
  assert not done.wait(0.3)  # chunk 1 cannot be copied: over budget
  snap.read_chunk(1)  # the reader takes chunk 1 live: the write may go on
  assert done.wait(10)
  writer.join()
  assert snap.waits >= 1
  values, _, flags = snap.read_chunk(0)
  assert not flags[1] and values[1].tolist() == [0.0, 0.0]  # chunk 0 as it was: unwritten
  snap.close()
