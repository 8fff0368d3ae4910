"""SplitMix64: the one integer hash of sfjax (feature hashing, planted data, row init)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

M1 = np.uint64(0xBF58476D1CE4E5B9)  # SplitMix64's two multipliers
M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: npt.ArrayLike) -> np.ndarray:
  """SplitMix64 finaliser, vectorised over uint64 values (wraps mod 2**64).

  Args:
    x: [...] values taken as uint64 (an array, or a scalar: then a numpy scalar comes back).
  """
  with np.errstate(over="ignore"):
    z = np.asarray(x, dtype=np.uint64) + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))
