"""Host-side MixCache planner: which cache slot holds which row, step by step.

ScaleFreeCTR's Host-Manager (and MindSpore's embedding cache built for it) runs
ahead of the device: for each deduplicated batch it maps the batch's unique row
ids to slots `[0, C)` of a device cache, admits misses into free slots or evicts
victims, and hands the device fixed-shape int32 buffers (DESIGN.md §2):

  plan = planner.plan(step, uniq_ids)      # steps 0, 1, 2, ... in order
  device step `step`:
    out_rows = cache[plan.evict_slots]     # 1. read victims out FIRST
    cache[plan.fill_slots] = fill_rows     # 2. then write the fills
    rows = cache[plan.slots][vids]         # 3. compute with the batch's rows
  host, when step `step` is done:
    host_table.scatter(plan.evict_ids[:plan.num_evictions], out_rows[:plan.num_evictions])
    planner.retire(step)

Padded entries of `slots`, `fill_slots` and `evict_slots` hold C, an
out-of-range slot that device gathers fill and scatters drop; padded
`fill_ids`/`evict_ids` hold -1.

In-flight rule. Steps planned but not yet retired are in flight (at most
`lookahead` of them, the current one included). A slot used by any in-flight
step is never evicted: a slot is evictable iff its last use is older than every
in-flight step and the current batch does not use it. Free slots (0, 1, ... in
order) are used before any eviction. When a miss finds no free or evictable slot,
`plan` raises `CacheCapacityError` naming the capacity this window needs; the
trainer checks the safe bound `lookahead * unique capacity` at start.

Write-back rule (the ordering hazard). A row evicted at step t reaches the host
table only after step t's outputs come back. If a later step t' is planned before
retire(t) (lookahead >= 2) and misses the same id, gathering its fill from the
host table too early would read a stale row. `plan.fill_after_step` is the
largest such t (-1 if none): the Host-Manager must gather `plan.fill_ids` only
after step `fill_after_step`'s evicted rows have been scattered to the host
table (or must forward them). Callers scatter before `retire`, so
`fill_after_step < planner.oldest_unretired` means the fills are safe to read.

Upcoming rows (`plan(..., upcoming=ids)`). A caller that already holds the next batches'
unique ids passes them: a cached row among them is not chosen as a victim while any other
slot is evictable (both policies; otherwise the policy's order is unchanged). Each wait
for a write-back puts write-back + gather + transfer on the critical path (the next step
cannot start before this one's evicted rows land); with the next `lookahead - 1` batches'
ids passed, a step can only miss an id evicted at a step that has retired, so
`fill_after_step` stays -1 unless the cache was too full to keep them. The rows it keeps
are the ones about to be used, so the hit rate rises too. Plans remain exact whichever
rows are kept: only the choice of victims changes.

Policies (ties are always broken by the lowest slot index):
  lru: evict the least recently used slot (last step that used it).
  lfu: evict the slot whose id was used in the fewest steps since it was
       admitted (count saturates at 2**22); equal counts -> least recently used.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from sfjax.embedding import slot_index

CACHE_POLICIES = ("lru", "lfu")
# Tables of at most this many rows (given as `num_rows`) are indexed densely: an int32
# slot and an int32 eviction step per row (8 bytes a row, 134 MB at the limit) instead
# of the hash map and sorted eviction lists; the plans are identical.
DENSE_INDEX_MAX_ROWS = 1 << 24
_MAX_KEY = np.iinfo(np.int64).max
_FREQ_CAP = (1 << 22) - 1


class CacheCapacityError(RuntimeError):
  """The cache has too few free or evictable slots for the current batch."""


class CachePlan(NamedTuple):
  """What the device does with its cache at one step (fixed shapes).

  Attributes:
    step: the step this plan is for.
    slots: [U_cap] int32 cache slot of each unique id (C in padding entries).
    fill_slots: [F_cap] int32 slots receiving a missed row (C in padding).
    fill_ids: [F_cap] int64 row ids to gather from the host table (-1 in padding).
    evict_slots: [F_cap] int32 slots whose old row is read out before the fills (C in padding).
    evict_ids: [F_cap] int64 row ids evicted, to write back to the host table (-1 in padding).
    num_unique: number of real unique ids this step.
    num_fills: real entries of fill_slots/fill_ids (== misses).
    num_evictions: real entries of evict_slots/evict_ids.
    hits: unique ids already cached.
    misses: unique ids not cached.
    fill_after_step: -1, or the step whose write-back must land in the host table
      before `fill_ids` are gathered (see the module docstring).
  """

  step: int
  slots: np.ndarray
  fill_slots: np.ndarray
  fill_ids: np.ndarray
  evict_slots: np.ndarray
  evict_ids: np.ndarray
  num_unique: int
  num_fills: int
  num_evictions: int
  hits: int
  misses: int
  fill_after_step: int


class CachePlanner:
  """Maps each step's unique row ids to cache slots (host state, numpy).

  `plan` (Host-Manager thread) and `retire` (trainer thread) may run on
  different threads: both hold one lock, and `wait_retired` blocks until a
  step's write-back has landed. Cost of a plan: O(U) hash-map work, plus, when
  it evicts, O(U) amortised for lru and O(C) for lfu.

  Args:
    num_slots: C, device cache rows.
    unique_capacity: U_cap, the padded length of a batch's unique ids (`slots` shape).
    policy: 'lru' or 'lfu'.
    lookahead: maximum planned-but-unretired steps, the one being planned included.
    fill_capacity: F_cap, padded length of the fill/evict buffers; default U_cap
      (always enough: a step never fills more than its unique ids).
    num_rows: V, the table size, when known (every id < V): a table of at most
      `DENSE_INDEX_MAX_ROWS` rows is then indexed densely (the same plans, faster).
  """

  def __init__(self, num_slots: int, unique_capacity: int, *, policy: str = "lru",
               lookahead: int = 1, fill_capacity: int | None = None,
               num_rows: int | None = None):
    if policy not in CACHE_POLICIES:
      raise ValueError(f"CachePlanner: unknown policy {policy!r} (known: {', '.join(CACHE_POLICIES)})")
    fill_capacity = unique_capacity if fill_capacity is None else fill_capacity
    for name, value in (("num_slots", num_slots), ("unique_capacity", unique_capacity),
                        ("lookahead", lookahead), ("fill_capacity", fill_capacity)):
      if int(value) < 1:
        raise ValueError(f"CachePlanner: {name} must be >= 1, got {value}")
    if num_slots >= 2**31 - 1:
      raise ValueError(f"CachePlanner: num_slots={num_slots} does not fit int32 slots")
    self.num_slots, self.unique_capacity = int(num_slots), int(unique_capacity)
    self.policy, self.lookahead, self.fill_capacity = policy, int(lookahead), int(fill_capacity)
    c = self.num_slots
    self._slot_ids = np.full((c,), -1, np.int64)  # [C] id held by each slot, -1 = free
    self._last_used = np.full((c,), -1, np.int64)  # [C] last step that used the slot
    self._freq = np.zeros((c,), np.int64)  # [C] steps using the id since admission
    self._num_occupied = 0  # Occupied slots are exactly [0, num_occupied).
    self.num_rows = None if num_rows is None else int(num_rows)
    dense_rows = (self.num_rows if self.num_rows is not None
                  and self.num_rows <= DENSE_INDEX_MAX_ROWS else None)
    self._index: slot_index.IdIndex | slot_index.DenseIdIndex = (
        slot_index.IdIndex(c) if dense_rows is None else slot_index.DenseIdIndex(c, dense_rows))
    # A dense index also records each absent id's last eviction step (in place of `_pending`).
    self._slot_marks = np.zeros((c,), bool)  # Scratch: `_ascending`'s marks, all False between calls.
    self._lru = slot_index.LruQueue(2 * (c + self.unique_capacity)) if policy == "lru" else None
    self._hit_mask = np.zeros((c,), bool)  # Scratch: slots hit by the batch being planned.
    self._keep_mask = np.zeros((c,), bool)  # Scratch: slots of the upcoming batches' rows.
    self._next_step = 0
    self._oldest_unretired = 0
    self._pending: dict[int, np.ndarray] = {}  # step -> sorted ids evicted, not yet retired
    self._retired = threading.Condition()  # Guards all state; notified by `retire`.
    self.total_hits = self.total_misses = self.total_evictions = 0

  @property
  def next_step(self) -> int:
    """The step `plan` expects next."""
    return self._next_step

  @property
  def oldest_unretired(self) -> int:
    """Steps < this one are retired (their write-backs have landed)."""
    return self._oldest_unretired

  def occupied(self) -> tuple[np.ndarray, np.ndarray]:
    """(slots [K] int32, ids [K] int64) of every cached row, e.g. for a final write-back."""
    with self._retired:
      k = self._num_occupied
      return np.arange(k, dtype=np.int32), self._slot_ids[:k].copy()

  def plan(self, step: int, uniq_ids, upcoming=None) -> CachePlan:
    """Plans step `step`'s cache moves for its unique ids.

    Args:
      step: must equal `next_step` (0, 1, 2, ...).
      uniq_ids: [U] distinct non-negative int64 row ids, U <= unique_capacity
        (`VirtualIds.uniq[:num_unique]`).
      upcoming: optional [N] non-negative int row ids the next steps will use (any order,
        repeats allowed): their cached rows are evicted only if nothing else can be (see
        the module docstring). None: the policy alone chooses.

    Returns:
      The CachePlan. The planner state is unchanged if this raises.

    Raises:
      ValueError: wrong step order, too many in-flight steps, or bad ids.
      CacheCapacityError: no free or evictable slot for a miss.
    """
    with self._retired:
      return self._plan_locked(step, uniq_ids, upcoming)

  def _plan_locked(self, step: int, uniq_ids, upcoming=None) -> CachePlan:
    """`plan`'s body; the caller holds the lock."""
    if step != self._next_step:
      raise ValueError(f"plan: expected step {self._next_step}, got {step}")
    if step - self._oldest_unretired + 1 > self.lookahead:
      raise ValueError(f"plan: step {step} would put {step - self._oldest_unretired + 1} steps in "
                       f"flight (lookahead={self.lookahead}); retire({self._oldest_unretired}) first")
    ids = self._check_ids(uniq_ids)
    if isinstance(self._index, slot_index.DenseIdIndex):
      slot_of, evicted_at = self._index.probe(ids)  # [U] int64, -1 = miss; [U] int64
    else:
      slot_of, evicted_at = self._index.lookup(ids), None
    hit = slot_of >= 0
    miss = ~hit
    hit_slots, miss_ids = slot_of[hit], ids[miss]
    n_miss = int(miss_ids.size)
    if n_miss > self.fill_capacity:
      raise ValueError(f"plan: step {step} has {n_miss} misses > fill_capacity={self.fill_capacity}")
    occ = self._num_occupied
    n_new = min(n_miss, self.num_slots - occ)
    upcoming = None if upcoming is None else self._check_upcoming(upcoming)
    keep = None if upcoming is None or n_miss == n_new else self._cached_slots(upcoming)
    victims, lru_head = self._choose_victims(n_miss - n_new, hit_slots, step, n_miss, keep)
    fill_after = self._fill_after_step(miss_ids, None if evicted_at is None else evicted_at[miss])

    # Commit (nothing above mutated state).
    evict_ids = self._slot_ids[victims]
    if victims.size and isinstance(self._index, slot_index.DenseIdIndex):
      self._index.remove_slots(victims, step)
    elif victims.size:
      self._index.remove_slots(victims)
      self._pending[step] = np.sort(evict_ids)
    fill_slots = np.concatenate([np.arange(occ, occ + n_new), victims]).astype(np.int32)
    self._slot_ids[fill_slots] = miss_ids
    self._last_used[fill_slots] = step
    self._last_used[hit_slots] = step
    if self._lru is None:  # lfu: use counts
      self._freq[fill_slots] = 1
      self._freq[hit_slots] = np.minimum(self._freq[hit_slots] + 1, _FREQ_CAP)
    self._index.insert(miss_ids, fill_slots)
    if self._lru is not None:
      if lru_head is not None:
        self._lru.advance(lru_head)
      self._lru.push(self._ascending(hit_slots, fill_slots), step, self._last_used)
    self._num_occupied = occ + n_new
    self._next_step = step + 1
    self.total_hits += int(hit_slots.size)
    self.total_misses += n_miss
    self.total_evictions += int(victims.size)

    c = self.num_slots
    slot_of[miss] = fill_slots  # every unique id's slot, in the ids' order
    slots = _pad(slot_of, self.unique_capacity, c, np.int32)
    return CachePlan(
        step=step, slots=slots,
        fill_slots=_pad(fill_slots, self.fill_capacity, c, np.int32),
        fill_ids=_pad(miss_ids, self.fill_capacity, -1, np.int64),
        evict_slots=_pad(victims, self.fill_capacity, c, np.int32),
        evict_ids=_pad(evict_ids, self.fill_capacity, -1, np.int64),
        num_unique=int(ids.size), num_fills=n_miss, num_evictions=int(victims.size),
        hits=int(hit_slots.size), misses=n_miss, fill_after_step=fill_after)

  def retire(self, step: int) -> None:
    """Marks step `step` done on the device AND its evicted rows written to the host table.

    Steps retire in order; afterwards their slots may be evicted again.
    """
    with self._retired:
      if step != self._oldest_unretired or step >= self._next_step:
        raise ValueError(f"retire: expected the oldest in-flight step {self._oldest_unretired} "
                         f"(planned up to {self._next_step - 1}), got {step}")
      self._pending.pop(step, None)
      self._oldest_unretired = step + 1
      self._retired.notify_all()

  def wait_retired(self, step: int, timeout: float | None = None) -> bool:
    """Blocks until `step` (e.g. a plan's `fill_after_step`) has retired; False on timeout."""
    with self._retired:
      return self._retired.wait_for(lambda: self._oldest_unretired > step, timeout)

  def _check_ids(self, uniq_ids) -> np.ndarray:
    ids = np.asarray(uniq_ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
      raise ValueError(f"plan: uniq_ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if ids.size > self.unique_capacity:
      raise ValueError(f"plan: {ids.size} unique ids > unique_capacity={self.unique_capacity}")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and ids.min() < 0:
      raise ValueError(f"plan: row id {int(ids[ids < 0][0])} is negative")
    if ids.size and self.num_rows is not None and ids.max() >= self.num_rows:
      raise ValueError(f"plan: row id {int(ids[ids >= self.num_rows][0])} is outside the "
                       f"table's {self.num_rows} rows")
    if ids.size > 1 and not (ids[1:] > ids[:-1]).all():  # Fast path: np.unique output is sorted.
      ordered = np.sort(ids)
      dup = ordered[1:] == ordered[:-1]
      if dup.any():
        raise ValueError(f"plan: row id {int(ordered[1:][dup][0])} appears more than once")
    return ids

  def _check_upcoming(self, ids) -> np.ndarray:
    """`plan`'s upcoming ids as [N] int64, checked: 1-D integers inside the table."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
      raise ValueError(f"plan: upcoming ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    ids = ids.astype(np.int64, copy=False)
    limit = _MAX_KEY if self.num_rows is None else self.num_rows
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
      raise ValueError(f"plan: upcoming row id {int(ids[(ids < 0) | (ids >= limit)][0])} is "
                       f"outside the table's rows [0, {limit})")
    return ids

  def _cached_slots(self, ids: np.ndarray) -> np.ndarray:
    """[K] int64 slots holding any of the int64 `ids` (absent ids skipped)."""
    slots = self._index.lookup(ids)
    return slots[slots >= 0]

  def _choose_victims(self, k: int, hit_slots: np.ndarray, step: int, n_miss: int,
                      keep: np.ndarray | None = None):
    """k evictable slots in policy order (ties: lowest slot), and the LRU queue's new head (or None).

    lru walks the queue (O(U) amortised); lfu selects among all occupied slots
    (O(C): key = (uses, last use), in-flight slots and this batch's hits excluded).
    `keep`: slots passed over while others are evictable (an upcoming batch's rows); if
    fewer than k others are, the choice is made again without it.
    """
    if k == 0:
      return np.zeros((0,), np.int64), None
    if keep is not None and keep.size:
      self._keep_mask[keep] = True
      try:
        victims, head = self._search_victims(k, hit_slots, self._keep_mask)
      finally:
        self._keep_mask[keep] = False
      if victims is not None:
        return victims, head
    victims, head = self._search_victims(k, hit_slots, None)
    if victims is not None:
      return victims, head
    occ, oldest = self._num_occupied, self._oldest_unretired
    last_used = self._last_used[:occ]
    evictable = int(np.count_nonzero(last_used < oldest)) - int(np.count_nonzero(last_used[hit_slots] < oldest))
    needed = occ - evictable + n_miss
    raise CacheCapacityError(
        f"cache too small at step {step}: {n_miss} misses need slots but only "
        f"{self.num_slots - occ + evictable} of {self.num_slots} slots are free or evictable; "
        f"in-flight steps {oldest}..{step} use {needed} distinct ids, so the cache capacity "
        f"must be >= {needed} (a safe bound: {self.lookahead} x the unique capacity "
        f"{self.unique_capacity})")

  def _search_victims(self, k: int, hit_slots: np.ndarray, keep_mask: np.ndarray | None):
    """`_choose_victims`' search, the slots in `keep_mask` also passed over: (victims, the
    LRU queue's new head or None), or (None, None) when fewer than k slots qualify."""
    occ, oldest = self._num_occupied, self._oldest_unretired
    last_used = self._last_used[:occ]
    if self._lru is not None:
      self._hit_mask[hit_slots] = True
      try:
        victims, head = self._lru.find(k, self._last_used, oldest, self._hit_mask, keep_mask)
      finally:
        self._hit_mask[hit_slots] = False
      return (victims, head) if victims is not None else (None, None)
    key = (self._freq[:occ] << 41) | last_used  # last_used < 2**41 steps.
    np.putmask(key, last_used >= oldest, _MAX_KEY)  # Used by an in-flight step.
    key[hit_slots] = _MAX_KEY  # Used by the current batch.
    if keep_mask is not None:
      np.putmask(key, keep_mask[:occ], _MAX_KEY)
    kth = np.partition(key, k - 1)[k - 1] if k <= occ else _MAX_KEY
    if kth == _MAX_KEY:
      return None, None
    victims = np.flatnonzero(key <= kth)  # Ascending; drop the surplus ties at kth.
    tie = np.flatnonzero(key[victims] == kth)
    return np.delete(victims, tie[tie.size - (victims.size - k):]), None

  def _ascending(self, *slots: np.ndarray) -> np.ndarray:
    """The distinct slots of `slots` in ascending order (int64): marks over C, no sort."""
    marks = self._slot_marks
    for s in slots:
      marks[s] = True
    out = np.flatnonzero(marks).astype(np.int64, copy=False)
    marks[out] = False
    return out

  def _fill_after_step(self, miss_ids: np.ndarray, evicted_at: np.ndarray | None) -> int:
    """The latest unretired step that evicted one of `miss_ids`, or -1.

    `evicted_at`: [M] the step that last evicted each miss (-1: none), from a dense
    index; None: searched in the pending evictions.
    """
    if evicted_at is not None:  # an id's latest eviction is its latest unretired one
      if not miss_ids.size:
        return -1
      after = int(evicted_at.max())
      return after if after >= self._oldest_unretired else -1
    after = -1
    for evict_step, evicted in self._pending.items():
      pos = np.minimum(np.searchsorted(evicted, miss_ids), evicted.size - 1)
      if (evicted[pos] == miss_ids).any():
        after = max(after, evict_step)
    return after


def _pad(values: np.ndarray, length: int, fill, dtype) -> np.ndarray:
  """[length] copy of `values` padded with `fill`."""
  out = np.full((length,), fill, dtype)
  out[:values.size] = values
  return out
