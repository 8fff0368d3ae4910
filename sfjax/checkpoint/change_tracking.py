"""What changed in a host table since its last checkpoint, and copy-on-write snapshots of it.

The `HostTable` keeps rows only; a `ChangeTracker` registers itself as its write
observer (`HostTable.add_write_observer`) and keeps, for incremental and asynchronous
checkpoints (`sfjax.checkpoint.table_format`, `sfjax.checkpoint.checkpointer`):

* `_DirtyRows`: the distinct row ids written since the last checkpoint. Checkpoints
  between two full (chunk) saves write only these rows, so a save costs the rows a
  Zipf tail actually touched, not every 65,536-row chunk that one of them fell in.
  Memory is 8 bytes per distinct dirty row plus a bounded buffer of recent writes.
* dirty chunks: a [V / CHUNK_ROWS] bool mask, what a base checkpoint rewrites.
* `TableSnapshot`: a consistent view of some chunks at one moment while training keeps
  writing. A background writer reads each chunk through it once; a write to a chunk
  it has not read yet first copies that chunk aside (copy on write). Copies are
  bounded by `budget_bytes`: past it, the write waits until the writer has read the
  chunk (or freed a copy), so memory stays bounded and the result stays exact.

Everything runs under the table's lock (`HostTable.lock`, held while observers run);
`TableSnapshot` waits on a condition of that lock. The observer's cost per write is a
few vectorised numpy operations over the write's ids (no per-id Python).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from sfjax.embedding.host_table import CHUNK_ROWS, HostTable

ChunkArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # values [n,E], slots [n,S], flags [n]


class _DirtyRows:
  """The distinct row ids written since the last `pop` (not thread-safe: the tracker locks).

  Args:
    compact_at: buffered ids (with repeats) that trigger a deduplication; it grows
      with the distinct count so deduplication stays amortised O(log n) per id.
  """

  def __init__(self, compact_at: int = 1 << 20):
    self._base_compact_at = int(compact_at)
    self._unique = np.zeros((0,), np.int64)  # sorted, distinct
    self._pending: list[np.ndarray] = []
    self._pending_count = 0

  def add(self, ids: np.ndarray) -> None:
    """Records a write of rows `ids` ([N] int64)."""
    if ids.size == 0:
      return
    self._pending.append(np.array(ids, np.int64, copy=True))
    self._pending_count += ids.size
    if self._pending_count > max(self._base_compact_at, 2 * self._unique.size):
      self._compact()

  def _compact(self) -> None:
    if self._pending:
      self._unique = np.unique(np.concatenate([self._unique, *self._pending]))
      self._pending, self._pending_count = [], 0

  def count(self) -> int:
    """Distinct dirty rows (deduplicates the buffer)."""
    self._compact()
    return int(self._unique.size)

  def pop(self) -> np.ndarray:
    """The sorted distinct dirty row ids [D] int64; the set is cleared."""
    self._compact()
    rows, self._unique = self._unique, np.zeros((0,), np.int64)
    return rows

  def mark(self, ids) -> None:
    """Marks rows dirty again (a checkpoint that popped them failed before its commit)."""
    self.add(np.asarray(ids, np.int64).reshape(-1))


class TableSnapshot:
  """Chunks of a table as they were at `begin`, readable while the table keeps changing.

  Created by `ChangeTracker.begin_snapshot`; the writer calls `read_chunk(k)` once per
  chunk of `chunks`, then `close()`. The tracker calls `preserve(chunks)` before every
  write (holding the table's lock).

  Args:
    chunks: the chunk indices the snapshot covers.
    num_chunks: chunks of the table (size of the pending mask).
    read_live: reads a chunk's current arrays (copies); called with the lock held.
    chunk_bytes: bytes of one chunk's copy.
    cond: a condition on the table's lock (writes wait on it when over budget).
    budget_bytes: most bytes of copies held at once.
  """

  def __init__(self, chunks, num_chunks: int, read_live: Callable[[int], ChunkArrays],
               chunk_bytes: Callable[[int], int], cond: threading.Condition, budget_bytes: int):
    self._pending = np.zeros((num_chunks,), np.bool_)  # [num_chunks] not read by the writer yet
    self._pending[np.asarray(chunks, np.int64)] = True
    self._copies: dict[int, ChunkArrays] = {}
    self._read_live, self._chunk_bytes, self._cond = read_live, chunk_bytes, cond
    self.budget_bytes = int(budget_bytes)
    self.copied_bytes = 0  # held now
    self.peak_copied_bytes = 0
    self.copies_made = 0
    self.waits = 0  # writes that waited for the writer (budget exhausted)
    self.closed = False

  def preserve(self, chunks: np.ndarray) -> None:
    """Before a write to `chunks` ([N] int64, repeats allowed): copy the unread ones aside.

    Called with the table lock held; may wait (releasing it) while the copy budget is
    exhausted, until the writer reads the chunk or frees a copy.
    """
    if self.closed:
      return
    touched = np.unique(chunks)
    for k in touched[self._pending[touched]].tolist():
      while self._pending[k] and k not in self._copies and not self.closed:
        size = self._chunk_bytes(k)
        if self.copied_bytes + size <= self.budget_bytes or not self._copies:
          # Always allow one copy, so a budget below one chunk cannot deadlock.
          self._copies[k] = self._read_live(k)
          self.copied_bytes += size
          self.copies_made += 1
          self.peak_copied_bytes = max(self.peak_copied_bytes, self.copied_bytes)
          break
        self.waits += 1
        self._cond.wait()

  def read_chunk(self, k: int) -> ChunkArrays:
    """Chunk `k` as it was when the snapshot began (each chunk is read at most once).

    Raises:
      KeyError: `k` is not covered, or was already read.
    """
    with self._cond:
      if k in self._copies:
        arrays = self._copies.pop(k)
        self.copied_bytes -= self._chunk_bytes(k)
      elif 0 <= k < self._pending.size and self._pending[k]:
        arrays = self._read_live(k)
      else:
        raise KeyError(f"TableSnapshot: chunk {k} is not in the snapshot or was already read")
      self._pending[k] = False
      self._cond.notify_all()
      return arrays

  def close(self) -> None:
    """Releases every copy and lets waiting writes proceed (the writer is done or failed)."""
    with self._cond:
      self.closed = True
      self._copies.clear()
      self.copied_bytes = 0
      self._pending[:] = False
      self._cond.notify_all()


class ChangeTracker:
  """The rows and chunks of `table` written since the last checkpoint, and its snapshot.

  Registers itself as the table's write observer until `detach`. Rows the table already
  holds when tracking starts count as written (the first checkpoint, a base, holds
  them); rows restored by `HostTable.load_rows` are not changes and are not tracked.

  Args:
    table: the host table to track.
  """

  def __init__(self, table: HostTable):
    self.table = table
    self._cond = threading.Condition(table.lock)
    self._chunks = np.zeros((-(-table.num_rows // CHUNK_ROWS),), np.bool_)  # [V / CHUNK_ROWS]
    self._rows = _DirtyRows()
    self._snapshot: TableSnapshot | None = None
    with self._cond:
      if table.num_materialised:
        self._before_write(table.written_ids())
      table.add_write_observer(self._before_write)
      self._attached = True

  def _before_write(self, ids: np.ndarray) -> None:
    """The observer: called with the table locked, before rows `ids` [N] change."""
    chunks = ids // CHUNK_ROWS
    if self._snapshot is not None and not self._snapshot.closed:
      self._snapshot.preserve(chunks)  # copy on write for a checkpoint being written
    self._chunks[chunks] = True
    self._rows.add(ids)

  def detach(self) -> None:
    """Stops tracking (the state so far stays readable); idempotent."""
    with self._cond:
      if self._attached:
        self.table.remove_write_observer(self._before_write)
        self._attached = False

  def pop_dirty_chunks(self) -> np.ndarray:
    """Indices [K] int64 of chunks written since the last pop (cleared; see `mark_dirty_chunks`)."""
    with self._cond:
      chunks = np.flatnonzero(self._chunks)
      self._chunks[chunks] = False
      return chunks

  def mark_dirty_chunks(self, chunks) -> None:
    """Marks chunks dirty (a failed checkpoint's, or restored chunks a base must rewrite)."""
    with self._cond:
      self._chunks[np.asarray(chunks, np.int64)] = True

  def pop_dirty_rows(self) -> np.ndarray:
    """Sorted distinct ids [D] int64 of rows written since the last pop (cleared)."""
    with self._cond:
      return self._rows.pop()

  def mark_dirty_rows(self, ids) -> None:
    """Marks rows dirty again (a checkpoint that popped them failed before it was committed)."""
    with self._cond:
      self._rows.mark(ids)

  def num_dirty_rows(self) -> int:
    """Distinct rows written since the last `pop_dirty_rows`."""
    with self._cond:
      return self._rows.count()

  def _chunk_bytes(self, chunk: int) -> int:
    lo, hi = self.table.chunk_range(chunk)
    return (hi - lo) * (4 * (self.table.width + self.table.slot_width) + 1)

  def begin_snapshot(self, chunks, budget_bytes: int) -> TableSnapshot:
    """A copy-on-write view of `chunks` as they are now (one open snapshot at a time).

    Writes keep going; a write to a chunk the snapshot's reader has not read yet copies
    the chunk aside first, holding at most `budget_bytes` of copies (then it waits for
    the reader). Close it when done (`TableSnapshot.close`).

    Raises:
      RuntimeError: another snapshot is still open.
    """
    with self._cond:
      if self._snapshot is not None and not self._snapshot.closed:
        raise RuntimeError("begin_snapshot: a snapshot of this table is still open")
      self._snapshot = TableSnapshot(chunks, self._chunks.size, self.table.read_chunk,
                                     self._chunk_bytes, self._cond, budget_bytes)
      return self._snapshot
