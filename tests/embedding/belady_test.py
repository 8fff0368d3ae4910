"""Tests for sfjax.embedding.belady."""

import functools
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfjax.embedding import cache_planner
from sfjax.embedding.belady import _next_uses, simulate_belady
from sfjax.embedding.cache_planner import CacheCapacityError, CachePlanner


def _arrays(batches):
  return [np.array(b, np.int64) for b in batches]


def test_next_uses_hand_checked():
  nxt = _next_uses(_arrays([[1, 2], [2], [], [1, 3]]))
  assert [n.tolist() for n in nxt] == [[3, 1], [4], [], [4, 4]]


def test_hand_checked_stream():
  # C=2: at step 2 Belady keeps 1 (used again at step 3) and drops 2 (step 4); LRU drops 1.
  result = simulate_belady(_arrays([[1], [2], [3], [1], [2]]), 2)
  assert (result.hits, result.accesses) == (1, 5) and result.hit_rate == pytest.approx(0.2)
  assert result.batch_hits.tolist() == [0, 0, 0, 1, 0]


def test_current_batch_is_pinned():
  # Step 1 needs a slot for 3; 1 is used later than 2, but 1 is in the batch, so 2 goes.
  # Step 2 drops 3 (never used again), so step 3 hits 1.
  result = simulate_belady(_arrays([[1, 2], [1, 3], [2], [1]]), 2)
  assert (result.hits, result.accesses) == (2, 6) and result.batch_hits.tolist() == [0, 1, 0, 1]


def test_rejects_batches_larger_than_capacity():
  with pytest.raises(ValueError, match="batch 1 has 3 unique ids > capacity 2"):
    simulate_belady(_arrays([[1], [1, 2, 3]]), 2)
  with pytest.raises(ValueError, match="duplicate"):
    simulate_belady(_arrays([[1, 1]]), 2)


def _brute_force_hits(batches, capacity):
  """Most hits of any policy, by exhaustive search over eviction choices."""
  sets = [frozenset(b) for b in batches]

  @functools.cache
  def best(t, cache):
    if t == len(sets):
      return 0
    batch = sets[t]
    hits = len(batch & cache)
    need = len(cache | batch) - capacity
    options = [()] if need <= 0 else itertools.combinations(sorted(cache - batch), need)
    return hits + max(best(t + 1, (cache - frozenset(out)) | batch) for out in options)

  return best(0, frozenset())


def _planner_hits(batches, capacity, policy, lookahead):
  planner = CachePlanner(capacity, max(1, max(len(b) for b in batches)), policy=policy,
                         lookahead=lookahead)
  hits = 0
  for t, b in enumerate(batches):
    if t >= lookahead:
      planner.retire(t - lookahead)
    hits += planner.plan(t, np.array(b, np.int64)).hits
  return hits


tiny_streams = st.lists(st.lists(st.integers(0, 6), max_size=3, unique=True), min_size=1, max_size=7)


@settings(max_examples=40, deadline=None)
@given(batches=tiny_streams, extra=st.integers(0, 2))
def test_belady_is_optimal_on_tiny_streams(batches, extra):
  capacity = max(1, max(len(b) for b in batches)) + extra
  assert simulate_belady(_arrays(batches), capacity).hits == _brute_force_hits(batches, capacity)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), capacity=st.integers(4, 40), lookahead=st.integers(1, 3),
       policy=st.sampled_from(cache_planner.CACHE_POLICIES))
def test_belady_bounds_lru_and_lfu(seed, capacity, lookahead, policy):
  rng = np.random.default_rng(seed)
  num_ids = int(rng.integers(5, 80))
  batches = [np.unique(rng.zipf(1.3, size=4) % num_ids) for _ in range(60)]
  optimum = simulate_belady(batches, capacity)
  assert optimum.accesses == sum(b.size for b in batches)
  try:
    hits = _planner_hits(batches, capacity, policy, lookahead)
  except CacheCapacityError:
    return  # The in-flight window did not fit; Belady has no window.
  assert optimum.hits >= hits
