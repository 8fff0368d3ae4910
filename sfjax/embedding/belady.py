"""Belady's optimal offline cache policy, the ceiling for MixCache hit rates.

The stream is a sequence of batches, each a set of unique row ids; every
(batch, id) pair is one access, exactly as `CachePlanner` counts hits and misses.
A batch's ids must all be cached together, so when a batch's misses need room
the policy evicts, among cached ids *not* in the current batch, those whose next
use is farthest in the future (never-used-again first). Belady's exchange
argument still holds with the current batch pinned, so this is optimal among all
policies that keep each batch resident (`CachePlanner` is one, with extra
in-flight constraints); `belady_test.py` checks it against an exhaustive search
on tiny streams.

Cost: next uses are precomputed with one sort; the simulation keeps a max-heap
keyed by next use with lazy deletion, O(A log A) for A accesses (about 1 s per
million accesses in CPython).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class CacheSimResult(NamedTuple):
  """Hit/miss counts of a cache simulation.

  Attributes:
    hits: accesses whose id was cached.
    accesses: total (batch, unique id) accesses.
    batch_hits: [T] int64 hits of each batch.
  """

  hits: int
  accesses: int
  batch_hits: np.ndarray

  @property
  def hit_rate(self) -> float:
    """Hits over accesses (0 for no access)."""
    return self.hits / self.accesses if self.accesses else 0.0


def _next_uses(batches: Sequence[np.ndarray]) -> list[np.ndarray]:
  """For each access, the index of the next batch that uses the same id.

  Args:
    batches: [T] arrays of distinct int64 ids.

  Returns:
    [T] int64 arrays aligned with `batches`; `len(batches)` where the id is never used again.
  """
  sizes = [int(np.asarray(b).size) for b in batches]
  if not sizes or sum(sizes) == 0:
    return [np.zeros((n,), np.int64) for n in sizes]
  ids = np.concatenate([np.asarray(b, np.int64).reshape(-1) for b in batches])
  step = np.repeat(np.arange(len(batches), dtype=np.int64), sizes)
  order = np.lexsort((step, ids))  # By id, then by batch.
  nxt_sorted = np.full(ids.shape, len(batches), np.int64)
  same = ids[order][1:] == ids[order][:-1]
  nxt_sorted[:-1][same] = step[order][1:][same]
  nxt = np.empty_like(nxt_sorted)
  nxt[order] = nxt_sorted
  return np.split(nxt, np.cumsum(sizes)[:-1])


def simulate_belady(batches: Sequence[np.ndarray], capacity: int) -> CacheSimResult:
  """Simulates Belady's policy over a stream of batches.

  Args:
    batches: [T] arrays of distinct non-negative int64 ids (per-batch unique ids).
    capacity: C, cached ids.

  Returns:
    CacheSimResult with the optimal number of hits.

  Raises:
    ValueError: capacity < 1, a batch with duplicate ids, or a batch larger than C.
  """
  if capacity < 1:
    raise ValueError(f"belady: capacity must be >= 1, got {capacity}")
  for t, b in enumerate(batches):
    b = np.asarray(b)
    if b.size > capacity:
      raise ValueError(f"belady: batch {t} has {b.size} unique ids > capacity {capacity}")
    if np.unique(b).size != b.size:
      raise ValueError(f"belady: batch {t} has duplicate ids")
  cached: dict[int, int] = {}  # id -> its next use (batch index)
  heap: list[tuple[int, int]] = []  # (-next use, id); stale entries skipped
  hits = accesses = 0
  batch_hits = np.zeros((len(batches),), np.int64)
  for t, (batch, nxt) in enumerate(zip(batches, _next_uses(batches), strict=True)):
    batch_ids = np.asarray(batch, np.int64).tolist()
    hits_before = hits
    misses = []
    for i, n in zip(batch_ids, nxt.tolist(), strict=True):
      if i in cached:
        hits += 1
        cached[i] = n
        heapq.heappush(heap, (-n, i))
      else:
        misses.append((i, n))
    accesses += len(batch_ids)
    batch_hits[t] = hits - hits_before
    pinned = set(batch_ids)
    held = []  # Valid entries of the current batch, popped while searching victims.
    for _ in range(len(cached) + len(misses) - capacity):
      while True:
        neg_n, i = heapq.heappop(heap)
        if cached.get(i) != -neg_n:
          continue  # Stale: id evicted or its next use moved.
        if i in pinned:
          held.append((neg_n, i))
          continue
        del cached[i]
        break
    for entry in held:
      heapq.heappush(heap, entry)
    for i, n in misses:
      cached[i] = n
      heapq.heappush(heap, (-n, i))
  return CacheSimResult(hits, accesses, batch_hits)
