"""One flag per table row, stored as bits: the memory-mapped host table's `written` flags.

A `[V]` bool array costs a byte per row, so on a sparse table each row written far from
the others lands on a fresh 4 KiB page of the flags file (4,096 rows a page), and a read
of a never-touched page faults as well. `BitFlags` keeps eight rows per byte (32,768 rows
a page) behind the part of the bool array's interface the host table uses:

  flags[ids]          [N] bool, ids an int array (any order, repeats allowed)
  flags[lo:hi]        [hi - lo] bool (a slice with step 1)
  flags[ids] = True   sets flags (repeats allowed); only True can be stored
  flags.count()       the number of set flags
  flags.flush()       flushes a memory-mapped store

Bit `r & 7` of byte `r >> 3` is row r's flag (numpy's `bitorder='little'`); the bits past
row V - 1 in the last byte stay clear.
"""

from __future__ import annotations

import numpy as np

_COUNT_BYTES = 1 << 24  # count() reads the store in blocks (bounded memory on a huge table)


def num_bytes(num_rows: int) -> int:
  """Bytes that hold `num_rows` flags."""
  return (int(num_rows) + 7) >> 3


class BitFlags:
  """`num_rows` flags over a uint8 store of `num_bytes(num_rows)` bytes (RAM or a memory map).

  Args:
    store: [num_bytes(num_rows)] uint8, used, not copied (zeros: no flag set).
    num_rows: V, the number of flags.
  """

  def __init__(self, store: np.ndarray, num_rows: int):
    if store.dtype != np.uint8 or store.shape != (num_bytes(num_rows),):
      raise ValueError(f"BitFlags: the store must be [{num_bytes(num_rows)}] uint8 for "
                       f"{num_rows} rows, got {store.shape} {store.dtype}")
    self.store, self.size = store, int(num_rows)

  @property
  def nbytes(self) -> int:
    """Bytes of the store."""
    return int(self.store.nbytes)

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, key) -> np.ndarray:
    if isinstance(key, slice):
      lo, hi, step = key.indices(self.size)
      if step != 1:
        raise ValueError(f"BitFlags: slices must have step 1, got {step}")
      hi = max(hi, lo)
      bits = np.unpackbits(self.store[lo >> 3:(hi + 7) >> 3], bitorder="little")
      return bits[lo & 7:(lo & 7) + hi - lo].view(np.bool_)
    ids = np.asarray(key)
    shift = (ids & 7).astype(np.uint8)
    return ((self.store[ids >> 3] >> shift) & np.uint8(1)).view(np.bool_)

  def __setitem__(self, key, value) -> None:
    if value is not True and not (isinstance(value, np.bool_) and value):
      raise ValueError(f"BitFlags: only True can be stored, got {value!r}")
    ids = np.asarray(key)
    np.bitwise_or.at(self.store, ids >> 3, np.left_shift(np.uint8(1), (ids & 7).astype(np.uint8)))

  def count(self) -> int:
    """The number of set flags."""
    return sum(int(np.bitwise_count(self.store[i:i + _COUNT_BYTES]).sum(dtype=np.int64))
               for i in range(0, self.store.size, _COUNT_BYTES))

  def flush(self) -> None:
    """Flushes a memory-mapped store to its file (nothing for a RAM store)."""
    if isinstance(self.store, np.memmap):
      self.store.flush()
