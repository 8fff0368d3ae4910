"""Tests for sfjax.embedding.cache_planner (property-based with hypothesis)."""

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfjax.embedding import cache_planner, slot_index
from sfjax.embedding.cache_planner import CacheCapacityError, CachePlanner

U_CAP = 6


def test_hand_checked_lru_and_write_back_hazard():
  p = CachePlanner(2, 2, policy="lru", lookahead=2)
  p0 = p.plan(0, np.array([10, 11]))
  assert p0.slots.tolist() == [0, 1] and p0.misses == 2 and p0.num_evictions == 0
  assert p0.fill_ids.tolist() == [10, 11] and p0.fill_after_step == -1
  p.retire(0)
  p1 = p.plan(1, np.array([12]))  # Both slots last used at step 0: tie -> lowest slot.
  assert p1.slots.tolist() == [0, 2] and p1.evict_slots.tolist() == [0, 2]
  assert p1.evict_ids.tolist() == [10, -1] and p1.fill_slots.tolist() == [0, 2]
  # Step 1 is in flight: id 10's row is still on its way back to the host table.
  p2 = p.plan(2, np.array([10]))
  assert p2.fill_after_step == 1
  assert p2.slots.tolist() == [1, 2] and p2.evict_ids.tolist() == [11, -1]
  with pytest.raises(ValueError, match="retire\\(1\\) first"):
    p.plan(3, np.array([10]))
  p.retire(1)
  p.retire(2)
  p3 = p.plan(3, np.array([11]))  # Evicted at step 2, already retired: safe to read.
  assert p3.fill_after_step == -1 and p3.evict_ids.tolist() == [12, -1]


def test_wait_retired_blocks_until_the_write_back_step_retires():
  p = CachePlanner(4, 2, lookahead=2)
  p.plan(0, np.array([1, 2]))
  p.plan(1, np.array([3]))
  assert not p.wait_retired(0, timeout=0.01)
  waiter = threading.Thread(target=lambda: done.append(p.wait_retired(1, timeout=10)))
  done = []
  waiter.start()
  p.retire(0)
  p.retire(1)
  waiter.join()
  assert done == [True] and p.wait_retired(1, timeout=0)


def test_lfu_prefers_rarely_used_ids_then_lru():
  p = CachePlanner(3, 3, policy="lfu")
  for step, ids in enumerate([[1, 2, 3], [1, 2], [1, 3], [4]]):
    plan = p.plan(step, np.array(ids))
    p.retire(step)
  # Counts: 1 -> 3, 2 -> 2, 3 -> 2; 2 and 3 tie on count, 2 was used less recently.
  assert plan.evict_ids[:1].tolist() == [2]
  plan = p.plan(4, np.array([5]))
  assert plan.evict_ids[:1].tolist() == [4]  # Admitted with count 1.


def test_capacity_error_names_needed_capacity_and_keeps_state():
  p = CachePlanner(3, 3, lookahead=2)
  p.plan(0, np.array([1, 2]))
  with pytest.raises(CacheCapacityError, match="capacity must be >= 4"):
    p.plan(1, np.array([3, 4]))
  assert p.next_step == 1 and p.total_misses == 2
  p.retire(0)
  assert p.plan(1, np.array([3, 4])).num_evictions == 1


def test_capacity_error_counts_the_evictable_slots():
  p = CachePlanner(3, 3, lookahead=2)
  p.plan(0, np.array([1]))
  p.retire(0)
  p.plan(1, np.array([2, 3]))  # in flight; id 1 (step 0) is the one evictable row
  with pytest.raises(CacheCapacityError, match="only 1 of 3 slots are free or evictable"):
    p.plan(2, np.array([4, 5]))


def test_lfu_picks_the_k_least_used_among_many_slots():
  """64 slots with distinct use counts: the k least used go, in any k (numpy partitions
  arrays this large by selection, not by sorting them)."""
  for k in (1, 5, 17):
    p = CachePlanner(64, 64, policy="lfu", lookahead=1)
    rng = np.random.default_rng(k)
    order = rng.permutation(64)  # id order[j] is used in j + 1 steps
    for step in range(64):
      p.plan(step, np.sort(order[step:]) if step else np.arange(64))
      p.retire(step)
    plan = p.plan(64, np.arange(100, 100 + k))
    assert sorted(plan.evict_ids[:k].tolist()) == sorted(order[:k].tolist()), k


def test_counters_add_up_over_steps():
  p = CachePlanner(2, 2)
  plans = []
  for step, ids in enumerate([[1, 2], [2, 3], [1, 3], [4]]):
    plans.append(p.plan(step, np.array(ids)))
    p.retire(step)
  assert p.total_hits == sum(q.hits for q in plans) == 2
  assert p.total_misses == sum(q.misses for q in plans) == 5
  assert p.total_evictions == sum(q.num_evictions for q in plans) == 3


def test_errors_name_the_step_and_the_counts():
  p = CachePlanner(3, 3, lookahead=2)
  p.plan(0, np.array([1, 2]))
  with pytest.raises(CacheCapacityError, match="cache too small at step 1: 2 misses"):
    p.plan(1, np.array([3, 4]))
  p.plan(1, np.array([1]))
  with pytest.raises(ValueError, match=r"plan: step 2 would put 3 steps in flight \(lookahead=2\)"):
    p.plan(2, np.array([5]))
  q = CachePlanner(4, 3, fill_capacity=1)
  with pytest.raises(ValueError, match=r"plan: step 0 has 2 misses > fill_capacity=1"):
    q.plan(0, np.array([1, 2]))


def test_bad_input_is_rejected():
  p = CachePlanner(4, 3)
  with pytest.raises(ValueError, match="expected step 0"):
    p.plan(1, np.array([1]))
  with pytest.raises(ValueError, match="appears more than once"):
    p.plan(0, np.array([3, 1, 3]))
  with pytest.raises(ValueError, match="negative"):
    p.plan(0, np.array([-2]))
  with pytest.raises(ValueError, match="unique_capacity=3"):
    p.plan(0, np.arange(4))
  with pytest.raises(ValueError, match="retire"):
    p.retire(0)
  with pytest.raises(ValueError, match="unknown policy"):
    CachePlanner(4, 3, policy="fifo")


def _reference_victims(policy, meta, in_flight_slots, need, kept_slots=frozenset()):
  """Evictable slots ordered by policy key, then slot (the documented rule); the slots of
  upcoming rows only if the others are too few."""
  others = [s for s in meta if s not in in_flight_slots and s not in kept_slots]
  if kept_slots and len(others) >= need:
    return _reference_victims(policy, {s: meta[s] for s in others}, set(), need)
  cands = [s for s in meta if s not in in_flight_slots]
  if policy == "lru":
    cands.sort(key=lambda s: (meta[s]["last"], s))
  else:
    cands.sort(key=lambda s: (meta[s]["freq"], meta[s]["last"], s))
  return sorted(cands[:need])


batches_st = st.lists(
    st.lists(st.integers(0, 25), max_size=U_CAP, unique=True).map(sorted), min_size=1, max_size=25)


def _simulate(batches, capacity, lookahead, policy, retire_draws, obey_fill_after_step=True,
              num_rows=None, keep=0):
  """Simulates host table + device cache following the plans, checking every plan.

  Each use of a row adds 1 on the device, so a row's final host value must equal
  the number of batches that used it: a lost write-back or a stale fill breaks it.
  Fills are gathered from the host at plan time (as a look-ahead Host-Manager
  does) unless `fill_after_step` says the host row is stale; then the gather
  waits until the device runs the step. `keep` > 0 passes the next `keep` batches' ids
  as `upcoming`.

  Returns:
    (host, truth, counters) or None when the planner (correctly) ran out of capacity.
  """
  c = capacity
  planner = CachePlanner(c, U_CAP, policy=policy, lookahead=lookahead, num_rows=num_rows)
  host = {}  # id -> value (absent = initial value 0)
  device = {}  # slot -> [id, value]
  model = {}  # slot -> id, as the plans say
  meta = {}  # slot -> {"last": step, "freq": uses since admission}
  in_flight = {}  # step -> (plan, slots it uses, ids it uses, gathered fill values or None)
  pending_evictions = {}  # unretired step -> ids it evicted
  truth = {}  # id -> number of batches that used it
  plan_ids_of = {}  # step -> its unique ids
  counters = {"evictions": 0, "flagged": 0, "kept_evicted": 0}

  def execute_and_retire(step):
    """The device runs `step`, then the host writes back its evicted rows and retires it."""
    plan, _, _, fills = in_flight.pop(step)
    written_back = []
    for s, i in zip(plan.evict_slots[:plan.num_evictions], plan.evict_ids[:plan.num_evictions],
                    strict=True):
      held_id, value = device.pop(int(s))  # Read out BEFORE the fills land.
      assert held_id == i
      written_back.append((int(i), value))
    if fills is None:  # Deferred gather: every earlier step has retired by now.
      assert plan.fill_after_step < step
      fills = [host.get(int(i), 0) for i in plan.fill_ids[:plan.num_fills]]
    for s, i, v in zip(plan.fill_slots[:plan.num_fills], plan.fill_ids[:plan.num_fills], fills,
                       strict=True):
      device[int(s)] = [int(i), v]
    for s, i in zip(plan.slots[:plan.num_unique], plan_ids_of[step], strict=True):
      assert device[int(s)][0] == i
      device[int(s)][1] += 1
    host.update(written_back)
    pending_evictions.pop(step, None)
    planner.retire(step)

  draws = iter(retire_draws)
  for t, ids in enumerate(batches):
    ids = np.array(ids, np.int64)
    plan_ids_of[t] = ids.tolist()
    for _ in range(next(draws, 0)):
      if in_flight:
        execute_and_retire(min(in_flight))
    while len(in_flight) >= lookahead:
      execute_and_retire(min(in_flight))
    window = set(ids.tolist()).union(*[used_ids for _, _, used_ids, _ in in_flight.values()])
    upcoming = sorted(set().union(*batches[t + 1:t + 1 + keep]))
    try:
      plan = planner.plan(t, ids, upcoming=np.array(upcoming, np.int64) if keep else None)
    except CacheCapacityError as err:
      assert len(window) > c, err  # Raised only when the in-flight window cannot fit.
      assert f">= {len(window)}" in str(err)
      return None
    assert len(window) <= c

    n = len(ids)
    cached_before = set(model.values())
    assert plan.slots.shape == (U_CAP,) and plan.slots.dtype == np.int32
    assert plan.fill_ids.dtype == np.int64 and plan.evict_slots.dtype == np.int32
    assert plan.num_unique == n and plan.hits + plan.misses == n and plan.num_fills == plan.misses
    assert plan.hits == len(cached_before & set(ids.tolist()))
    assert (plan.slots[n:] == c).all() and (plan.fill_slots[plan.num_fills:] == c).all()
    assert (plan.evict_slots[plan.num_evictions:] == c).all() and (plan.fill_ids[plan.num_fills:] == -1).all()
    assert (plan.evict_ids[plan.num_evictions:] == -1).all()
    free_before = c - len(model)
    assert plan.num_evictions == max(0, plan.misses - free_before)

    # Evictions: never a slot of an in-flight step or of this batch; policy order.
    busy = set().union(*[used for _, used, _, _ in in_flight.values()])
    busy |= {s for s, i in model.items() if i in set(ids.tolist())}
    evicted = plan.evict_slots[:plan.num_evictions].tolist()
    assert not busy & set(evicted)
    kept = {s for s, i in model.items() if i in set(upcoming)}
    assert sorted(evicted) == _reference_victims(policy, meta, busy, plan.num_evictions, kept)
    counters["kept_evicted"] += len(kept & set(evicted))
    for s, i in zip(evicted, plan.evict_ids[:plan.num_evictions], strict=True):
      assert model.pop(s) == i
      meta.pop(s)

    # Write-back hazard: flagged exactly when a fill id awaits an unretired write-back.
    waits = [s for s, evicted_ids in pending_evictions.items()
             if set(evicted_ids) & set(plan.fill_ids[:plan.num_fills].tolist())]
    assert plan.fill_after_step == max(waits, default=-1)
    if plan.num_evictions:
      pending_evictions[t] = plan.evict_ids[:plan.num_evictions].tolist()

    for s, i in zip(plan.fill_slots[:plan.num_fills], plan.fill_ids[:plan.num_fills], strict=True):
      assert int(s) not in model
      model[int(s)] = int(i)
      meta[int(s)] = {"last": t, "freq": 0}
    assert len(set(model.values())) == len(model)  # No id in two slots.
    for s, i in zip(plan.slots[:n], ids, strict=True):
      assert model[int(s)] == i
      meta[int(s)]["last"] = t
      meta[int(s)]["freq"] += 1
      truth[int(i)] = truth.get(int(i), 0) + 1

    safe = plan.fill_after_step < planner.oldest_unretired or not obey_fill_after_step
    counters["evictions"] += plan.num_evictions
    counters["flagged"] += plan.fill_after_step >= 0
    fills = [host.get(int(i), 0) for i in plan.fill_ids[:plan.num_fills]] if safe else None
    in_flight[t] = (plan, set(plan.slots[:n].tolist()), set(ids.tolist()), fills)

  while in_flight:
    execute_and_retire(min(in_flight))
  slots, ids = planner.occupied()
  assert sorted(zip(slots.tolist(), ids.tolist(), strict=True)) == sorted(model.items())
  for s, i in zip(slots, ids, strict=True):  # Final write-back of the whole cache.
    host[int(i)] = device[int(s)][1]
  return host, truth, counters


@st.composite
def random_streams(draw):
  """Numpy-random streams sized to evict often: a safe capacity (>= the window
  bound) with more ids than slots, or any capacity (capacity errors expected)."""
  rng = np.random.default_rng(draw(st.integers(0, 2**31)))
  lookahead = draw(st.integers(1, 4))
  if draw(st.booleans()):
    capacity = U_CAP * lookahead + draw(st.integers(0, 3))
    num_ids = capacity + draw(st.integers(1, 30))
  else:
    num_ids = draw(st.integers(2, 40))
    capacity = draw(st.integers(1, num_ids - 1))
  steps = draw(st.integers(1, 40))
  batches = [sorted(set(rng.choice(num_ids, size=rng.integers(1, U_CAP + 1)).tolist()))
             for _ in range(steps)]
  return batches, capacity, lookahead, rng.integers(0, 2, steps).tolist()


def _check_simulation(batches, capacity, lookahead, policy, retire_draws, num_rows=None, keep=0):
  result = _simulate(batches, capacity, lookahead, policy, retire_draws, num_rows=num_rows,
                     keep=keep)
  if result is not None:
    host, truth, counters = result
    assert host == truth
    if lookahead == 1:
      assert counters["flagged"] == 0  # Synchronous pipeline: no hazard possible.
    if keep >= lookahead - 1 and not counters["kept_evicted"]:
      assert counters["flagged"] == 0  # Only a row evicted although upcoming can be waited for.
    return counters
  return None


@settings(max_examples=100, deadline=None)
@given(case=random_streams(), policy=st.sampled_from(cache_planner.CACHE_POLICIES))
def test_plans_keep_cache_consistent_and_never_lose_rows(case, policy):
  batches, capacity, lookahead, retire_draws = case
  _check_simulation(batches, capacity, lookahead, policy, retire_draws)


@settings(max_examples=100, deadline=None)
@given(case=random_streams(), policy=st.sampled_from(cache_planner.CACHE_POLICIES),
       keep=st.integers(1, 3), dense=st.booleans())
def test_upcoming_rows_are_evicted_last_and_plans_stay_exact(case, policy, keep, dense):
  batches, capacity, lookahead, retire_draws = case
  num_rows = max(max(b) for b in batches) + 1 if dense else None
  _check_simulation(batches, capacity, lookahead, policy, retire_draws, num_rows, keep)


@pytest.mark.parametrize("policy", cache_planner.CACHE_POLICIES)
def test_keeping_the_next_batches_rows_removes_the_write_back_waits(policy):
  rng = np.random.default_rng(1)
  # 12 slots: the two in-flight batches and the next one fit (3 x 4 ids) among 20 ids.
  batches = [sorted(rng.choice(20, size=4, replace=False).tolist()) for _ in range(60)]
  _, _, plain = _simulate(batches, 12, 2, policy, [0] * 60)
  host, truth, kept = _simulate(batches, 12, 2, policy, [0] * 60, keep=1)
  assert host == truth and plain["flagged"] > 0
  assert kept["flagged"] == 0 and kept["kept_evicted"] == 0 and kept["evictions"] > 0
  assert kept["evictions"] < plain["evictions"]  # the kept rows are hits, not refills


def test_upcoming_rows_are_evicted_when_nothing_else_can_be():
  for policy in cache_planner.CACHE_POLICIES:
    p = CachePlanner(3, 3, policy=policy, lookahead=1)
    p.plan(0, np.array([1, 2, 3]))
    p.retire(0)
    plan = p.plan(1, np.array([4]), upcoming=np.array([1, 3, 9]))
    assert plan.evict_ids[:1].tolist() == [2], policy  # 1 is older, but upcoming
    p.retire(1)
    # Only upcoming rows are evictable: the policy's order among all of them.
    plan = p.plan(2, np.array([5, 6]), upcoming=np.array([1, 3, 4]))
    assert sorted(plan.evict_ids[:2].tolist()) == [1, 3], policy
    p.retire(2)


def test_an_upcoming_row_passed_over_stays_next_in_lru_order():
  p = CachePlanner(4, 4, lookahead=1)
  p.plan(0, np.array([1, 2, 3, 4]))
  p.retire(0)
  assert p.plan(1, np.array([5]), upcoming=np.array([1])).evict_ids[:1].tolist() == [2]
  p.retire(1)
  # Id 1 was not used after all: it is still the least recently used row.
  assert p.plan(2, np.array([6])).evict_ids[:1].tolist() == [1]
  p.retire(2)
  assert p.plan(3, np.array([7])).evict_ids[:1].tolist() == [3]


def test_bad_upcoming_ids_are_rejected_and_the_state_kept():
  p = CachePlanner(2, 2, num_rows=10)
  p.plan(0, np.array([1, 2]))
  p.retire(0)
  for bad, match in ((np.array([11]), "upcoming row id 11 is outside"),
                     (np.array([-1]), "upcoming row id -1"),
                     (np.array([[1]]), "1-D integer"), (np.array([1.0]), "1-D integer")):
    with pytest.raises(ValueError, match=match):
      p.plan(1, np.array([3]), upcoming=bad)
  assert p.next_step == 1 and p.total_misses == 2
  assert p.plan(1, np.array([3]), upcoming=np.array([2])).evict_ids[:1].tolist() == [1]
  p.retire(1)
  with pytest.raises(ValueError, match="upcoming row id 10 is outside"):  # checked without evictions
    p.plan(2, np.array([3]), upcoming=np.array([10]))


@settings(max_examples=50, deadline=None)
@given(batches=batches_st, capacity=st.integers(1, 20), lookahead=st.integers(1, 4),
       policy=st.sampled_from(cache_planner.CACHE_POLICIES), retire_draws=st.lists(st.integers(0, 4), max_size=25))
def test_plans_on_edge_case_streams(batches, capacity, lookahead, policy, retire_draws):
  _check_simulation(batches, capacity, lookahead, policy, retire_draws)


@pytest.mark.parametrize("policy", cache_planner.CACHE_POLICIES)
def test_ignoring_fill_after_step_reads_stale_rows(policy):
  rng = np.random.default_rng(1)
  batches = [sorted(rng.choice(12, size=4, replace=False).tolist()) for _ in range(60)]
  host, truth, counters = _simulate(batches, 9, 2, policy, [0] * 60)
  assert host == truth and counters["flagged"] > 0 and counters["evictions"] > 0
  naive_host, _, _ = _simulate(batches, 9, 2, policy, [0] * 60, obey_fill_after_step=False)
  assert naive_host != truth  # Gathering flagged fills early loses updates.


@settings(max_examples=60, deadline=None)
@given(case=random_streams(), policy=st.sampled_from(cache_planner.CACHE_POLICIES))
def test_dense_index_plans_keep_the_cache_consistent(case, policy):
  batches, capacity, lookahead, retire_draws = case
  num_rows = max(max(b) for b in batches) + 1
  _check_simulation(batches, capacity, lookahead, policy, retire_draws, num_rows=num_rows)


def _plan_stream(batches, capacity, lookahead, policy, retire_draws, num_rows, keep=0):
  """Every plan (or the capacity error) of one planner, retiring as `retire_draws` says
  (the next `keep` batches' ids passed as upcoming)."""
  planner = CachePlanner(capacity, U_CAP, policy=policy, lookahead=lookahead, num_rows=num_rows)
  out, retired = [], 0
  for step, ids in enumerate(batches):
    while retired < step and (step - retired + 1 > lookahead or retire_draws[step] > 0):
      planner.retire(retired)
      retired += 1
    try:
      upcoming = np.array(sorted(set().union(*batches[step + 1:step + 1 + keep])), np.int64)
      out.append(planner.plan(step, np.array(ids, np.int64), upcoming=upcoming if keep else None))
    except CacheCapacityError as e:
      out.append(str(e))
      break
  return out


@settings(max_examples=80, deadline=None)
@given(case=random_streams(), policy=st.sampled_from(cache_planner.CACHE_POLICIES),
       keep=st.integers(0, 2))
def test_dense_and_hashed_indexes_make_identical_plans(case, policy, keep):
  batches, capacity, lookahead, retire_draws = case
  num_rows = max(max(b) for b in batches) + 1
  hashed = _plan_stream(batches, capacity, lookahead, policy, retire_draws, None, keep)
  dense = _plan_stream(batches, capacity, lookahead, policy, retire_draws, num_rows, keep)
  assert len(hashed) == len(dense)
  for a, b in zip(hashed, dense, strict=True):
    if isinstance(a, str):
      assert a == b
      continue
    for name, x, y in zip(a._fields, a, b, strict=True):
      np.testing.assert_array_equal(x, y, err_msg=name)


def test_dense_index_only_for_known_small_tables_and_ids_inside_them():
  assert isinstance(CachePlanner(4, 4, num_rows=100)._index, slot_index.DenseIdIndex)
  assert isinstance(CachePlanner(4, 4)._index, slot_index.IdIndex)
  big = cache_planner.DENSE_INDEX_MAX_ROWS + 1
  assert isinstance(CachePlanner(4, 4, num_rows=big)._index, slot_index.IdIndex)
  planner = CachePlanner(4, 4, num_rows=10)
  with pytest.raises(ValueError, match="row id 10 is outside the table's 10 rows"):
    planner.plan(0, np.array([3, 10]))
  assert planner.next_step == 0  # nothing changed
  plan = planner.plan(0, np.array([3, 9]))
  assert plan.misses == 2 and planner.next_step == 1
