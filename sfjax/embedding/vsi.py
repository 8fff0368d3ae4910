"""Virtual Sparse Ids (VSI): host-side deduplication of a batch's embedding ids.

ScaleFreeCTR's Data-Loader renumbers a batch's ids densely so that only unique
rows travel host->device and device<->device:

  uniq[U] = sorted unique global row ids,  vids[B, F] in [0, U) with uniq[vids] == ids

`U` varies per batch, so `uniq` is padded up to a fixed `capacity` (the jitted
step never recompiles). Raw ids stay int64 on the host (DESIGN.md §6.6); only
int32 `vids` (and int32 rows/slots derived from `uniq`) ever reach the device.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sfjax.core.types import DeviceBatch
from sfjax.data import types


class VirtualIds(NamedTuple):
  """A deduplicated batch.

  Attributes:
    uniq: [capacity] int64 unique global row ids; entries >= num_unique hold `pad_id`.
    vids: [B, F] int32 virtual ids into `uniq`.
    num_unique: U, the number of real entries of `uniq`.
  """

  uniq: np.ndarray
  vids: np.ndarray
  num_unique: int


def global_row_ids(local_ids: np.ndarray, field_offsets: np.ndarray) -> np.ndarray:
  """[B, F] per-field rows -> [B, F] int64 rows of the concatenated table."""
  return np.asarray(local_ids, np.int64) + np.asarray(field_offsets, np.int64)[None, :]


def dedup_ids(ids: np.ndarray, capacity: int, pad_id: int) -> VirtualIds:
  """Deduplicates `ids` and pads the unique set to `capacity`.

  Args:
    ids: [B, F] int64 global row ids.
    capacity: fixed length of `uniq` (static shape of the device step).
    pad_id: value written into the padding entries of `uniq` (e.g. the table size,
      an out-of-range row that device gathers fill and scatters drop).

  Returns:
    VirtualIds.

  Raises:
    ValueError: if the batch has more unique ids than `capacity`.
  """
  uniq, inverse = np.unique(ids, return_inverse=True)
  n = int(uniq.shape[0])
  if n > capacity:
    raise ValueError(
        f"batch has {n} unique ids but embedding.unique_capacity is {capacity}; "
        "raise embedding.unique_capacity (0 means batch_size * num_fields)")
  padded = np.full((capacity,), pad_id, dtype=np.int64)
  padded[:n] = uniq
  return VirtualIds(padded, inverse.reshape(ids.shape).astype(np.int32), n)


def prepare_batch(batch: types.Batch, field_offsets: np.ndarray, capacity: int,
                  num_rows: int) -> tuple[DeviceBatch, int]:
  """Host side of an on-device-table step: VSI over the batch, ids -> int32 rows (numpy).

  Args:
    batch: host batch with per-field local ids.
    field_offsets: [F] start of each field in the concatenated table.
    capacity: padded size of the unique set.
    num_rows: V, the table size; also the padding row.

  Returns:
    (DeviceBatch of numpy arrays, number of unique ids).
  """
  if num_rows >= 2**31:
    raise ValueError(f"table of {num_rows} rows does not fit int32 device indices; "
                     "use the cache backend, whose slots are int32")
  ids = global_row_ids(batch.ids, field_offsets)
  virt = dedup_ids(ids, capacity, pad_id=num_rows)
  return DeviceBatch(virt.uniq.astype(np.int32), virt.vids, batch.dense, batch.labels,
                     batch.mask), virt.num_unique
