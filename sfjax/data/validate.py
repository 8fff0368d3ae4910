"""Value checks of example arrays: ids inside their field's rows, labels in {0, 1}, finite dense.

A CRC proves a file is the one that was written, not that what was written is
valid (issue #25, Why 4: a negative id lands in the previous field's rows, an id
past a field's rows in the next field's, a label of 7 trains to a negative loss).
The reader of stored examples (`shards.ShardSplit`, per block of a shard on its
first read) and the host side of the embedding lookup (`embedding.vsi`, per
batch) run these checks.

Each check is a vectorised pass (two for ids when fields differ in size) without a
per-example Python loop, and returns None when every value is valid; only on the
rare failure does one more pass find the FIRST bad value in row-major order, as a
`BadValue` a caller turns into an error naming its file (or batch), row and field.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_BLOCK_ROWS = 64  # rows reduced together by `_column_max`


class BadValue(NamedTuple):
  """The first invalid value of an array.

  Attributes:
    row: index of the example (0-based, within the array passed in).
    column: the field (ids) or dense column; 0 for labels.
    value: the offending value.
  """

  row: int
  column: int
  value: float


def _first(bad: np.ndarray, values: np.ndarray) -> BadValue:
  """The first True of `bad` ([N] or [N, C]) in row-major order, with its value."""
  flat = int(np.argmax(bad.reshape(-1)))
  columns = bad.shape[1] if bad.ndim == 2 else 1
  row, column = divmod(flat, columns)
  return BadValue(row, column, values.reshape(-1)[flat].item())


def first_bad_id(ids: np.ndarray, field_rows) -> BadValue | None:
  """The first id outside `[0, field_rows[f])` of its column f, or None.

  Args:
    ids: [N, F] signed integer ids local to each field.
    field_rows: [F] rows of each field (each <= the ids dtype's maximum + 1).

  Returns:
    None if every id is in range, else the first bad one.
  """
  ids = np.asarray(ids)
  if ids.size == 0:
    return None
  if ids.dtype.kind != "i":
    raise TypeError(f"ids must be signed integers, got {ids.dtype}")
  if ids.ndim != 2 or ids.shape[1] != len(field_rows):
    raise ValueError(f"ids of shape {ids.shape} do not have one column per field "
                     f"({len(field_rows)})")
  unsigned = ids.view(np.dtype(f"u{ids.dtype.itemsize}"))  # negatives become huge: one compare
  rows = np.asarray(field_rows, np.int64)
  if ids.dtype.itemsize < 8:
    rows = np.minimum(rows, np.iinfo(unsigned.dtype).max)
  limit = rows.astype(unsigned.dtype)
  if unsigned.max() < limit.min():  # one flat pass decides when every field has as many rows
    return None
  if (_column_max(unsigned) < limit).all():
    return None
  return _first(unsigned >= limit[None, :], ids)


def _column_max(values: np.ndarray) -> np.ndarray:
  """[N, F] -> [F] maximum of each column, reducing blocks of `_BLOCK_ROWS` rows at once.

  A plain `max(axis=0)` runs numpy's inner loop over only F values per row (~6x
  slower); viewing `_BLOCK_ROWS` rows as one row of `_BLOCK_ROWS * F` values keeps it long.
  """
  n, f = values.shape
  whole = n - n % _BLOCK_ROWS
  parts = [values[whole:].max(axis=0)] if n > whole else []
  if whole:
    blocks = values[:whole].reshape(whole // _BLOCK_ROWS, _BLOCK_ROWS * f)
    parts.append(blocks.max(axis=0).reshape(_BLOCK_ROWS, f).max(axis=0))
  return np.max(parts, axis=0)


def first_bad_label(labels: np.ndarray) -> BadValue | None:
  """The first label that is not exactly 0 or 1 (NaN included), or None.

  Args:
    labels: [N] float labels.
  """
  labels = np.asarray(labels)
  bad = (labels != 0) & (labels != 1)
  return _first(bad, labels) if bad.any() else None


def first_bad_dense(dense: np.ndarray) -> BadValue | None:
  """The first NaN or +-inf of `dense`, or None.

  Args:
    dense: [N, Nd] float dense features (Nd may be 0).
  """
  dense = np.asarray(dense)
  if dense.size == 0:
    return None
  bad = ~np.isfinite(dense)
  return _first(bad, dense) if bad.any() else None
