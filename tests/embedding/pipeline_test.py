"""MixCache host pipeline on hand-made batches: plans, fills, write-back ordering, shutdown."""

import os
import sys
import threading
import time
import traceback

import chex
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.core import background
from sfjax.data import types
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import cache_planner, sharded_cache, vsi
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import pipeline as pipeline_lib
from sfjax.embedding.initializers import init_rows
from sfjax.parallel import mesh as mesh_lib

SEED, STD = 3, 0.1
OFFSETS = np.array([0, 6], np.int64)  # two fields of 6 rows: global ids 0..5 and 6..11
NUM_SLOTS = 4


def _table():
  return host_table_lib.HostTable.create_ram(12, 2, 1, seed=SEED, init_stddev=STD,
                                             initial_slot_row=[0.5])


def _batch(ids):
  """A batch of per-field ids [B, 2] (field 1 is offset by 6 in the global table)."""
  ids = np.asarray(ids)
  return types.make_batch(ids, np.zeros((ids.shape[0], 1)), np.zeros(ids.shape[0]))


def _pipeline(batches, lookahead, unique_capacity, keep_upcoming=None):
  planner = cache_planner.CachePlanner(NUM_SLOTS, unique_capacity, lookahead=lookahead)
  return pipeline_lib.CachePipeline(batches, field_offsets=OFFSETS, host_table=_table(),
                                    planner=planner, put_batch=lambda x: x, put_swap=jax.device_put,
                                    keep_upcoming=keep_upcoming)


@jax.jit
def _device_step(cache, swap, rows):
  """The cache step without a model: swap, then add 1 to every row the batch uses."""
  cache, evicted = cache_lib.swap_rows(cache, swap)
  return cache._replace(values=cache.values.at[rows].add(1.0, mode="drop")), evicted


def _drive(pipe, steps, submit_last=True, num_slots=NUM_SLOTS):
  """Runs `steps` steps as the trainer does (next -> device step -> submit); returns inputs, cache.

  With `submit_last=False` the last step is only fetched: the caller runs and submits it.
  """
  cache = cache_lib.init_cache(num_slots, 2, 1)
  seen = []
  for i in range(steps):
    inputs = next(pipe)
    seen.append(inputs)
    if i == steps - 1 and not submit_last:
      break
    cache, evicted = _device_step(cache, inputs.swap, inputs.batch.rows)
    pipe.submit(inputs, evicted)
  return seen, cache


def _init(ids):
  return init_rows(SEED, 0, np.asarray(ids, np.int64), 2, STD)


def _pipeline_threads():
  return [t.name for t in threading.enumerate() if t.name.startswith("sfjax-") and t.is_alive()]


def test_plans_fills_and_write_back():
  batches = [_batch([[0, 1], [1, 2]]),  # global {0, 1, 7, 8}: 4 misses fill slots 0..3
             _batch([[3, 1], [3, 1]]),  # {3, 7}: 7 hits slot 2; 3 evicts LRU slot 0 (id 0)
             _batch([[0, 0], [0, 0]])]  # {0, 6}: id 0 comes back with its trained row
  pipe = _pipeline(batches, lookahead=1, unique_capacity=4)
  with pipe:
    (s0, s1, s2), cache = _drive(pipe, 3)
    with pytest.raises(StopIteration):
      next(pipe)
    pipe.drain()

    assert [s.step for s in (s0, s1, s2)] == [0, 1, 2]
    # Step 0: every unique id is a fill, gathered from the (untouched) host table.
    np.testing.assert_array_equal(s0.batch.rows, [0, 1, 2, 3])
    np.testing.assert_array_equal(s0.batch.vids, [[0, 2], [1, 3]])  # uniq = [0, 1, 7, 8]
    np.testing.assert_array_equal(s0.plan.fill_ids, [0, 1, 7, 8])
    chex.assert_trees_all_close(s0.swap.fill_values, _init([0, 1, 7, 8]))
    chex.assert_trees_all_close(s0.swap.fill_opt_slots, np.full((4, 1), 0.5, np.float32))
    assert s0.plan.num_evictions == 0 and s0.plan.hits == 0
    # Step 1: the batch's rows are the planned slots; padding is slot C = 4.
    np.testing.assert_array_equal(s1.batch.rows, s1.plan.slots)
    np.testing.assert_array_equal(s1.batch.rows, [0, 2, 4, 4])  # uniq [3, 7]
    assert (s1.plan.hits, s1.plan.num_fills, s1.plan.num_evictions) == (1, 1, 1)
    assert s1.plan.evict_ids[0] == 0 and s1.plan.evict_slots[0] == 0
    chex.assert_trees_all_close(s1.swap.fill_values[:1], _init([3]))
    chex.assert_trees_all_close(s1.swap.fill_values[1:], np.zeros((3, 2)))  # padded fills
    # Step 1's evicted row 0 (trained once at step 0) was written back to the host table ...
    values, slots = pipe.host_table.gather(np.array([0]))
    chex.assert_trees_all_close(values, _init([0]) + 1.0)
    chex.assert_trees_all_close(slots, np.full((1, 1), 0.5, np.float32))
    # ... and step 2's fill of id 0 carries it.
    np.testing.assert_array_equal(s2.plan.fill_ids[:2], [0, 6])
    chex.assert_trees_all_close(s2.swap.fill_values[:2], np.stack([_init([0])[0] + 1.0, _init([6])[0]]))

    stats = pipe.stats.as_dict()
    assert (stats["steps"], stats["examples"], stats["unique_ids"]) == (3, 6, 8)
    assert (stats["hits"], stats["misses"], stats["evictions"]) == (1, 7, 3)
    assert stats["cache_hit_rate"] == 1 / 8
    for stage in ("loader", "manager", "writeback"):  # thread CPU time, counted every step
      assert 0 < stats[f"{stage}_cpu_seconds"] < 60, stage
    assert pipe.last_step["step"] == 2

    # flush writes every row the device cache holds; the host table then equals training.
    assert pipe.flush(cache) == 4
    assert pipe.flush(cache) == 0  # nothing submitted since
    expected = {3: _init([3])[0] + 1, 7: _init([7])[0] + 2, 0: _init([0])[0] + 2, 6: _init([6])[0] + 1}
    for row_id, row in expected.items():
      chex.assert_trees_all_close(pipe.host_table.gather(np.array([row_id]))[0][0], row)
  assert not _pipeline_threads()


class _Gated:
  """An array whose host copy (the write-back's `np.asarray`) waits for `gate`, then
  `delay` seconds more (a slow device read)."""

  def __init__(self, array, gate, delay=0.0):
    self._array, self._gate, self._delay = array, gate, delay

  def __array__(self, dtype=None, copy=None):
    assert self._gate.wait(timeout=30.0)
    time.sleep(self._delay)
    return np.asarray(self._array, dtype)


def test_lookahead_fill_waits_for_the_write_back_it_depends_on():
  # One example, two fields: 2 unique ids per step; lookahead 2 plans step t+1 before t retires.
  batches = [_batch([[0, 0]]), _batch([[1, 1]]),  # ids {0, 6} -> slots 0, 1; {1, 7} -> 2, 3
             _batch([[2, 2]]),  # {2, 8} evicts slots 0, 1 (ids 0 and 6, step 0 retired)
             _batch([[0, 0]])]  # {0, 6} again, planned while step 2's write-back is held back
  # keep_upcoming=0: the policy alone (kept, ids 0 and 6 would stay cached whenever step 1
  # retired before step 2 was planned).
  with _pipeline(batches, lookahead=2, unique_capacity=2, keep_upcoming=0) as pipe:
    (_, _, s2), cache = _drive(pipe, 3, submit_last=False)
    np.testing.assert_array_equal(s2.plan.evict_ids[:2], [0, 6])
    cache, evicted = _device_step(cache, s2.swap, s2.batch.rows)
    gate = threading.Event()
    pipe.submit(s2, evicted._replace(values=_Gated(evicted.values, gate, delay=0.2)))
    deadline = time.monotonic() + 30.0
    while pipe.planner.next_step < 4:  # step 3 is planned; its fills must wait for step 2
      assert time.monotonic() < deadline
      time.sleep(0.001)
    assert pipe.planner.oldest_unretired == 2
    gate.set()
    s3 = next(pipe)
    assert s3.plan.fill_after_step == 2
    # The write-back's wait for the device read is wall time, not CPU time.
    assert pipe.stats.writeback_seconds >= 0.2 > pipe.stats.writeback_cpu_seconds
    # The fills were gathered only after step 2's evicted rows (trained at step 0) landed.
    chex.assert_trees_all_close(s3.swap.fill_values, _init([0, 6]) + 1.0)
    assert pipe.stats.ordering_waits == 1
  assert not _pipeline_threads()


class _RecordingPlanner(cache_planner.CachePlanner):
  """A real planner that also records the `upcoming` ids of each plan."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.upcoming = []

  def plan(self, step, uniq_ids, upcoming=None):
    self.upcoming.append(None if upcoming is None else sorted(upcoming.tolist()))
    return super().plan(step, uniq_ids, upcoming=upcoming)


@pytest.mark.parametrize("lookahead,keep,expected", [
    (3, None, [[1, 2, 7, 8], [2, 3, 8, 9], [3, 9], None]),  # default: lookahead - 1 batches
    (2, None, [[1, 7], [2, 8], [3, 9], None]),
    (2, 0, [None, None, None, None])])
def test_the_manager_passes_the_next_batches_ids_to_the_planner(lookahead, keep, expected):
  planner = _RecordingPlanner(12, 2, lookahead=lookahead)
  batches = [_batch([[i, i]]) for i in range(4)]  # ids {i, i + 6}
  with pipeline_lib.CachePipeline(batches, field_offsets=OFFSETS, host_table=_table(),
                                  planner=planner, put_batch=lambda x: x,
                                  put_swap=jax.device_put, keep_upcoming=keep) as pipe:
    _drive(pipe, 4, num_slots=12)
    assert planner.upcoming == expected
  with pytest.raises(ValueError, match="keep_upcoming must be >= 0, got -1"):
    pipeline_lib.CachePipeline([], field_offsets=OFFSETS, host_table=_table(), planner=planner,
                               put_batch=lambda x: x, put_swap=lambda x: x, keep_upcoming=-1)
  assert not _pipeline_threads()


def test_kept_upcoming_rows_spare_the_manager_every_write_back_wait():
  """Step 4 must evict ids {1, 7} or {2, 8}; step 5 uses {1, 7} again."""
  batches = [_batch([[0, 0]]), _batch([[1, 1]]), _batch([[2, 2]]), _batch([[0, 0]]),
             _batch([[3, 3]]), _batch([[1, 1]])]
  runs = {}
  for keep in (0, None):
    planner = cache_planner.CachePlanner(6, 2, lookahead=2)  # two steps in flight + the next
    with pipeline_lib.CachePipeline(batches, field_offsets=OFFSETS, host_table=_table(),
                                    planner=planner, put_batch=lambda x: x,
                                    put_swap=jax.device_put, keep_upcoming=keep) as pipe:
      seen, cache = _drive(pipe, len(batches), num_slots=6)
      pipe.flush(cache)
      runs[keep] = (seen, pipe.stats.ordering_waits, pipe.host_table.gather(np.arange(12))[0])
  plain, kept = runs[0][0], runs[None][0]
  # The policy alone evicts the least recent {1, 7}, which step 5 must refill (from the host
  # table, after step 4's write-back if step 4 has not retired by then).
  assert plain[4].plan.evict_ids[:2].tolist() == [1, 7] and plain[5].plan.misses == 2
  # Kept: step 4 evicts {2, 8} instead, step 5 hits both, and no plan waits.
  assert kept[4].plan.evict_ids[:2].tolist() == [2, 8] and kept[5].plan.hits == 2
  assert runs[None][1] == 0
  np.testing.assert_array_equal(runs[None][2], runs[0][2])  # the same training either way


def _failing_source():
  yield _batch([[0, 1]])
  raise OSError("disk vanished while reading shard 7")


def test_source_exception_propagates_and_close_stops_threads():
  pipe = _pipeline(_failing_source(), lookahead=1, unique_capacity=2)
  try:
    first = next(pipe)
    _, evicted = _device_step(cache_lib.init_cache(NUM_SLOTS, 2, 1), first.swap, first.batch.rows)
    pipe.submit(first, evicted)
    with pytest.raises(OSError, match="shard 7") as info:
      next(pipe)
    assert "_failing_source" in "".join(traceback.format_tb(info.value.__traceback__))
  finally:
    pipe.close()
  assert not _pipeline_threads()


@pytest.mark.parametrize("bad,field,message", [
    (-1, 1, "batch row 1, field 1: id -1 outside the field's rows [0, 6)"),  # would be row 5
    (6, 1, "batch row 1, field 1: id 6 outside the field's rows [0, 6)"),  # past the table
])
def test_an_id_outside_its_field_stops_the_pipeline_naming_row_and_field(bad, field, message):
  pipe = _pipeline([_batch([[0, 1], [2, bad]])], lookahead=1, unique_capacity=4)
  try:
    with pytest.raises(vsi.IdRangeError) as info:
      next(pipe)
    assert str(info.value).startswith(message)
    assert (info.value.row, info.value.field) == (1, field)
  finally:
    pipe.close()
  assert not _pipeline_threads()


def test_close_mid_stream_stops_threads():
  def endless():
    while True:
      yield _batch([[0, 1]])

  pipe = _pipeline(endless(), lookahead=1, unique_capacity=2)
  _drive(pipe, 2)
  pipe.close()
  assert not _pipeline_threads()


def test_row_sharded_pipeline_sends_fills_to_owners_and_writes_back_the_same_rows():
  """The first test's stream on a cache split over 2 devices (2 slots each): same host table."""
  mesh = mesh_lib.make_mesh(2)
  on_devices = NamedSharding(mesh, P("data"))

  @jax.jit
  def step(cache, swap, rows):
    cache, evicted = sharded_cache.swap_rows_sharded(mesh, cache, swap)
    return cache._replace(values=cache.values.at[rows].add(1.0, mode="drop")), evicted

  layout = sharded_cache.SlotLayout(2, 2)
  batches = [_batch([[0, 1], [1, 2]]), _batch([[3, 1], [3, 1]]), _batch([[0, 0], [0, 0]])]
  planner = cache_planner.CachePlanner(NUM_SLOTS, 4, lookahead=1)
  with pipeline_lib.CachePipeline(batches, field_offsets=OFFSETS, host_table=_table(),
                                  planner=planner, put_batch=lambda x: x,
                                  put_swap=lambda sw: jax.device_put(sw, on_devices),
                                  layout=layout, sharded_swap=True) as pipe:
    cache = jax.device_put(cache_lib.init_cache(NUM_SLOTS, 2, 1), on_devices)
    for _ in range(3):
      inputs = next(pipe)
      assert inputs.swap.fill_slots.shape[0] == 2  # one row of fills per device
      np.testing.assert_array_equal(inputs.batch.rows, layout.physical(inputs.plan.slots))
      cache, evicted = step(cache, inputs.swap, inputs.batch.rows)
      pipe.submit(inputs, evicted)
    # Step 0 filled logical slots 0..3 = physical 0, 2, 1, 3: two rows on each device.
    assert pipe.stats.d2h_rows == 3 and pipe.flush(cache) == 4
    expected = {3: _init([3])[0] + 1, 7: _init([7])[0] + 2, 0: _init([0])[0] + 2,
                6: _init([6])[0] + 1, 1: _init([1])[0] + 1, 8: _init([8])[0] + 1}
    for row_id, row in expected.items():
      chex.assert_trees_all_close(pipe.host_table.gather(np.array([row_id]))[0][0], row)
  assert not _pipeline_threads()


def test_pipeline_rejects_a_layout_that_does_not_match():
  planner = cache_planner.CachePlanner(NUM_SLOTS, 4)
  for layout, sharded, message in [(sharded_cache.SlotLayout(2, 3), True, "layout holds 6"),
                                   (sharded_cache.SlotLayout(2, 2), False, "sharded_swap")]:
    with pytest.raises(ValueError, match=message):
      pipeline_lib.CachePipeline([], field_offsets=OFFSETS, host_table=_table(), planner=planner,
                                 put_batch=lambda x: x, put_swap=lambda x: x, layout=layout,
                                 sharded_swap=sharded)


def test_unique_rows_are_padded_to_a_bucket_not_the_capacity():
  """600 unique ids of a 2000-capacity step travel as 768 rows (3/8 of the capacity, rounded)."""
  table = host_table_lib.HostTable.create_ram(1200, 2, 1, seed=SEED, init_stddev=STD,
                                              initial_slot_row=[0.5])
  batch = types.make_batch(np.stack([np.arange(300), np.arange(300)], axis=1),
                           np.zeros((300, 1)), np.zeros(300))
  offsets = np.array([0, 600], np.int64)  # 600 distinct global ids
  for bucket_unique, rows in [(True, 768), (False, 2000)]:
    planner = cache_planner.CachePlanner(4000, 2000)
    with pipeline_lib.CachePipeline([batch], field_offsets=offsets, host_table=table,
                                    planner=planner, put_batch=lambda x: x, put_swap=lambda x: x,
                                    bucket_unique=bucket_unique) as pipe:
      inputs = next(pipe)
      assert inputs.plan.num_unique == 600 and inputs.batch.rows.shape == (rows,)
      assert pipe.stats.steps_per_shape == {f"U{rows}/F768": 1}


def _probe_stage_threads(nice: int, probe) -> dict[str, object]:
  """`probe(native thread id)` of the loader, manager and write-back threads of a pipeline
  run with `nice` (all alive: the loader and manager wait on full queues)."""
  planner = cache_planner.CachePlanner(NUM_SLOTS, 4, lookahead=1)
  batches = [_batch([[i % 6, (i + 1) % 6], [(i + 2) % 6, 0]]) for i in range(40)]
  pipe = pipeline_lib.CachePipeline(batches, field_offsets=OFFSETS, host_table=_table(),
                                    planner=planner, put_batch=lambda x: x,
                                    put_swap=jax.device_put, nice=nice)
  try:
    _drive(pipe, 3)
    pipe.drain()
    threads = {t.name: probe(t.native_id) for t in threading.enumerate()
               if t.name in ("sfjax-data-loader", "sfjax-host-manager", "sfjax-write-back")
               and t.is_alive()}
    assert len(threads) == 3
    return threads
  finally:
    pipe.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_nice_lowers_the_pipeline_threads_only():
  """`nice` (train.loader_nice) lowers the loader, manager and write-back threads, so on a
  CPU they yield the cores to XLA's step threads; the trainer's own thread is untouched."""
  own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
  niceness = _probe_stage_threads(min(19, own + 5),
                                  lambda tid: os.getpriority(os.PRIO_PROCESS, tid))
  assert niceness == dict.fromkeys(niceness, min(19, own + 5))
  assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_idle_puts_the_pipeline_threads_under_sched_idle():
  """`nice=background.IDLE` (train.loader_idle): the loader, manager and write-back threads
  run under SCHED_IDLE, the trainer's own thread as it was."""
  own = os.sched_getscheduler(threading.get_native_id())
  policies = _probe_stage_threads(background.IDLE, os.sched_getscheduler)
  assert policies == dict.fromkeys(policies, os.SCHED_IDLE)
  assert os.sched_getscheduler(threading.get_native_id()) == own != os.SCHED_IDLE
