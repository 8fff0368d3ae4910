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


def _swap_then_update(cache, swap, rows):
  """A cache step's table traffic: the swap, then a gather and an update of the batch's rows."""
  cache, evicted = cache_lib.swap_rows(cache, swap)
  taken = device_table.take_stored_rows(cache, rows)
  return device_table.scatter_rows(cache, rows, device_table.TableState(
      taken.values * 0.5, taken.opt_slots + 1.0)), evicted


def _copies_of(hlo: str, shape: str) -> int:
  return sum(1 for line in hlo.splitlines() if " copy(" in line and shape in line)


def test_donated_swap_updates_the_cache_in_place_without_copying_it():
  """XLA:CPU copied the whole cache twice per step to keep the victims readable; the swap's
  fill indices now depend on the read-out, so the donated cache is updated in place."""
  c, e, f = 4096, 5, 64
  cache = cache_lib.init_cache(c, e, 1)
  slots = jnp.arange(f, dtype=jnp.int32)
  swap = cache_lib.CacheSwap(slots, jnp.ones((f, e)), jnp.ones((f, 1)), slots)
  hlo = jax.jit(_swap_then_update, donate_argnums=0).lower(cache, swap, slots).compile().as_text()
  assert _copies_of(hlo, f"[{c},{e}]") == 0 and _copies_of(hlo, f"[{c},1]") == 0


def test_donated_swap_reads_each_victim_before_its_slot_is_refilled():
  # Victims hold NaN, inf and large values: the read-out must carry them unchanged, and the
  # dependency that orders it before the fills must not disturb the fill slots.
  values = np.array([[np.nan, 1.0], [np.inf, -np.inf], [3e38, -2.0], [0.5, 0.25]], np.float32)
  cache = device_table.TableState(jnp.array(values), jnp.array([[np.nan], [1.0], [2.0], [3.0]]))
  swap = cache_lib.CacheSwap(
      fill_slots=jnp.array([0, 1, 2, 4], jnp.int32), fill_values=jnp.full((4, 2), 7.0),
      fill_opt_slots=jnp.full((4, 1), 70.0), evict_slots=jnp.array([0, 1, 2, 4], jnp.int32))
  new, evicted = jax.jit(cache_lib.swap_rows, donate_argnums=0)(cache, swap)
  chex.assert_trees_all_equal(evicted.values, np.concatenate([values[:3],
                                                              np.zeros((1, 2), np.float32)]))
  np.testing.assert_array_equal(evicted.opt_slots[:3, 0], [np.nan, 1.0, 2.0])
  chex.assert_trees_all_equal(new, device_table.TableState(
      jnp.array([[7.0, 7.0], [7.0, 7.0], [7.0, 7.0], [0.5, 0.25]]),
      jnp.array([[70.0], [70.0], [70.0], [3.0]])))


def test_read_before_keeps_the_indices_whatever_the_reads_hold():
  idx = jnp.array([3, 0, 7], jnp.int32)
  for first in (np.nan, np.inf, -np.inf, -0.5, 0.75, 3e38, -1e-40):
    reads = (jnp.array([first, 2.0]), jnp.zeros((0, 3)), jnp.array([[first]], jnp.bfloat16))
    got = jax.jit(cache_lib.read_before)(idx, reads)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, [3, 0, 7])


def test_swap_buckets_are_eighths_of_the_capacity_and_cover_every_count():
  assert cache_lib.swap_buckets(45_056) == (
      1536, 2816, 5632, 11264, 16896, 22528, 28160, 33792, 39424, 45056)
  assert cache_lib.swap_buckets(100, multiple=8) == (8, 16, 32, 40, 56, 64, 80, 88, 100)
  buckets = cache_lib.swap_buckets(10_000)
  for count in (0, 1, 255, 256, 257, 2500, 9999, 10_000):
    size = cache_lib.bucket_for(count, buckets)
    assert size >= count and size in buckets
    smaller = [b for b in buckets if b < size]
    assert not smaller or smaller[-1] < count  # the smallest bucket that holds the count


def test_owner_buckets_grow_geometrically_up_to_the_capacity():
  buckets = cache_lib.owner_buckets(13312, 8)
  assert buckets[0] == 16 and buckets[-1] == 13312
  assert all(b % 16 == 0 for b in buckets[:-1]) and list(buckets) == sorted(set(buckets))
  for small, big in zip(buckets[:-2], buckets[1:-1], strict=True):
    assert big <= small * 1.125 + 16  # padding at most 12.5% plus one multiple
  assert cache_lib.owner_buckets(100, 1) == (100,)  # multiple 128 > capacity
  assert cache_lib.owner_buckets(300, 2) == (64, 128, 192, 256, 300)
