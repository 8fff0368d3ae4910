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


def test_dirty_rows_come_back_as_int64_also_when_none_are_left():
  rows = _DirtyRows()
  assert rows.pop().dtype == np.int64  # nothing written yet
  rows.add(np.array([7, 2], np.int32))
  assert rows.pop().dtype == np.int64
  assert rows.pop().dtype == np.int64  # after a pop
  rows.mark(4)  # a scalar
  rows.mark([[9], [1]])  # any shape: the ids are flattened
  rows.mark(np.array([3.0]))  # floats: cast to int64 ids
  got = rows.pop()
  assert got.dtype == np.int64 and got.tolist() == [1, 3, 4, 9]


def test_the_write_buffer_stays_within_its_bound():
  rows = _DirtyRows(compact_at=4)

  def buffered():
    assert rows._pending_count == sum(p.size for p in rows._pending)  # what it holds
    return rows._pending_count

  rows.add(np.array([1, 2, 3, 4], np.int64))  # 4 buffered: not past compact_at
  assert buffered() == 4 and len(rows._pending) == 1
  rows.add(np.array([5], np.int64))  # 5 > 4: deduplicated
  assert buffered() == 0 and rows._unique.tolist() == [1, 2, 3, 4, 5]
  rows.add(np.arange(6, 16, dtype=np.int64))  # 10 <= 2 x 5 distinct rows: kept buffered
  assert buffered() == 10
  rows.add(np.array([1], np.int64))  # 11 > 10
  assert buffered() == 0 and rows._unique.size == 15
  rows.add(np.arange(100, 131, dtype=np.int64))  # 31 > 2 x 15 (but not 3 x 15)
  assert buffered() == 0 and rows.count() == 46


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
  with pytest.raises(RuntimeError, match="^begin_snapshot: a snapshot of this table is still open$"):
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
  assert snap.waits == 1
  values, _, flags = snap.read_chunk(0)
  assert not flags[1] and values[1].tolist() == [0.0, 0.0]  # chunk 0 as it was: unwritten
  snap.close()


def test_each_write_that_waits_is_counted():
  table = _table()
  snap = ChangeTracker(table).begin_snapshot([0, 1, 2], budget_bytes=1)
  assert snap.waits == 0
  _write(table, [1], 1.0)  # the one copy always allowed: the budget is spent
  for k in (1, 2):
    done = threading.Event()
    writer = threading.Thread(target=lambda k=k, done=done: (_write(table, [k * CHUNK_ROWS], 2.0),
                                                             done.set()))
    writer.start()
    assert not done.wait(0.2)
    snap.read_chunk(k)  # read live: the waiting write goes on
    assert done.wait(10)
    writer.join()
  assert snap.waits == 2
  snap.close()


def test_copies_are_accounted_in_bytes_and_close_releases_them():
  table = _table(2 * CHUNK_ROWS + 3)  # chunk 2 holds 3 rows
  row_bytes = 4 * (2 + 1) + 1  # float32 values and slots, and the row's flag
  full, last = CHUNK_ROWS * row_bytes, 3 * row_bytes
  snap = ChangeTracker(table).begin_snapshot([0, 1, 2], budget_bytes=full + last)
  assert (snap.copied_bytes, snap.peak_copied_bytes, snap.waits) == (0, 0, 0)
  _write(table, [1], 1.0)
  assert (snap.copied_bytes, snap.peak_copied_bytes) == (full, full)
  _write(table, [2 * CHUNK_ROWS], 1.0)  # exactly the budget: copied, no wait
  assert (snap.copied_bytes, snap.peak_copied_bytes, snap.waits) == (full + last, full + last, 0)
  snap.read_chunk(2)
  assert (snap.copied_bytes, snap.peak_copied_bytes, snap.copies_made) == (full, full + last, 2)
  snap.close()
  assert snap.copied_bytes == 0 and snap.closed is True
  for k in (0, 1):
    with pytest.raises(KeyError, match=f"chunk {k} is not in the snapshot"):
      snap.read_chunk(k)  # closed: nothing is readable


def test_read_chunk_reads_unwritten_chunks_live_and_refuses_others():
  table = _table()
  tracker = ChangeTracker(table)
  _write(table, [1, CHUNK_ROWS + 2], 3.0)
  snap = tracker.begin_snapshot([0, 1], budget_bytes=1 << 30)
  chex.assert_trees_all_equal(snap.read_chunk(0), table.read_chunk(0))  # chunk 0, live
  assert snap.copies_made == 0
  for k in (-1, 2, 3):  # outside the snapshot, and outside the table
    with pytest.raises(KeyError, match=f"chunk {k} is not in the snapshot"):
      snap.read_chunk(k)
  snap.close()
