"""SplitMix64: the one integer hash of sfjax (feature hashing, planted data, row init)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: npt.ArrayLike) -> np.ndarray:
  """SplitMix64 finaliser, vectorised over uint64 values (wraps mod 2**64).

  Args:
    x: [...] values taken as uint64 (an array, or a scalar: then a numpy scalar comes back).
  """
  z = np.array(x, dtype=np.uint64)
  splitmix64_in_place(z)
  return z[()]


def splitmix64_in_place(z: np.ndarray, scratch: np.ndarray | None = None) -> None:
  """`z = splitmix64(z)` in place for a uint64 array `z` (no temporaries: a caller hashing
  large blocks keeps them in cache, `sfjax.embedding.initializers`).

  Args:
    z: [...] uint64, overwritten.
    scratch: an array of z's shape and dtype to use as working space; None: one is made.
  """
  scratch = np.empty_like(z) if scratch is None else scratch
  with np.errstate(over="ignore"):
    z += GOLDEN
    for shift, mult in ((30, _M1), (27, _M2)):
      np.right_shift(z, np.uint64(shift), out=scratch)
      z ^= scratch
      z *= mult
    np.right_shift(z, np.uint64(31), out=scratch)
    z ^= scratch
