"""BitFlags: eight row flags a byte, read and set as a [V] bool array would be."""

import numpy as np
import pytest

from sfjax.embedding import bit_flags
from sfjax.embedding.bit_flags import BitFlags


def _flags(num_rows: int) -> BitFlags:
  return BitFlags(np.zeros(bit_flags.num_bytes(num_rows), np.uint8), num_rows)


def test_num_bytes():
  assert [bit_flags.num_bytes(v) for v in (0, 1, 7, 8, 9, 16, 17)] == [0, 1, 1, 1, 2, 2, 3]


@pytest.mark.parametrize("num_rows", [1, 8, 19, 64, 1001])
def test_reads_and_sets_as_a_bool_array(num_rows):
  rng = np.random.default_rng(num_rows)
  flags, reference = _flags(num_rows), np.zeros(num_rows, np.bool_)
  for _ in range(4):
    ids = rng.integers(0, num_rows, rng.integers(1, 2 * num_rows + 1))  # repeats, any order
    flags[ids] = True
    reference[ids] = True
    probe = rng.integers(0, num_rows, 3 * num_rows)
    got = flags[probe]
    assert got.dtype == np.bool_ and got.shape == probe.shape
    np.testing.assert_array_equal(got, reference[probe])
    np.testing.assert_array_equal(flags[0:num_rows], reference)
    assert flags.count() == np.count_nonzero(reference)
  # Bit r & 7 of byte r >> 3, numpy's little bit order; the last byte's spare bits clear.
  np.testing.assert_array_equal(np.unpackbits(flags.store, bitorder="little")[:num_rows], reference)
  assert not np.unpackbits(flags.store, bitorder="little")[num_rows:].any()


def test_every_slice_equals_the_bool_arrays():
  rng = np.random.default_rng(0)
  reference = rng.random(19) < 0.5
  flags = _flags(19)
  flags[np.flatnonzero(reference)] = True
  for lo in range(-20, 22):
    for hi in range(-20, 22):
      np.testing.assert_array_equal(flags[lo:hi], reference[lo:hi], err_msg=f"[{lo}:{hi}]")
  np.testing.assert_array_equal(flags[:], reference)
  np.testing.assert_array_equal(flags[5:], reference[5:])
  with pytest.raises(ValueError, match="BitFlags: slices must have step 1, got 2"):
    flags[0:10:2]  # pylint: disable=pointless-statement


def test_the_exact_bit_of_a_row():
  flags = _flags(20)
  flags[np.array([0, 9, 19])] = np.True_
  assert flags.store.tolist() == [0b1, 0b10, 0b1000]
  assert flags[np.array([0, 1, 8, 9, 10, 18, 19])].tolist() == [True, False, False, True, False,
                                                                  False, True]
  flags[np.array([], np.int64)] = True
  assert flags.store.tolist() == [0b1, 0b10, 0b1000] and flags.count() == 3


@pytest.mark.parametrize("value", [False, 0, 1, np.False_, np.array([True])])
def test_only_true_is_stored(value):
  flags = _flags(8)
  with pytest.raises(ValueError, match="BitFlags: only True can be stored, got"):
    flags[np.array([3])] = value
  assert flags.count() == 0


def test_count_reads_the_store_in_blocks(monkeypatch):
  flags = _flags(1000)
  flags[np.array([0, 7, 8, 499, 500, 998, 999])] = True
  monkeypatch.setattr(bit_flags, "_COUNT_BYTES", 3)
  assert flags.count() == 7


def test_the_store_is_checked():
  with pytest.raises(ValueError, match=r"BitFlags: the store must be \[2\] uint8 for 9 rows, "
                     r"got \(2,\) bool"):
    BitFlags(np.zeros(2, np.bool_), 9)
  with pytest.raises(ValueError, match=r"got \(1,\) uint8"):
    BitFlags(np.zeros(1, np.uint8), 9)
  flags = BitFlags(np.zeros(2, np.uint8), 9)
  assert (flags.nbytes, len(flags), flags.size) == (2, 9, 9)


def test_flush_writes_a_memory_mapped_store(tmp_path):
  path = str(tmp_path / "bits.npy")
  flags = BitFlags(np.lib.format.open_memmap(path, "w+", np.uint8, (3,)), 20)
  flags[np.array([2, 17])] = True
  flags.flush()
  assert np.load(path).tolist() == [0b100, 0, 0b10]
  _flags(8).flush()  # a RAM store: nothing to do
