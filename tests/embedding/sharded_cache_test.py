"""Row-sharded cache: slot layout, per-owner staging, and the shard_map exchange on 8 devices."""

import chex
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.embedding import cache as cache_lib
from sfjax.embedding import cache_planner, device_table, sharded_cache
from sfjax.parallel import mesh as mesh_lib

D, C, E = 8, 6, 3


def test_layout_deals_logical_slots_round_robin_and_keeps_padding():
  layout = sharded_cache.SlotLayout(4, 3)
  assert layout.num_slots == 12
  np.testing.assert_array_equal(layout.physical(np.arange(12)),
                                [0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11])
  np.testing.assert_array_equal(layout.physical([12, 13]), [12, 12])  # padding -> D*C
  np.testing.assert_array_equal(sharded_cache.SlotLayout(1, 5).physical([0, 4, 5]), [0, 4, 5])
  assert layout.physical([5]).dtype == np.int32


def _plans():
  """Two plans of a 4 x 2-slot cache: 5 cold fills, then 4 misses (3 fills into free slots + 1
  eviction of the least recently used id)."""
  planner = cache_planner.CachePlanner(8, 5, lookahead=1)
  p0 = planner.plan(0, np.array([10, 11, 12, 13, 14]))
  planner.retire(0)
  p1 = planner.plan(1, np.array([11, 20, 21, 22, 23]))
  return p0, p1


def test_stage_swap_sends_each_fill_to_its_owner_only():
  layout = sharded_cache.SlotLayout(4, 2)
  p0, p1 = _plans()
  values = np.arange(5 * 2, dtype=np.float32).reshape(5, 2) + 1  # fill row k = [2k+1, 2k+2]
  staged = sharded_cache.stage_swap(p0, values, values[:, :1], layout, buckets=(1, 2, 4))
  # Logical slots 0..4 -> physical 0, 2, 4, 6, 1: device 0 gets ids 10 and 14, the others one.
  np.testing.assert_array_equal(staged.swap.fill_slots, [[0, 1], [0, 2], [0, 2], [0, 2]])
  chex.assert_trees_all_close(staged.swap.fill_values[0], values[[0, 4]])
  chex.assert_trees_all_close(staged.swap.fill_values[1:, 0], values[1:4])
  chex.assert_trees_all_close(staged.swap.fill_values[1:, 1], np.zeros((3, 2)))  # padding
  chex.assert_trees_all_close(staged.swap.fill_opt_slots[0, :, 0], values[[0, 4], 0])
  np.testing.assert_array_equal(staged.swap.evict_slots, np.full((4, 2), 2))  # no evictions
  np.testing.assert_array_equal(staged.evict_ids, np.full(8, -1))

  fills = np.zeros((p1.num_fills, 2), np.float32)
  staged = sharded_cache.stage_swap(p1, fills, fills[:, :0], layout, buckets=(1, 2, 4))
  assert p1.num_evictions == 1 and p1.evict_ids[0] in (10, 12, 13, 14)
  d_size = staged.swap.fill_slots.shape[1]
  # Every real fill / eviction sits in its owner's row at its local slot; the rest is padding.
  got_fills = {(d, int(s)) for d in range(4) for s in staged.swap.fill_slots[d] if s < 2}
  want = layout.physical(p1.fill_slots[:p1.num_fills])
  assert got_fills == {(int(p) // 2, int(p) % 2) for p in want}
  ev = np.flatnonzero(staged.evict_ids >= 0)
  assert staged.evict_ids[ev].tolist() == [p1.evict_ids[0]]
  phys = int(layout.physical(p1.evict_slots[:1])[0])
  assert divmod(int(ev[0]), d_size) == (phys // 2, int(np.flatnonzero(
      staged.swap.evict_slots[phys // 2] < 2)[0]))
  assert staged.swap.evict_slots[phys // 2][ev[0] % d_size] == phys % 2


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_stage_swap_of_one_shard_equals_the_by_owner_staging(dtype):
  """One shard takes a prefix-copy path; it must stage exactly what the owner split does."""
  rng = np.random.default_rng(3)
  planner = cache_planner.CachePlanner(24, 16, lookahead=1)
  layout = sharded_cache.SlotLayout(1, 24)
  evicted = 0
  for step in range(6):
    plan = planner.plan(step, np.sort(rng.choice(60, size=int(rng.integers(1, 17)),
                                                 replace=False)))
    evicted += plan.num_evictions
    values = rng.normal(size=(plan.num_fills, 3)).astype(dtype)
    opt = rng.uniform(size=(plan.num_fills, 2)).astype(np.float32)
    fast = sharded_cache.stage_swap(plan, values, opt, layout, buckets=(4, 8, 16))
    slow = sharded_cache._stage_by_owner(plan, values, opt, layout, buckets=(4, 8, 16))
    chex.assert_trees_all_equal(fast, slow)
    chex.assert_trees_all_equal_dtypes(fast, slow)
    planner.retire(step)
  assert evicted  # the comparison covered evictions too


def _tables(seed=0, slot_width=E):
  rng = np.random.default_rng(seed)
  values = rng.normal(size=(D * C, E)).astype(np.float32)
  slots = rng.uniform(0.5, 1.0, size=(D * C, slot_width)).astype(np.float32)
  return values, slots


def _put_sharded(mesh, *arrays):
  return [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in arrays]


def test_block_by_owner_puts_each_unique_row_in_its_owners_block():
  layout = sharded_cache.SlotLayout(4, 5)
  slots = np.array([7, 0, 19, 12, 3, 6], np.int32)  # owners 1, 0, 3, 2, 0, 1
  vids = np.array([[0, 1, 2], [3, 4, 5], [5, 5, 0]], np.int32)
  rows, blocked = sharded_cache.block_by_owner(slots, vids, layout, buckets=(1, 2, 4))
  # Busiest owner holds 2 rows -> blocks of 2; local slots, padding = C = 5.
  np.testing.assert_array_equal(rows, [0, 3, 2, 1, 2, 5, 4, 5])
  # Blocked rows seen through the new vids are the original slots (as global slots).
  global_rows = np.repeat(np.arange(4) * 5, 2) + rows
  np.testing.assert_array_equal(global_rows[blocked], slots[vids])
  rows, _ = sharded_cache.block_by_owner(slots, vids, layout, buckets=(1, 2, 4), min_rows=3)
  assert rows.shape == (16,)  # blocks of at least 3 rows -> bucket 4


def test_block_by_owner_points_padding_ids_at_a_padding_row():
  layout = sharded_cache.SlotLayout(2, 5)
  slots = np.array([7, 0, 8, 3], np.int32)  # owners 1, 0, 1, 0: both blocks full at 2
  vids = np.array([[0, 4, 1], [4, 2, 3]], np.int32)  # 4 = U: padding
  rows, blocked = sharded_cache.block_by_owner(slots, vids, layout, buckets=(2, 4),
                                               has_padding=True)
  assert rows.shape == (8,)  # every block was full: the next bucket keeps a padding row
  assert (rows[blocked[vids == 4]] == 5).all()  # a padding entry (local slot C)
  global_rows = np.repeat(np.arange(2) * 5, 4) + rows
  real = vids != 4
  np.testing.assert_array_equal(global_rows[blocked[real]], slots[vids[real]])
  # Room in a block already: the blocks keep their size.
  rows, blocked = sharded_cache.block_by_owner(slots[:3], np.array([[0, 3, 2]], np.int32),
                                               layout, buckets=(2, 4), has_padding=True)
  assert rows.shape == (4,) and rows[blocked[0, 1]] == 5
  with pytest.raises(ValueError, match="cannot hold"):
    sharded_cache.block_by_owner(slots, vids, layout, buckets=(2,), has_padding=True)


def test_sharded_swap_reads_out_then_fills_on_each_owner():
  mesh = mesh_lib.make_mesh(D)
  values, slots = _tables()
  fd = 2
  fill_slots = np.full((D, fd), C, np.int32)
  evict_slots = np.full((D, fd), C, np.int32)
  fill_slots[1, 0] = evict_slots[1, 0] = 4  # device 1 swaps its local slot 4 (global 10)
  fill_slots[7, :] = [0, 5]  # device 7 fills two free slots (global 42, 47)
  fill_values = np.full((D, fd, E), 9.0, np.float32)
  fill_opt = np.full((D, fd, E), 7.0, np.float32)
  table = device_table.TableState(*_put_sharded(mesh, values, slots))
  swap = cache_lib.CacheSwap(*_put_sharded(mesh, fill_slots, fill_values, fill_opt, evict_slots))
  new, evicted = jax.jit(lambda t, s: sharded_cache.swap_rows_sharded(mesh, t, s))(table, swap)
  assert evicted.values.shape == (D, fd, E) and evicted.values.sharding.spec == P("data")
  np.testing.assert_array_equal(np.asarray(evicted.values)[1, 0], values[10])  # the old row
  np.testing.assert_array_equal(np.asarray(evicted.values)[0], np.zeros((fd, E)))  # padding
  want = values.copy()
  want[[10, 42, 47]] = 9.0
  np.testing.assert_array_equal(np.asarray(new.values), want)
  want_slots = slots.copy()
  want_slots[[10, 42, 47]] = 7.0
  np.testing.assert_array_equal(np.asarray(new.opt_slots), want_slots)
