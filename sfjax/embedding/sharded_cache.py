"""Row-sharded MixCache: cache slots partitioned over the 'data' devices (DESIGN.md §3).

A replicated cache keeps the same `C` rows on every device, so its capacity does not
grow with the device count. A row-sharded cache gives each of the `D` devices its own
`C` rows: the global slot space is `[0, D*C)` and device `d` owns the physical slots
`[d*C, (d+1)*C)` (the cache arrays are `[D*C, E]`, sharded on their leading axis).

Host side (numpy):
  `SlotLayout` maps the planner's logical slots to physical ones round-robin
  (logical `l` -> device `l % D`, row `l // D`), so the planner, which hands out free
  slots 0, 1, 2, ... in order, fills every device evenly from a cold start.
  `stage_swap` splits a plan's fills and evictions by owner and pads each device's
  share to one bucket: fills travel only to the device that owns their slot.

Device side: the whole cache step runs inside one `jax.shard_map` over 'data'
(`train.step.make_train_step(row_axis='data')`), with the batch's unique rows laid out
in per-owner blocks by the host (`block_by_owner`: `rows [D*Ud]`, block d = device d's
local slots, padded to a bucket Ud):
  swap     each device reads its victims out and writes its fills, locally.
  lookup   each device gathers its own block `[Ud, E]`; one `all_gather` gives every
           device the `[D*Ud, E]` rows its examples index.
  grads    each device's `[D*Ud, E]` row gradient (weighted by its share of the
           examples) is summed by one `psum_scatter`: each owner receives exactly its
           rows' summed gradient `[Ud, E]`; dense gradients by one `psum`.
  update   each owner applies the row optimizer to its own `Ud` rows only.

Bytes per device per step (ring): all_gather (D-1)*Ud*E*4 + reduce-scatter the same,
about half of an owner-masked gather + `psum` lookup and an all-reduced `[U, E]` gradient
(2 all-reduces of 2(D-1)/D*U*E*4), at the cost of the per-owner padding;
`experiments/bench_scaling.py` measures both on the run's real shapes. XLA:CPU's GSPMD
turns a gradient resharded to its owners into all-reduce + slice, not reduce-scatter,
so the collectives are written out here.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from sfjax.embedding import cache as cache_lib
from sfjax.embedding import cache_planner, device_table

AXIS = "data"  # the mesh axis of sfjax.parallel.mesh (embedding does not import parallel)


class SlotLayout(NamedTuple):
  """Where the planner's logical slots live on the devices.

  Attributes:
    num_shards: D, devices the cache is partitioned over (1 = one copy, maybe replicated).
    rows_per_shard: C, cache rows each device holds.
  """

  num_shards: int
  rows_per_shard: int

  @property
  def num_slots(self) -> int:
    """D * C, the distinct rows the cache holds in all."""
    return self.num_shards * self.rows_per_shard

  def physical(self, logical: np.ndarray) -> np.ndarray:
    """Logical slots -> physical slots (int32); entries >= D*C (padding) -> D*C."""
    d, c = self.num_shards, self.rows_per_shard
    if d == 1:  # one shard: the same slots, padding clipped to C
      return np.minimum(np.asarray(logical), c).astype(np.int32)
    logical = np.asarray(logical, np.int64)
    phys = (logical % d) * c + logical // d
    return np.where(logical >= d * c, d * c, phys).astype(np.int32)


class StagedSwap(NamedTuple):
  """A plan's cache moves split by owning device (host numpy, fixed shapes).

  Attributes:
    swap: CacheSwap with a leading device axis: fill_slots / evict_slots [D, Fd] int32
      local slots (padding = C), fill_values [D, Fd, E] (row dtype), fill_opt_slots [D, Fd, S].
    evict_ids: [D * Fd] int64 ids of the evicted rows in the order of the flattened
      read-out `[D * Fd]`; -1 in padding entries.
  """

  swap: cache_lib.CacheSwap[np.ndarray]
  evict_ids: np.ndarray


def _by_owner(slots: np.ndarray, layout: SlotLayout):
  """(owner [n], local slot [n], position within its owner's list [n]) of physical slots."""
  owner, local = np.divmod(slots.astype(np.int64), layout.rows_per_shard)
  order = np.argsort(owner, kind="stable")
  counts = np.bincount(owner, minlength=layout.num_shards)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  pos = np.empty_like(owner)
  pos[order] = np.arange(owner.size) - np.repeat(starts, counts)
  return owner, local, pos, counts


def stage_swap(plan: cache_planner.CachePlan, fill_values: np.ndarray,
               fill_opt_slots: np.ndarray, layout: SlotLayout,
               buckets: tuple[int, ...]) -> StagedSwap:
  """Splits `plan`'s fills and evictions by owner, padded to one per-device bucket.

  Args:
    plan: the planner's plan (logical slots).
    fill_values: [num_fills, E] host rows of `plan.fill_ids[:num_fills]`.
    fill_opt_slots: [num_fills, S] their optimizer slots.
    layout: the slot layout.
    buckets: ascending per-device buffer lengths; the smallest holding the busiest
      device's fills and evictions is used (the last bucket if none does).

  Returns:
    StagedSwap.
  """
  if layout.num_shards == 1:
    return _stage_one_shard(plan, fill_values, fill_opt_slots, buckets)
  return _stage_by_owner(plan, fill_values, fill_opt_slots, layout, buckets)


def _stage_by_owner(plan: cache_planner.CachePlan, fill_values: np.ndarray,
                    fill_opt_slots: np.ndarray, layout: SlotLayout,
                    buckets: tuple[int, ...]) -> StagedSwap:
  """`stage_swap` for any number of shards: fills and evictions grouped by owner."""
  d, c = layout.num_shards, layout.rows_per_shard
  fills = layout.physical(plan.fill_slots[:plan.num_fills])
  evicts = layout.physical(plan.evict_slots[:plan.num_evictions])
  f_owner, f_local, f_pos, f_counts = _by_owner(fills, layout)
  e_owner, e_local, e_pos, e_counts = _by_owner(evicts, layout)
  busiest = int(max(f_counts.max(initial=0), e_counts.max(initial=0)))
  size = buckets[min(int(np.searchsorted(buckets, busiest)), len(buckets) - 1)]
  width, slot_width = fill_values.shape[1], fill_opt_slots.shape[1]
  fill_slots = np.full((d, size), c, np.int32)
  fill_slots[f_owner, f_pos] = f_local
  values = np.zeros((d, size, width), fill_values.dtype)  # the row dtype: fills move as stored
  values[f_owner, f_pos] = fill_values
  opt_slots = np.zeros((d, size, slot_width), np.float32)
  opt_slots[f_owner, f_pos] = fill_opt_slots
  evict_slots = np.full((d, size), c, np.int32)
  evict_slots[e_owner, e_pos] = e_local
  evict_ids = np.full((d, size), -1, np.int64)
  evict_ids[e_owner, e_pos] = plan.evict_ids[:plan.num_evictions]
  return StagedSwap(cache_lib.CacheSwap(fill_slots, values, opt_slots, evict_slots),
                    evict_ids.reshape(-1))


def _stage_one_shard(plan: cache_planner.CachePlan, fill_values: np.ndarray,
                     fill_opt_slots: np.ndarray, buckets: tuple[int, ...]) -> StagedSwap:
  """`stage_swap` for one shard: the plan's slots are physical and its buffers already padded
  (slots with C, ids with -1), so they are cut to the smallest bucket holding the fills and
  evictions; only the fill rows are padded (with zeros)."""
  nf, ne = plan.num_fills, plan.num_evictions
  size = buckets[min(int(np.searchsorted(buckets, max(nf, ne))), len(buckets) - 1)]

  def rows(values: np.ndarray) -> np.ndarray:
    out = np.empty((1, size) + values.shape[1:], values.dtype)
    out[0, :nf] = values[:nf]
    out[0, nf:] = 0
    return out

  return StagedSwap(
      cache_lib.CacheSwap(plan.fill_slots[None, :size], rows(fill_values), rows(fill_opt_slots),
                          plan.evict_slots[None, :size]),
      plan.evict_ids[:size])


def block_by_owner(slots: np.ndarray, vids: np.ndarray, layout: SlotLayout,
                   buckets: tuple[int, ...], min_rows: int = 0,
                   has_padding: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """Lays a step's unique rows out in per-owner blocks (host side of the row exchange).

  Args:
    slots: [U] physical slots of the step's unique ids (real entries only).
    vids: [B, F] int32 virtual ids into `slots`.
    layout: the slot layout.
    buckets: ascending block lengths; the smallest holding the busiest owner's rows is used.
    min_rows: rows per block at least (e.g. ceil(B*F / D): a no-VSI benchmark's volume).
    has_padding: vids equal to U (padding ids of bags and sequences) point at a padding
      entry of the least busy block (blocks grow by one row if every block is full).

  Returns:
    rows [D * Ud] int32: block d holds device d's LOCAL slots (padding = C);
    vids [B, F] int32 into the blocked rows.
  """
  d, c = layout.num_shards, layout.rows_per_shard
  owner, local, pos, counts = _by_owner(np.asarray(slots), layout)
  busiest = max(int(counts.max(initial=0)), min_rows)
  if has_padding:  # some block must keep a padding row for the padding ids
    busiest = max(busiest, int(counts.min()) + 1)
  size = buckets[min(int(np.searchsorted(buckets, busiest)), len(buckets) - 1)]
  if size < busiest:
    raise ValueError(f"per-owner blocks of {size} rows cannot hold {busiest}")
  rows = np.full((d, size), c, np.int32)
  rows[owner, pos] = local
  position = (owner * size + pos).astype(np.int32)  # unique i -> its place in the blocks
  if has_padding:
    spare = int(np.argmin(counts))
    position = np.append(position, np.int32(spare * size + counts[spare]))
  return rows.reshape(-1), np.take(position, vids)


def blocked_like(slots: np.ndarray, entries: np.ndarray, layout: SlotLayout,
                 block_rows: int, fill=0) -> np.ndarray:
  """`entries [U]` (one per unique row) laid out like `block_by_owner`'s rows.

  Args:
    slots: [U] physical slots, as given to `block_by_owner`.
    entries: [U] a value per unique row (e.g. its table index, `DeviceBatch.row_tables`).
    layout: the slot layout.
    block_rows: Ud, the block length `block_by_owner` chose (its rows are [D * Ud]).
    fill: the value of padding entries.

  Returns:
    [D * Ud] entries: block d holds those of device d's rows, in the rows' order.
  """
  owner, _, pos, _ = _by_owner(np.asarray(slots), layout)
  out = np.full((layout.num_shards, block_rows), fill, np.asarray(entries).dtype)
  out[owner, pos] = entries
  return out.reshape(-1)


def swap_rows_local(cache: device_table.TableState, swap: cache_lib.CacheSwap
                    ) -> tuple[device_table.TableState, device_table.TableState]:
  """One device's swap inside `jax.shard_map`: its `[1, Fd]` share of a staged swap
  applied to its cache block. Returns (block, evicted rows [1, Fd])."""
  cache, evicted = cache_lib.swap_rows(cache, cache_lib.CacheSwap(*(x[0] for x in swap)))
  return cache, device_table.TableState(evicted.values[None], evicted.opt_slots[None])


def swap_rows_sharded(mesh, table: device_table.TableState, swap: cache_lib.CacheSwap
                      ) -> tuple[device_table.TableState, device_table.TableState]:
  """Each device reads its victims out, then writes its fills (`StagedSwap.swap` layout).

  Returns:
    (new table, evicted rows: values [D, Fd, E] and opt_slots [D, Fd, S], sharded on 'data').
  """
  spec = P(AXIS)
  return jax.shard_map(swap_rows_local, mesh=mesh, in_specs=(spec, spec),
                       out_specs=(spec, spec))(table, swap)
