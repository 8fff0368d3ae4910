"""MixCache, device side: a cache of hot rows as pure functional state.

The cache is a `TableState` of `C` rows (`values[C, E]`, `opt_slots[C, S]`), the
same pytree as the on-device reference table, so the train step body is shared:
only the indices differ (cache slots instead of table rows). Each step first
swaps rows according to the host planner's `CachePlan`:

  evicted = cache[evict_slots]        # read victims out (returned for write-back)
  cache[fill_slots] = fill rows       # then admit the misses (values AND optimizer slots)

and then runs the ordinary step with `batch.rows` = the batch's slots. Padding
slots equal `C`: gathers read zeros, scatters drop them. Rows stored half-width
(`embedding.dtype`) move half-width both ways: fills arrive in the cache's dtype and
evicted rows are read out as stored.

A jitted step compiles once per input shape, so a swap's rows are padded to one of a few
lengths chosen by the step's real count: `swap_buckets` (eighths of the capacity) for a
cache's fills and evictions, `owner_buckets` (geometric) for a row-sharded cache's
per-device blocks, and `bucket_for` picks the smallest length that holds a count.
"""

from __future__ import annotations

from typing import Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.embedding import device_table, row_dtype

# A CacheSwap's array type: np.ndarray while staged on the host, jax.Array on the device.
A = TypeVar("A")


class CacheSwap(NamedTuple, Generic[A]):
  """One step's cache moves (fixed shapes, F_cap entries, padding slot = C).

  Attributes:
    fill_slots: [F_cap] int32 slots receiving missed rows.
    fill_values: [F_cap, E] rows gathered from the host table (the table's row dtype).
    fill_opt_slots: [F_cap, S] float32 their optimizer slots.
    evict_slots: [F_cap] int32 slots whose rows are read out before the fills.
  """

  fill_slots: A
  fill_values: A
  fill_opt_slots: A
  evict_slots: A


def init_cache(num_slots: int, width: int, slot_width: int, sharding=None,
               dtype=np.float32) -> device_table.TableState:
  """An empty cache (zeros; rows of `dtype`, stored as `row_dtype.storage_dtype`): every row is
  written by a fill before it is read."""
  values = np.zeros((num_slots, width), row_dtype.storage_dtype(dtype))
  slots = np.zeros((num_slots, slot_width), np.float32)
  if sharding is None:
    return device_table.TableState(jnp.array(values), jnp.array(slots))
  return device_table.TableState(jax.device_put(values, sharding), jax.device_put(slots, sharding))


def swap_rows(cache: device_table.TableState, swap: CacheSwap[jax.Array]
              ) -> tuple[device_table.TableState, device_table.TableState]:
  """Reads the victims out, then writes the fills. Returns (new cache, evicted rows [F_cap]
  as stored)."""
  evicted = device_table.take_stored_rows(cache, swap.evict_slots)
  cache = device_table.scatter_rows(
      cache, read_before(swap.fill_slots, evicted),
      device_table.TableState(swap.fill_values, swap.fill_opt_slots))
  return cache, evicted


def read_before(indices: jax.Array, reads) -> jax.Array:
  """`indices`, made to depend on every array of the pytree `reads` (its values unchanged).

  A scatter into a donated buffer at these indices then runs after the reads: XLA updates
  the buffer in place. Without the dependency XLA may not order the read-out of a cache's
  victims before the fills' write, and copies the whole cache to keep the old rows
  readable (XLA:CPU: two copies of values and slots per step, ~18 MB at 130k x 17 rows;
  `jax.lax.optimization_barrier` does not prevent them there). The dependency is one element
  of each array, mapped to an exact integer 0 (NaN and inf included).
  """
  zero = jnp.zeros((), jnp.float32)
  for leaf in jax.tree.leaves(reads):
    if leaf.size:
      first = leaf.reshape(-1)[0].astype(jnp.float32)
      zero = zero + jnp.where(jnp.abs(first) < 1.0, first, 0.0) * 0.0
  return indices + zero.astype(indices.dtype)


def swap_buckets(capacity: int, eighths: int = 8, halvings: int = 2,
                 multiple: int = 256) -> tuple[int, ...]:
  """The few swap lengths a cache step is compiled for.

  Fill and evict buffers are sized by the step's real misses (the smallest bucket that
  holds them), not padded to the unique capacity every step: at a 45% hit rate a step
  moves about half of the padded rows. Buckets are `k/8` of the capacity (k = 1..8,
  so a step pads by at most an eighth of the capacity) plus `1/16`, `1/32`, ... for
  nearly-all-hit steps, rounded up to a multiple of `multiple`. Each bucket compiles
  once (at most `eighths + halvings` programs), so steps never recompile after warm-up.
  """
  fractions = [(k, eighths) for k in range(1, eighths + 1)]
  fractions += [(1, eighths << h) for h in range(1, halvings + 1)]
  sizes = {capacity}
  for num, den in fractions:
    size = -(-capacity * num // den)  # ceil: never 0
    sizes.add(min(capacity, -(-size // multiple) * multiple))
  return tuple(sorted(sizes))


def owner_buckets(capacity: int, num_shards: int, ratio: float = 1.125) -> tuple[int, ...]:
  """Per-device buffer lengths of a row-sharded cache (row blocks, fills, evictions).

  A device holds about 1/D of a step's rows, which k/8-of-the-capacity buckets would pad
  by up to capacity/8 (more than the whole share at D = 8). Instead the lengths grow
  geometrically by `ratio` (at most 12.5% padding) in multiples of max(8, 128 // D), up
  to `capacity` (a device may own every row of a step). A run visits the few lengths
  near its usual share; each compiles once.
  """
  multiple = max(8, 128 // max(num_shards, 1))
  sizes, size = [], multiple
  while size < capacity:
    sizes.append(size)
    size = max(size + multiple, -(-int(size * ratio) // multiple) * multiple)
  return tuple(sizes) + (int(capacity),)


def bucket_for(count: int, buckets: tuple[int, ...]) -> int:
  """The smallest bucket >= `count` (buckets sorted ascending; the last is the capacity)."""
  return buckets[min(int(np.searchsorted(buckets, count)), len(buckets) - 1)]
