"""The row-sharded cache over several processes: fills routed to their owning device,
evictions gathered to every process.

Two ownerships meet here. A cache slot lives on one device d (`sharded_cache`:
physical slots `[d*C, (d+1)*C)`), and device d belongs to process d // L; a host row
belongs to process `id % P` (`backends.CacheBackend._owns`). So a row filled into
device d's slots may be held by another process's host table, and a row evicted
from device d may be written back by another process.

Fills: every process stages the same `[D, Fd]` swap (identical planners) with its own
host rows only, zeros elsewhere (`pipeline._gather_owned`), and puts it as its block
of a `[D, D, Fd, W]` array split on 'data' (`distributed.put_process_blocks`: the
block sits on the process's first device, zeros on the others). Inside the per-device
step one `psum_scatter` over 'data' sums the blocks and hands device d exactly its
`[Fd, W]` share: each row is nonzero in one process's block, so the sum is exact.
Ring bytes per device: (D-1)/D x D x Fd x W x 4, the same order as the replicated
cache's per-process fill all-reduce.

Evictions: each device's `[Fd, W]` read-out is `all_gather`ed into a replicated
`[D, Fd, W]`, which every process reads whole (`np.asarray`) and from which it writes
back the rows it owns. A flush (eval, checkpoint) reads the cache through
`replicated_copy` for the same reason: a process can read only its own devices' slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from sfjax.embedding import cache as cache_lib
from sfjax.embedding import device_table, sharded_cache

_AXIS = sharded_cache.AXIS


def _own_share(blocks: jax.Array) -> jax.Array:
  """Inside shard_map: this device's `[1, Fd, W]` share of the per-process fill blocks
  (local view `[1, D, Fd, W]`), summed over the devices."""
  local = blocks[0]  # [D, Fd, W]: one process's staged fills for every device (or zeros)
  if local.size == 0:  # zero-width optimizer slots (SGD): nothing to move
    return jnp.zeros((1,) + local.shape[1:], local.dtype)
  return jax.lax.psum_scatter(local, _AXIS, scatter_dimension=0, tiled=True)


def _gather_all(rows: jax.Array, devices: int) -> jax.Array:
  """Inside shard_map: every device's `[1, Fd, W]` rows as `[D, Fd, W]` on each device."""
  if rows.size == 0:
    return jnp.zeros((devices,) + rows.shape[1:], rows.dtype)
  return jax.lax.all_gather(rows, _AXIS, axis=0, tiled=True)


def route_fills_and_gather_evictions(owner_step: Callable[..., Any]) -> Callable[..., Any]:
  """The per-device cache step (run inside `jax.shard_map` over 'data') taking fills as
  per-process blocks and returning the evicted rows of every device.

  Args:
    owner_step: `(state, batch, swap) -> (state, metrics, evicted)` for one device, its
      swap's fill values `[1, Fd, E]` / slots `[1, Fd, S]` and evicted rows `[1, Fd, .]`.

  Returns:
    The same step whose swap carries fill values `[1, D, Fd, E]` and fill slots
    `[1, D, Fd, S]` (this device's slice of the per-process blocks) and whose evicted
    rows are `[D, Fd, .]`, the same on every device (shard_map out_spec `P()`).
  """

  def step(state, batch, swap: cache_lib.CacheSwap):
    devices = swap.fill_values.shape[1]
    swap = swap._replace(fill_values=_own_share(swap.fill_values),
                         fill_opt_slots=_own_share(swap.fill_opt_slots))
    state, metrics, evicted = owner_step(state, batch, swap)
    evicted = device_table.TableState(*(_gather_all(x, devices) for x in evicted))
    return state, metrics, evicted

  return step


def replicated_copy(table: device_table.TableState, sharding) -> device_table.TableState:
  """`table` (split on 'data' over every process's devices) as a copy replicated on
  `sharding`, readable whole by every process (one all-gather)."""
  return jax.jit(lambda t: t, out_shardings=sharding)(table)
