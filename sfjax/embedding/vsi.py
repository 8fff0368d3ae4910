"""Virtual Sparse Ids (VSI): host-side deduplication of a batch's embedding ids.

ScaleFreeCTR's Data-Loader renumbers a batch's ids densely so that only unique
rows travel host->device and device<->device:

  uniq[U] = sorted unique global row ids,  vids[B, F] in [0, U) with uniq[vids] == ids

`U` varies per batch, so `uniq` is padded up to a fixed `capacity` (the jitted
step never recompiles). Raw ids stay int64 on the host (DESIGN.md §6.6); only
int32 `vids` (and int32 rows/slots derived from `uniq`) ever reach the device.

Ids enter here, so here they are checked (issue #25, Why 4): a local id outside
its field's rows would otherwise read and train another field's row (-7 lands in
the previous field, `rows_f` in the next) or, past the table, be dropped by the
device table's out-of-range gathers and scatters. `global_row_ids` raises an
`IdRangeError` naming the batch row and the field instead; the check is one
vectorised pass (`data.validate`), cheap beside the sort of `dedup_ids`.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np

from sfjax.core import feature_layout
from sfjax.core.types import DeviceBatch
from sfjax.data import types, validate


class IdRangeError(ValueError):
  """A batch holds an id outside its field's rows; names the batch row and the field.

  Attributes:
    row: the example's index in the batch.
    field: the field's index (column of `Batch.ids`).
    value: the bad id.
    num_rows: the field's rows (the id must lie in [0, num_rows)); None: unbounded
      (the last field when the table size is not given).
  """

  def __init__(self, row: int, field: int, value: int, num_rows: int | None):
    self.row, self.field, self.value, self.num_rows = row, field, value, num_rows
    bound = f"[0, {num_rows})" if num_rows is not None else ">= 0"
    super().__init__(f"batch row {row}, field {field}: id {value} outside the field's rows "
                     f"{bound} (the data set's ids do not fit its spec)")


class VirtualIds(NamedTuple):
  """A deduplicated batch.

  Attributes:
    uniq: [capacity] int64 unique global row ids; entries >= num_unique hold `pad_id`.
    vids: [B, S] int32 virtual ids into `uniq`; padding ids point at entry num_unique.
    num_unique: U, the number of real entries of `uniq`.
    has_padding: some vids point at the padding entry num_unique (which must exist).
  """

  uniq: np.ndarray
  vids: np.ndarray
  num_unique: int
  has_padding: bool = False


def field_rows(field_offsets: np.ndarray, num_rows: int | None) -> np.ndarray:
  """[F] rows of each field, from the field starts and the table size V.

  Args:
    field_offsets: [F] start of each field in the concatenated table.
    num_rows: V; None leaves the last field unbounded (int64 max).
  """
  offsets = np.asarray(field_offsets, np.int64)
  end = np.iinfo(np.int64).max if num_rows is None else int(num_rows)
  return np.diff(np.append(offsets, end))


def global_row_ids(local_ids: np.ndarray, field_offsets: np.ndarray,
                   num_rows: int | None = None, *, column_rows: np.ndarray | None = None,
                   allow_padding: bool = False) -> np.ndarray:
  """[B, S] per-column rows -> [B, S] int64 rows of the concatenated table.

  Args:
    local_ids: [B, S] ids local to each column's table (int32 or int64; others are
      made int64).
    field_offsets: [S] start of each column's table in the concatenated table.
    num_rows: V, the table size, which bounds the last field; None: the last
      field's ids are only checked to be >= 0.
    column_rows: [S] rows of each column's table; None: from the offsets (ascending,
      one table per column). A feature layout passes `DatasetSpec.column_rows`
      (shared tables repeat an offset).
    allow_padding: the padding id -1 may appear (bags, sequences); it stays -1.

  Raises:
    IdRangeError: an id lies outside its field's rows (the first one, in row-major order).
  """
  ids = np.asarray(local_ids)
  if ids.dtype not in (np.int32, np.int64):
    ids = ids.astype(np.int64)
  # int32 ids (as preprocessed shards store them) are checked as they are and widened by
  # the offsets' sum: no int64 copy of the batch first.
  rows = field_rows(field_offsets, num_rows) if column_rows is None else np.asarray(
      column_rows, np.int64)
  pad = (ids == -1) if allow_padding else None
  checked = ids if pad is None else np.where(pad, 0, ids)
  bad = validate.first_bad_id(checked, rows)
  if bad is not None:
    unbounded = column_rows is None and num_rows is None and bad.column == rows.shape[0] - 1
    raise IdRangeError(bad.row, bad.column, int(bad.value),
                       None if unbounded else int(rows[bad.column]))
  out = ids + np.asarray(field_offsets, np.int64)[None, :]
  return out if pad is None else np.where(pad, -1, out)


# The marker pass (`unique_inverse`) runs over windows of at most this many rows (an 84 MB
# scratch per thread: a larger table's ids are grouped by window first), while the table
# has at most this many rows per id of the batch (beyond it, scanning the flags costs more
# than sorting the ids).
DENSE_MAX_ROWS = 1 << 24
DENSE_ROWS_PER_ID = 64
# Past DENSE_MAX_ROWS rows the windowed pass (`_windowed_marker_pass`) wins up to at least
# this many rows per id (2-core AMD EPYC, 2026-12-07, Zipf ids, medians against `np.unique`:
# 235 rows per id 19.0 ms against 32.7; 500: 12.0 / 13.1; 667 (150k ids): 9.5 / 9.1; 939
# (106k ids): 10.3 / 7.9; 2,348: 63.0 / 31.9; with 1.2-1.7M ids it still wins at 587-833).
WINDOWED_ROWS_PER_ID = 512


class _Scratch(threading.local):
  """Per-thread marker flags `[V rounded up to 8] bool` (all False between calls) and
  positions `[V] int32`."""
  seen: np.ndarray | None = None
  pos: np.ndarray | None = None


_SCRATCH = _Scratch()


def _scratch(num_rows: int) -> tuple[np.ndarray, np.ndarray]:
  if _SCRATCH.pos is None or _SCRATCH.pos.shape[0] != num_rows:
    # The flags as whole 8-byte words (`_marked`), the tail past V always False.
    _SCRATCH.seen = np.zeros(-(-num_rows // 8) * 8, bool)
    _SCRATCH.pos = np.empty(num_rows, np.int32)
  return _SCRATCH.seen, _SCRATCH.pos  # type: ignore[return-value]


def _marked(seen: np.ndarray) -> np.ndarray:
  """The ascending int64 indices of the True flags of `seen` (bool, length a multiple of 8).

  `np.flatnonzero(seen)`, faster when few are set: the flags are scanned 8 at a time as
  uint64 words, and only the non-zero words' bytes are searched (0.6 of the time for a
  batch's ~42k ids among 2.6M rows; the result is identical).
  """
  words = seen.view(np.uint64)
  hot = np.flatnonzero(words != 0)
  at = np.flatnonzero(words[hot].view(np.bool_))  # byte j of hot word i at 8 i + j
  return hot[at >> 3] * 8 + (at & 7)


def _marker_pass(flat: np.ndarray, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
  """`unique_inverse` of `[N]` int64 ids in `[0, num_rows)` by flags over a scratch of
  `num_rows` rows (inverse int32); an id >= num_rows raises IndexError, leaving no flag."""
  seen, pos = _scratch(int(num_rows))
  try:
    seen[flat] = True
  except IndexError:
    seen[:] = False  # an id past the table may have left flags behind
    raise
  uniq = _marked(seen)
  seen[uniq] = False  # the flags are all False again for the next call
  if uniq.size and uniq[-1] >= num_rows:  # inside the scratch's rounding to 8 flags
    raise IndexError(f"index {int(uniq[-1])} is out of bounds for axis 0 with size {num_rows}")
  pos[uniq] = np.arange(uniq.shape[0], dtype=np.int32)
  return uniq, pos[flat]


def _windowed_marker_pass(flat: np.ndarray, num_rows: int,
                          window: int) -> tuple[np.ndarray, np.ndarray]:
  """`unique_inverse` of `[N]` ids of a table larger than one marker window: the ids are
  grouped by window `id // window` (a stable radix sort of the window numbers), each
  group's ids deduplicated by `_marker_pass` over one `window`-row scratch, the groups'
  unique ids concatenated in window order (so sorted) and each id's inverse offset by the
  unique ids of the windows before its own.

  Measured (2-core AMD EPYC, 2026-12-07, three runs minutes apart): 65,536 x 26 Zipf ids
  over 1e8 rows, 60-69 ms against 189-307 ms for `np.unique` (identical results).

  Raises:
    IndexError: an id < 0 or >= num_rows (the marker pass's message).
  """
  low, high = int(flat.min()), int(flat.max())
  if low < 0 or high >= num_rows:
    bad = low if low < 0 else high
    raise IndexError(f"index {bad} is out of bounds for axis 0 with size {num_rows}")
  windows = -(-num_rows // window)
  number = flat // window
  key = number.astype(np.uint8 if windows <= 1 << 8 else np.uint16 if windows <= 1 << 16
                      else np.int64)  # narrow keys: numpy sorts them by radix
  order = np.argsort(key, kind="stable")
  counts = np.bincount(key)
  grouped = flat[order]
  inverse = np.empty(flat.shape[0], np.int32)
  pieces, start, before = [], 0, 0
  for w in np.flatnonzero(counts).tolist():
    stop = start + int(counts[w])
    uniq, inv = _marker_pass(grouped[start:stop] - w * window, window)
    inverse[order[start:stop]] = inv + before
    pieces.append(uniq + w * window)
    before += uniq.shape[0]
    start = stop
  return np.concatenate(pieces), inverse


def unique_inverse(ids: np.ndarray, num_rows: int | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """`np.unique(ids, return_inverse=True)` for `[N]` ids in `[0, num_rows)`, faster.

  With `num_rows` (V) given and small beside N (`DENSE_ROWS_PER_ID` rows per id at most),
  a marker pass over a per-thread scratch replaces the sort (a table past `DENSE_MAX_ROWS`
  rows, up to `WINDOWED_ROWS_PER_ID` rows per id: one pass per window of `DENSE_MAX_ROWS`
  rows, `_windowed_marker_pass`); the result is identical (the sorted unique ids, and each
  id's index into them).

  Returns:
    (uniq [U] int64 sorted, inverse [N] integer indices with uniq[inverse] == ids).

  Raises:
    IndexError: (marker pass) an id >= num_rows; ids must be >= 0 (a table past
      `DENSE_MAX_ROWS` rows checks both).
  """
  flat = np.asarray(ids, np.int64).reshape(-1)
  if num_rows is not None and flat.size:
    if num_rows <= min(DENSE_MAX_ROWS, DENSE_ROWS_PER_ID * flat.size):
      return _marker_pass(flat, int(num_rows))
    if DENSE_MAX_ROWS < num_rows <= WINDOWED_ROWS_PER_ID * flat.size:
      return _windowed_marker_pass(flat, int(num_rows), DENSE_MAX_ROWS)
  return np.unique(flat, return_inverse=True)


def dedup_ids(ids: np.ndarray, capacity: int, pad_id: int,
              num_rows: int | None = None) -> VirtualIds:
  """Deduplicates `ids` and pads the unique set to `capacity`.

  Padding ids (-1, the unused columns of bags and sequences) get no unique entry:
  their virtual id is U, the first padding entry of `uniq` (which holds `pad_id`:
  gathers read zeros, scatters drop it), so they need one spare entry.

  Args:
    ids: [B, S] int64 global row ids; -1 = padding.
    capacity: fixed length of `uniq` (static shape of the device step).
    pad_id: value written into the padding entries of `uniq` (e.g. the table size,
      an out-of-range row that device gathers fill and scatters drop).
    num_rows: V, the table size, when known: every id is < V, which lets a small
      table use the marker pass (`unique_inverse`; the same result).

  Returns:
    VirtualIds.

  Raises:
    ValueError: if the batch has more unique ids than `capacity` (less the spare entry).
  """
  real = ids >= 0
  has_padding = not bool(real.all())
  uniq, inverse = unique_inverse(ids[real] if has_padding else ids.reshape(-1), num_rows)
  n = int(uniq.shape[0])
  if n + has_padding > capacity:
    raise ValueError(
        f"batch has {n} unique ids{' + 1 padding entry' if has_padding else ''} but "
        f"embedding.unique_capacity is {capacity}; raise embedding.unique_capacity "
        "(0 means batch_size * id columns, + 1 with bags)")
  padded = np.full((capacity,), pad_id, dtype=np.int64)
  padded[:n] = uniq
  if has_padding:
    vids = np.full(ids.shape, n, np.int32)
    vids[real] = inverse
  else:
    vids = inverse.reshape(ids.shape).astype(np.int32, copy=False)
  return VirtualIds(padded, vids, n, has_padding)


def unique_capacity(batch_size: int, num_columns: int, has_padding: bool) -> int:
  """The default padded unique-set size: every id distinct (+ the padding entry)."""
  return batch_size * num_columns + int(has_padding)


def prepare_batch(batch: types.Batch, field_offsets: np.ndarray, capacity: int,
                  num_rows: int, column_rows: np.ndarray | None = None,
                  table_starts: np.ndarray | None = None) -> tuple[DeviceBatch, int]:
  """Host side of an on-device-table step: VSI over the batch, ids -> int32 rows (numpy).

  Args:
    batch: host batch with per-column local ids (-1 padding allowed when it has weights).
    field_offsets: [S] start of each column's table in the concatenated table.
    capacity: padded size of the unique set.
    num_rows: V, the table size; also the padding row.
    column_rows: [S] rows of each column's table (a feature layout), else None.
    table_starts: [T] first row of each table when the row optimizer differs per table:
      the DeviceBatch then carries `row_tables`; None: it does not.

  Returns:
    (DeviceBatch of numpy arrays, number of unique ids).

  Raises:
    IdRangeError: an id lies outside its field's rows (never dropped or wrapped).
  """
  if num_rows >= 2**31:
    raise ValueError(f"table of {num_rows} rows does not fit int32 device indices; "
                     "use the cache backend, whose slots are int32")
  ids = global_row_ids(batch.ids, field_offsets, num_rows, column_rows=column_rows,
                       allow_padding=batch.weights is not None)
  virt = dedup_ids(ids, capacity, pad_id=num_rows, num_rows=num_rows)
  row_tables = (None if table_starts is None
                else feature_layout.row_tables(table_starts, virt.uniq))
  return DeviceBatch(virt.uniq.astype(np.int32), virt.vids, batch.dense, batch.labels,
                     batch.mask, batch.weights, row_tables), virt.num_unique
