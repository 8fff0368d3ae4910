"""A device row cache over an on-disk table: serving a table bigger than RAM (issue #23 item 3).

`CachedRows(MmapRows(...), capacity)` keeps `capacity` rows on the device and the rest in
the bundle's memory-mapped chunk files. Per request, with the MixCache machinery of
training (`sfjax.embedding`): the request's rows are deduplicated (`vsi.dedup_ids`), the
`CachePlanner` maps the unique rows to cache slots (LRU or LFU; misses fill free slots
or evict), only the missed rows are read from disk and copied to the device, and the
device gathers `cache[slots][vids]`. The table is read-only here, so evicted rows are
dropped, never written back. `stats()` reports the hit rate and bytes moved per request.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.embedding import vsi
from sfjax.embedding.cache_planner import CachePlanner
from sfjax.serving.row_source import RowSource


@functools.partial(jax.jit, donate_argnums=0)  # the cache is updated in place, not copied
def _fill_and_gather(cache, fill_slots, fills, slots, vids):
  """cache [C, E] with `fills` written at `fill_slots` (C: dropped), and the rows
  `cache[slots[vids]]` [n, E]."""
  cache = cache.at[fill_slots].set(fills, mode="drop")
  return cache, jnp.take(cache, jnp.take(slots, vids), axis=0, mode="fill", fill_value=0)


class CachedRows:
  """`RowSource` of `capacity` device-cached rows over a slower source (e.g. `MmapRows`).

  Args:
    source: where missed rows are read (`gather(rows) -> float32 [n, E]`).
    capacity: C, rows held on the device (>= unique_capacity).
    unique_capacity: the most rows one `gather` may ask for (padded batch * fields).
    policy: "lru" or "lfu" (`sfjax.embedding.cache_planner`).
  """

  def __init__(self, source: RowSource, capacity: int, unique_capacity: int,
               policy: str = "lru"):
    if capacity < unique_capacity:
      raise ValueError(f"cache_rows: {capacity} rows cannot hold one request's "
                       f"{unique_capacity} rows (largest batch size x fields)")
    self.source, self.num_rows, self.width = source, source.num_rows, source.width
    self.capacity, self.unique_capacity = int(capacity), int(unique_capacity)
    self._planner = CachePlanner(self.capacity, self.unique_capacity, policy=policy)
    self._cache = jnp.zeros((self.capacity, self.width), jnp.float32)  # [C, E]
    self._step = self.requests = self.rows_requested = 0
    self.bytes_to_device = 0

  def gather(self, rows: np.ndarray) -> jax.Array:
    """rows [n] int64 (n <= unique_capacity; -1: padding) -> float32 [n, E] on the device.

    Padding rows (the unused columns of bags and sequences) get no unique entry and no
    cache slot: their virtual id is the spare entry U, whose slot is the planner's
    padding slot C, which the gather reads as zeros.
    """
    rows = np.asarray(rows, np.int64)
    n = rows.shape[0]  # buffers of n entries: one compiled shape per batch size, not U_cap
    if n > self.unique_capacity:
      raise ValueError(f"gather: {n} rows > unique_capacity {self.unique_capacity}")
    virt = vsi.dedup_ids(rows[None, :], n, pad_id=-1)
    plan = self._planner.plan(self._step, virt.uniq[:virt.num_unique])
    fills = np.zeros((n, self.width), np.float32)  # num_fills <= num_unique <= n
    if plan.num_fills:
      fills[:plan.num_fills] = self.source.gather(plan.fill_ids[:plan.num_fills])
    self._cache, out = _fill_and_gather(self._cache, plan.fill_slots[:n], fills,
                                        plan.slots[:n], virt.vids[0])
    self._planner.retire(self._step)  # nothing to write back: the table is read-only
    self._step += 1
    self.requests += 1
    self.rows_requested += rows.shape[0]
    self.bytes_to_device += plan.num_fills * self.width * 4
    return out

  def stats(self) -> dict[str, float]:
    """`hit_rate` (of unique rows), `h2d_bytes_per_request`, `requests`, `evictions`, and
    the running totals `hits`, `lookups` (unique rows looked up) and `h2d_bytes`."""
    p = self._planner
    looked_up = p.total_hits + p.total_misses
    return {"hit_rate": p.total_hits / looked_up if looked_up else 0.0,
            "h2d_bytes_per_request": self.bytes_to_device / max(self.requests, 1),
            "requests": self.requests, "evictions": p.total_evictions,
            "cache_rows": self.capacity, "hits": p.total_hits, "lookups": looked_up,
            "h2d_bytes": self.bytes_to_device}
