"""Deterministic, counter-based row initialisers (host-side numpy).

Row `r` of table `t` under `seed` always gets the same values, whatever order or
batch rows are created in. The on-device reference table and the lazily
initialised host table (MixCache backend) both call `init_rows`, so a row that
is first touched after a billion others still equals the reference.
"""

from __future__ import annotations

import numpy as np

from sfjax.core.hashing import GOLDEN as _GOLDEN
from sfjax.core.hashing import splitmix64


def _hash_uniform(seed: int, stream: int, keys: np.ndarray, width: int) -> np.ndarray:
  """Uniform [0, 1) float64 values, one row of `width` per key.

  Args:
    seed: run seed.
    stream: an independent stream id (e.g. a table id).
    keys: [N] non-negative integer keys (int64/uint64).
    width: values per key.

  Returns:
    [N, width] float64 in [0, 1), a pure function of (seed, stream, key, column).
  """
  keys = np.asarray(keys).astype(np.uint64).reshape(-1, 1)
  base = splitmix64(splitmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF)) ^ np.uint64(stream))
  with np.errstate(over="ignore"):
    cols = np.arange(width, dtype=np.uint64).reshape(1, -1)
    bits = splitmix64(splitmix64(keys ^ base) + cols * _GOLDEN)
  return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def init_rows(seed: int, table: int, rows: np.ndarray, width: int, stddev: float) -> np.ndarray:
  """Initial embedding rows: uniform with standard deviation `stddev`.

  Args:
    seed: run seed.
    table: table id (0 for the single concatenated table of the trainer).
    rows: [N] int64 row ids.
    width: embedding row width E.
    stddev: standard deviation of the uniform distribution (half-width = stddev*sqrt(3)).

  Returns:
    [N, width] float32.
  """
  u = _hash_uniform(seed, 0x5EED0000 + int(table), rows, width)
  return ((2.0 * u - 1.0) * (stddev * np.sqrt(3.0))).astype(np.float32)
