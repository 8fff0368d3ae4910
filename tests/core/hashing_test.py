"""SplitMix64 against the reference finaliser (Steele et al. 2014; Vigna's splitmix64.c)."""

import warnings

import numpy as np

from sfjax.core import hashing

_MASK = (1 << 64) - 1


def _reference(x: int) -> int:
  """The standard SplitMix64 step on Python ints: add the golden gamma, then mix."""
  z = (x + 0x9E3779B97F4A7C15) & _MASK
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
  return z ^ (z >> 31)


def test_known_values():
  # The SplitMix64 generator seeded with 0 first outputs 0xE220A8397B1DCDAF, then
  # 0x6E789E6AA1B965F4 (state advanced by one golden gamma).
  assert int(hashing.splitmix64(np.uint64(0))) == 0xE220A8397B1DCDAF == _reference(0)
  assert int(hashing.splitmix64(hashing.GOLDEN)) == 0x6E789E6AA1B965F4 == _reference(0x9E3779B97F4A7C15)
  # Seeded with 1234567, the generator's first output (a widely quoted test vector).
  assert int(hashing.splitmix64(np.uint64(1234567))) == 6457827717110365317


def test_matches_reference_near_the_wrap():
  xs = [1, 2, 12345, 2**63 - 1, 2**63, _MASK - 0x9E3779B97F4A7C15, _MASK]
  got = hashing.splitmix64(np.array(xs, np.uint64))
  assert got.dtype == np.uint64
  assert [int(v) for v in got] == [_reference(x) for x in xs]


def test_vectorised_equals_elementwise_and_keeps_shape():
  xs = np.arange(24, dtype=np.uint64).reshape(2, 3, 4) * np.uint64(0x1000_0000_0001)
  got = hashing.splitmix64(xs)
  assert got.shape == (2, 3, 4)
  np.testing.assert_array_equal(got.ravel(), [hashing.splitmix64(x) for x in xs.ravel()])
  # int64 input (e.g. row ids) is reinterpreted as uint64 values.
  np.testing.assert_array_equal(hashing.splitmix64(np.arange(5, dtype=np.int64)),
                                hashing.splitmix64(np.arange(5, dtype=np.uint64)))


def test_wraps_without_overflow_warnings():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    with np.errstate(all="raise"):  # the function's own errstate must suppress the overflow
      out = hashing.splitmix64(np.array([_MASK, _MASK - 1], np.uint64))
  assert [int(v) for v in out] == [_reference(_MASK), _reference(_MASK - 1)]


def test_in_place_form_overwrites_its_array_with_the_hash():
  xs = np.array([0, 1, 2**63, _MASK], np.uint64)
  z = xs.copy()
  hashing.splitmix64_in_place(z)
  assert [int(v) for v in z] == [_reference(int(x)) for x in xs]
  scratch = np.empty_like(z)
  z2 = xs.reshape(2, 2).copy()
  hashing.splitmix64_in_place(z2, scratch.reshape(2, 2))
  np.testing.assert_array_equal(z2.ravel(), z)
  assert xs.tolist() == [0, 1, 2**63, _MASK]  # splitmix64 itself never touches its input
  np.testing.assert_array_equal(hashing.splitmix64(xs), z)
