"""The row-sharded cache's fill routing and eviction gathering across processes, checked on
8 devices of one process with per-process blocks built by hand (two 'processes' of 4
devices: blocks 0 and 4 hold their rows, the others zeros)."""

import chex
import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from sfjax.embedding import cache as cache_lib
from sfjax.embedding import device_table
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import process_cache

D, FD, W = 8, 3, 2


def _echo_step(state, batch, swap):
  """A per-device 'step' whose evicted rows are the fills it received."""
  return state, {"n": batch.sum()}, device_table.TableState(swap.fill_values, swap.fill_opt_slots)


def test_each_device_gets_its_fills_from_every_process_and_every_process_gets_all_evictions():
  mesh = mesh_lib.make_mesh(D)
  on = P(process_cache._AXIS)
  fills = np.random.default_rng(0).normal(size=(D, FD, W)).astype(np.float32)
  owner = np.arange(D * FD).reshape(D, FD) % 2  # which 'process' holds each fill's host row
  blocks = np.zeros((D, D, FD, W), np.float32)
  blocks[0] = np.where((owner == 0)[..., None], fills, 0.0)  # process 0's first device
  blocks[4] = np.where((owner == 1)[..., None], fills, 0.0)  # process 1's first device
  no_slots = np.zeros((D, D, FD, 0), np.float32)  # SGD: zero-width optimizer slots
  slots = np.zeros((D, FD), np.int32)
  swap = jax.device_put(cache_lib.CacheSwap(slots, blocks, no_slots, slots),
                        mesh_lib.rows_on_devices(mesh))
  step = jax.jit(jax.shard_map(
      process_cache.route_fills_and_gather_evictions(_echo_step), mesh=mesh,
      in_specs=(P(), on, on), out_specs=(P(), P(), P()), check_vma=False))
  state, metrics, evicted = step(np.float32(1.0), np.ones((D,), np.float32), swap)
  chex.assert_trees_all_close(np.asarray(evicted.values), fills, rtol=0, atol=0)
  assert evicted.opt_slots.shape == (D, FD, 0)
  assert evicted.values.sharding.is_fully_replicated
  assert float(state) == 1.0 and float(metrics["n"]) == 1.0  # device 0's local batch


def test_replicated_copy_holds_every_row_on_every_device():
  mesh = mesh_lib.make_mesh(D)
  values = np.arange(D * 4 * W, dtype=np.float32).reshape(D * 4, W)
  table = jax.device_put(device_table.TableState(values, values[:, :1]),
                         mesh_lib.rows_on_devices(mesh))
  rep = mesh_lib.replicated(mesh)
  copy = process_cache.replicated_copy(table, device_table.TableState(rep, rep))
  assert copy.values.sharding.is_fully_replicated
  chex.assert_trees_all_equal(jax.device_get(copy), jax.device_get(table))
