"""The few static lengths a cache step's swap buffers are compiled for.

A jitted step compiles once per input shape, so the rows a step moves (fills, evictions,
a row-sharded cache's per-owner blocks) are padded to one of a few lengths, chosen by the
step's real count: `swap_buckets` for a cache's fills and evictions (eighths of the
capacity), `owner_buckets` for a row-sharded cache's per-device blocks (geometric), and
`bucket_for` picks the smallest length that holds a count.
"""

from __future__ import annotations

import numpy as np


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
