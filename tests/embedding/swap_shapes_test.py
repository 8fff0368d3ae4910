"""Tests for sfjax.embedding.swap_shapes: the static lengths of a cache step's swap buffers."""

from sfjax.embedding import swap_shapes


def test_swap_buckets_are_eighths_of_the_capacity_and_cover_every_count():
  assert swap_shapes.swap_buckets(45_056) == (
      1536, 2816, 5632, 11264, 16896, 22528, 28160, 33792, 39424, 45056)
  assert swap_shapes.swap_buckets(100, multiple=8) == (8, 16, 32, 40, 56, 64, 80, 88, 100)
  buckets = swap_shapes.swap_buckets(10_000)
  for count in (0, 1, 255, 256, 257, 2500, 9999, 10_000):
    size = swap_shapes.bucket_for(count, buckets)
    assert size >= count and size in buckets
    smaller = [b for b in buckets if b < size]
    assert not smaller or smaller[-1] < count  # the smallest bucket that holds the count


def test_owner_buckets_grow_geometrically_up_to_the_capacity():
  buckets = swap_shapes.owner_buckets(13312, 8)
  assert buckets[0] == 16 and buckets[-1] == 13312
  assert all(b % 16 == 0 for b in buckets[:-1]) and list(buckets) == sorted(set(buckets))
  for small, big in zip(buckets[:-2], buckets[1:-1], strict=True):
    assert big <= small * 1.125 + 16  # padding at most 12.5% plus one multiple
  assert swap_shapes.owner_buckets(100, 1) == (100,)  # multiple 128 > capacity
  assert swap_shapes.owner_buckets(300, 2) == (64, 128, 192, 256, 300)
