"""Device cache: empty init (optionally sharded) and the read-victims-then-write-fills swap."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.embedding import cache as cache_lib
from sfjax.embedding import device_table, row_dtype


def test_init_cache_is_zeros_of_the_right_shapes():
  cache = cache_lib.init_cache(5, 3, 2)
  chex.assert_shape([cache.values, cache.opt_slots], [(5, 3), (5, 2)])
  chex.assert_type([cache.values, cache.opt_slots], jnp.float32)
  chex.assert_trees_all_equal(cache, device_table.TableState(np.zeros((5, 3), np.float32),
                                                             np.zeros((5, 2), np.float32)))


def test_init_cache_replicated_over_eight_devices():
  assert jax.device_count() == 8
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  sharding = NamedSharding(mesh, P())
  cache = cache_lib.init_cache(4, 2, 0, sharding=sharding)
  for leaf in cache:
    assert leaf.sharding == sharding and len(leaf.sharding.device_set) == 8
    assert leaf.sharding.is_fully_replicated
  chex.assert_shape([cache.values, cache.opt_slots], [(4, 2), (4, 0)])
  chex.assert_trees_all_equal(np.asarray(cache.values), np.zeros((4, 2), np.float32))


def _cache(num_slots=4):
  # Slot s holds value row [s, s] and slot row [10 s].
  values = jnp.repeat(jnp.arange(num_slots, dtype=jnp.float32)[:, None], 2, axis=1)
  return device_table.TableState(values, 10.0 * jnp.arange(num_slots, dtype=jnp.float32)[:, None])


def test_swap_reads_victims_before_writing_fills():
  cache = _cache()  # C = 4; slot 4 is padding
  swap = cache_lib.CacheSwap(
      fill_slots=jnp.array([1, 3, 4], jnp.int32),  # slot 1 evicted AND refilled
      fill_values=jnp.array([[7.0, 7.0], [8.0, 8.0], [9.0, 9.0]]),
      fill_opt_slots=jnp.array([[70.0], [80.0], [90.0]]),
      evict_slots=jnp.array([1, 4, 4], jnp.int32))
  new, evicted = jax.jit(cache_lib.swap_rows)(cache, swap)
  # The victim is the OLD row of slot 1; padding reads zeros.
  chex.assert_trees_all_equal(evicted, device_table.TableState(
      jnp.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]), jnp.array([[10.0], [0.0], [0.0]])))
  # Slot 1 and 3 hold the fills; the fill aimed at padding slot 4 is dropped.
  chex.assert_trees_all_equal(new, device_table.TableState(
      jnp.array([[0.0, 0.0], [7.0, 7.0], [2.0, 2.0], [8.0, 8.0]]),
      jnp.array([[0.0], [70.0], [20.0], [80.0]])))


def test_all_padding_swap_is_a_no_op():
  cache = _cache()
  pad = jnp.full((2,), 4, jnp.int32)
  swap = cache_lib.CacheSwap(pad, jnp.ones((2, 2)), jnp.ones((2, 1)), pad)
  new, evicted = jax.jit(cache_lib.swap_rows)(cache, swap)
  chex.assert_trees_all_equal(new, cache)
  chex.assert_trees_all_equal(evicted, device_table.TableState(jnp.zeros((2, 2)), jnp.zeros((2, 1))))


def test_half_width_cache_moves_rows_as_stored():
  bf16 = jnp.bfloat16
  cache = cache_lib.init_cache(4, 2, 1, dtype=bf16)
  assert cache.values.dtype == jnp.uint16 and cache.opt_slots.dtype == jnp.float32  # bf16 bits
  swap = cache_lib.CacheSwap(jnp.array([2, 4], jnp.int32), jnp.array([[0.1, 0.2]] * 2, bf16),
                             jnp.ones((2, 1)), jnp.array([2, 4], jnp.int32))
  new, evicted = jax.jit(cache_lib.swap_rows)(cache, swap)
  new, evicted2 = jax.jit(cache_lib.swap_rows)(new, swap)
  assert evicted.values.dtype == jnp.uint16  # read out half-width (d2h bytes halved)
  np.testing.assert_array_equal(row_dtype.from_storage(evicted2.values)[0],
                                np.asarray(swap.fill_values[0]))
  assert new.values.dtype == jnp.uint16
