"""Host-side index structures of the cache planner (numpy, vectorised).

`IdIndex` maps row ids to cache slots (an open-addressing hash map, far faster than a
Python dict for batches of ~50k ids); `DenseIdIndex` does the same with one int32 entry
per table row, for tables small enough to afford it (plain gathers and scatters, ~10x
faster again); `LruQueue` keeps occupied slots in (last use, slot) order so LRU
victims are found in O(U) amortised time.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_EMPTY, _TOMBSTONE = -1, -2


class IdIndex:
  """Open-addressing hash map int64 id -> int32 slot, vectorised with numpy.

  Linear probing over a power-of-two table of >= 4 * C positions, kept at most
  half full (live entries + tombstones; a tombstone followed by an empty
  position is cleared at once, so few survive); a full table is rebuilt. Each
  slot remembers its position, so removing evicted slots needs no probing.
  Python dict lookups of 50k ids took ~25 ms on this machine; this takes ~2 ms.
  """

  def __init__(self, num_slots: int):
    size = 16
    while size < 4 * num_slots:
      size *= 2
    self._keys = np.full((size,), _EMPTY, np.int64)  # [H] id, or _EMPTY / _TOMBSTONE
    self._vals = np.zeros((size,), np.int32)  # [H] slot of the id
    self._slot_pos = np.zeros((num_slots,), np.int64)  # [C] position of each slot's id
    self._shift = np.uint64(64 - (size.bit_length() - 1))
    self._mask = size - 1
    self._used = 0  # Live entries + tombstones.

  def _home(self, ids: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # Fibonacci hashing: top bits of id * 2**64 / phi.
      return ((ids.view(np.uint64) * _GOLDEN) >> self._shift).view(np.int64)

  def lookup(self, ids: np.ndarray) -> np.ndarray:
    """[N] int64 slot of each id, -1 where absent."""
    out = np.full(ids.shape, -1, np.int64)
    idx, pos, want = np.arange(ids.size), self._home(ids), ids
    while idx.size:
      key = self._keys[pos]
      found = key == want
      out[idx[found]] = self._vals[pos[found]]
      more = ~found & (key != _EMPTY)
      idx, pos, want = idx[more], (pos[more] + 1) & self._mask, want[more]
    return out

  def remove_slots(self, slots: np.ndarray) -> None:
    """Removes the ids held by `slots` (which must be occupied)."""
    pos = self._slot_pos[slots]
    self._keys[pos] = _TOMBSTONE
    # A tombstone whose successor is empty ends no probe chain: clear it, then
    # look at its predecessor (positions stay distinct: no dedup needed).
    while pos.size:
      pos = pos[(self._keys[pos] == _TOMBSTONE) & (self._keys[(pos + 1) & self._mask] == _EMPTY)]
      self._keys[pos] = _EMPTY
      self._used -= pos.size
      pos = (pos - 1) & self._mask

  def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
    """Inserts distinct ids that are absent, held by `slots`."""
    if 2 * (self._used + ids.size) > self._keys.size:
      live = self._keys >= 0
      ids = np.concatenate([self._keys[live], ids])
      slots = np.concatenate([self._vals[live], slots])
      self._keys.fill(_EMPTY)
      self._used = 0
    idx, pos = np.arange(ids.size), self._home(ids)
    while idx.size:
      key = self._keys[pos]
      free = np.flatnonzero(key < 0)
      fidx, fpos = idx[free], pos[free]
      fids = ids[fidx]
      # Ids are distinct, so exactly one candidate per contested position reads
      # its own id back: the winner. Losers and blocked ids probe onwards.
      self._keys[fpos] = fids
      won = self._keys[fpos] == fids
      wpos, wslots = fpos[won], slots[fidx[won]]
      self._vals[wpos] = wslots
      self._slot_pos[wslots] = wpos
      self._used += int(np.count_nonzero(key[free[won]] == _EMPTY))
      rest = np.ones(idx.size, bool)
      rest[free[won]] = False
      idx, pos = idx[rest], (pos[rest] + 1) & self._mask


class DenseIdIndex:
  """`IdIndex`'s interface over a dense `[V] int32` map (id -> slot), which also remembers
  the step that last evicted each absent id (`probe`, `remove_slots(..., step)`).

  4 bytes per table row: meant for tables of at most a few tens of millions of rows
  (`cache_planner.DENSE_INDEX_MAX_ROWS`), where it replaces every probe by one gather. One
  entry holds both facts (a slot >= 0; -1: never evicted; -2 - t: evicted at step t), so a
  plan reads each id once and writes each victim once (a second `[V]` array of eviction
  steps cost two more random accesses per miss). Ids must lie in [0, V).
  """

  def __init__(self, num_slots: int, num_rows: int):
    self._slot_of = np.full((int(num_rows),), -1, np.int32)  # [V] slot, or -1 / -2 - step
    self._id_of = np.zeros((int(num_slots),), np.int64)  # [C] id held by each slot

  def lookup(self, ids: np.ndarray) -> np.ndarray:
    """[N] int64 slot of each id, -1 where absent."""
    return np.maximum(self._slot_of[ids], -1).astype(np.int64)

  def probe(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([N] int64 slot of each id, -1 where absent; [N] int64 the step that last evicted
    each absent id, -1 where none did or the id is held)."""
    entry = self._slot_of[ids].astype(np.int64)
    return np.maximum(entry, -1), np.maximum(-2 - entry, -1)

  def remove_slots(self, slots: np.ndarray, step: int = -1) -> None:
    """Removes the ids held by `slots` (which must be occupied), evicted at `step` (-1:
    not recorded)."""
    self._slot_of[self._id_of[slots]] = -2 - step

  def insert(self, ids: np.ndarray, slots: np.ndarray) -> None:
    """Inserts distinct ids that are absent, held by `slots`."""
    self._slot_of[ids] = slots
    self._id_of[slots] = ids


class LruQueue:
  """Occupied slots in (last use, slot) order, for an O(U) LRU victim search.

  Each committed step appends the slots it touched (ascending), stamped with the
  step, so stamps never decrease along the queue. An entry is live iff its stamp
  equals the slot's current last use; re-used or refilled slots leave dead
  entries that are skipped, dropped as the head passes them, or compacted away.
  """

  def __init__(self, size: int):
    self._slots = np.zeros((size,), np.int64)
    self._stamps = np.zeros((size,), np.int64)
    self._head = self._tail = 0

  def find(self, k: int, last_used: np.ndarray, oldest: int, hit_mask: np.ndarray,
           keep_mask: np.ndarray | None = None):
    """The first k live entries with stamp < oldest whose slot is in neither mask.

    `hit_mask` marks the current batch's slots (re-pushed by the step, so entries the new
    head passes may be dropped); `keep_mask` marks slots to pass over but keep queued (an
    upcoming batch's rows): the new head stops at the first such live entry it passed.

    Returns:
      ([k] int64 slots, new head) or (None, count found) if there are fewer.
    """
    found, pos, kept_at = [], self._head, None
    while k and pos < self._tail:
      end = min(self._tail, pos + 2 * k + 1024)
      stamps = self._stamps[pos:end]
      cut = int(np.searchsorted(stamps, oldest))  # Entries from `cut` on are in flight.
      slots = self._slots[pos:pos + cut]
      ok = (last_used[slots] == stamps[:cut]) & ~hit_mask[slots]
      kept = None
      if keep_mask is not None:
        kept = ok & keep_mask[slots]
        ok &= ~kept
      take = np.flatnonzero(ok)[:k]
      found.append(slots[take])
      k -= take.size
      if kept is not None and kept_at is None:  # (a kept entry past the new head stays anyway)
        passed = np.flatnonzero(kept)
        kept_at = pos + int(passed[0]) if passed.size else None
      if not k:
        head = pos + int(take[-1]) + 1
        return np.concatenate(found), head if kept_at is None else min(head, kept_at)
      if cut < end - pos:
        break
      pos = end
    return None, sum(f.size for f in found)

  def advance(self, head: int) -> None:
    """Drops entries before `head` (dead once the step that found them commits)."""
    self._head = head

  def push(self, slots: np.ndarray, step: int, last_used: np.ndarray) -> None:
    """Appends ascending `slots` touched at `step` (their last use is now `step`)."""
    n = slots.size
    if self._tail + n > self._slots.size:
      live_slots = self._slots[self._head:self._tail]
      live_stamps = self._stamps[self._head:self._tail]
      live = last_used[live_slots] == live_stamps
      m = int(np.count_nonzero(live))  # <= C, and n <= U: room, as size is 2 * (C + U).
      self._slots[:m], self._stamps[:m] = live_slots[live], live_stamps[live]
      self._head, self._tail = 0, m
    self._slots[self._tail:self._tail + n] = slots
    self._stamps[self._tail:self._tail + n] = step
    self._tail += n
