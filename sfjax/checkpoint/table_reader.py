"""Reading a host-table checkpoint (`sfjax.checkpoint.table_format`): verify, read, restore.

Every file is checked against its manifest entry (size and CRC-32, `sfjax.core.digest`)
as it is read, one file in memory at a time: `verify_table` checks them all without
loading rows, `TableReader` reads the table chunk by chunk (the base with every delta
applied), and `load_table` restores it into a fresh `HostTable`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.checkpoint.read_retry import MISSING, read_retrying
from sfjax.checkpoint.table_format import (
  CHUNK_ROWS,
  MANIFEST_FILE,
  RowCodec,
  check_compatible,
  manifest_codec,
  read_manifest,
)
from sfjax.core import digest
from sfjax.embedding import host_table as host_table_lib


def _entries(manifest: dict[str, Any]) -> Iterator[dict[str, Any]]:
  """Every file entry of a manifest: chunks, then each delta's ids and rows."""
  yield from manifest["chunks"].values()
  for d in manifest["deltas"]:
    yield d["ids"]
    yield d["rows"]


def verify_table(directory: str) -> int:
  """Checks the manifest and every chunk and delta file's size and CRC-32 without loading rows.

  Reads each file once (one file in memory at a time). Returns the number of files.

  Raises:
    ValueError: naming the first unreadable manifest or missing, truncated or altered file.
  """
  manifest = read_manifest(directory)
  count = 0
  for entry in _entries(manifest):
    _read_file(directory, entry)
    count += 1
  return count


def _read_file(directory: str, entry: dict[str, Any]) -> bytes:
  """A checkpoint file's bytes, checked against its manifest entry (size and CRC-32).

  Raises:
    ValueError: naming the file, when it is missing, truncated or altered.
    CheckpointReadError: it stayed unreadable through every retry (`read_retry`).
  """
  path = os.path.join(directory, entry["file"])
  try:
    data = read_retrying(lambda: _read_bytes(path), path)
  except MISSING as err:
    raise ValueError(f"{path}: unreadable table checkpoint file: {err}") from err
  why = digest.mismatch(digest.bytes_digest(data), entry)
  if why:
    raise ValueError(f"{path}: table checkpoint file is corrupt ({why})")
  return data


def _read_bytes(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def _load_npy(directory: str, entry: dict[str, Any], shape: tuple[int, ...], dtype) -> np.ndarray:
  """A verified `.npy` file of the expected shape and dtype."""
  array = np.load(io.BytesIO(_read_file(directory, entry)))
  if array.shape != shape or array.dtype != np.dtype(dtype):
    raise ValueError(f"{os.path.join(directory, entry['file'])}: holds {array.shape} {array.dtype},"
                     f" expected {shape} {np.dtype(dtype)}")
  return array


class TableReader:
  """Reads a table checkpoint chunk by chunk, the base with every delta applied.

  Every delta's ids are loaded (8 bytes per delta row) and checked when the reader is
  made; rows are read per chunk. Files are verified (size, CRC-32) as they are read.

  Args:
    directory: the table checkpoint directory.
  """

  def __init__(self, directory: str):
    self.directory = directory
    self.manifest = read_manifest(directory)
    m = self.manifest
    self.num_rows, self.width, self.slot_width = m["num_rows"], m["width"], m["slot_width"]
    self._delta_ids = []
    for d in m["deltas"]:
      ids = _load_npy(directory, d["ids"], (d["count"],), np.int64)
      if ids.size and (ids[0] < 0 or ids[-1] >= self.num_rows or np.any(np.diff(ids) <= 0)):
        raise ValueError(f"{os.path.join(directory, d['ids']['file'])}: row ids are not sorted, "
                         f"distinct and in [0, {self.num_rows})")
      self._delta_ids.append(ids)
    self._delta_rows: list[np.ndarray | None] = [None] * len(m["deltas"])
    self._codec: RowCodec | None = None  # made for the first packed entry
    touched = {int(k) for k in m["chunks"]}
    for ids in self._delta_ids:
      touched.update(np.unique(ids // CHUNK_ROWS).tolist())
    self.chunks = tuple(sorted(touched))  # chunks holding any stored row

  def delta_chunks(self) -> np.ndarray:
    """[K] int64 chunks that some delta changes (they differ from the base)."""
    if not self._delta_ids:
      return np.zeros((0,), np.int64)
    return np.unique(np.concatenate([ids // CHUNK_ROWS for ids in self._delta_ids]))

  def _row_codec(self) -> RowCodec:
    if self._codec is None:
      self._codec = manifest_codec(self.manifest, os.path.join(self.directory, MANIFEST_FILE))
    return self._codec

  def _rows(self, i: int) -> np.ndarray:
    rows = self._delta_rows[i]
    if rows is None:
      d = self.manifest["deltas"][i]
      if d["rows"].get("packed"):  # at each table's own width
        codec, ids = self._row_codec(), self._delta_ids[i]
        flat = _load_npy(self.directory, d["rows"], (codec.size(ids),), np.float32)
        values, slots = codec.decode(ids, flat, os.path.join(self.directory, d["rows"]["file"]))
        rows = np.concatenate([values, slots], axis=1)
      else:
        rows = _load_npy(self.directory, d["rows"], (d["count"], self.width + self.slot_width),
                         np.float32)
      self._delta_rows[i] = rows
    return rows

  def _packed_chunk(self, k: int, entry: dict[str, Any],
                    n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The written rows of a packed chunk file: (indices in the chunk [m], values, slots)."""
    path = os.path.join(self.directory, entry["file"])
    m = entry["rows"]
    flat = np.load(io.BytesIO(_read_file(self.directory, entry)))
    if flat.ndim != 1 or flat.dtype != np.float32 or flat.size < m:
      raise ValueError(f"{path}: holds {flat.shape} {flat.dtype}, expected float32 [{m} + "
                       "the packed rows]")
    local = _local_rows(flat[:m], n, path)
    values, slots = self._row_codec().decode(k * CHUNK_ROWS + local, flat[m:], path)
    return local, values, slots

  def read(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Chunk `k`'s stored (values [n,E], slots [n,S], flags [n] bool); unwritten rows 0/False."""
    lo = k * CHUNK_ROWS
    n = min(CHUNK_ROWS, self.num_rows - lo)
    if n <= 0 or k < 0:
      raise ValueError(f"{self.directory}: chunk {k} is outside a table of {self.num_rows} rows")
    e, s = self.width, self.slot_width
    entry = self.manifest["chunks"].get(str(k))
    if entry is None:
      values, slots = np.zeros((n, e), np.float32), np.zeros((n, s), np.float32)
      flags = np.zeros((n,), np.bool_)
    elif "rows" not in entry:  # version 1: every row of the chunk, last column the flag
      block = _load_npy(self.directory, entry, (n, e + s + 1), np.float32)
      values, slots = np.ascontiguousarray(block[:, :e]), np.ascontiguousarray(block[:, e:e + s])
      flags = block[:, -1] > 0.5
    else:  # the written rows only, with their indices in the chunk
      if entry.get("packed"):  # at each table's own width
        local, stored_values, stored_slots = self._packed_chunk(k, entry, n)
      else:  # full rows, last column the index
        block = _load_npy(self.directory, entry, (entry["rows"], e + s + 1), np.float32)
        local = _local_rows(block[:, -1], n, os.path.join(self.directory, entry["file"]))
        stored_values, stored_slots = block[:, :e], block[:, e:e + s]
      values, slots = np.zeros((n, e), np.float32), np.zeros((n, s), np.float32)
      flags = np.zeros((n,), np.bool_)
      values[local], slots[local], flags[local] = stored_values, stored_slots, True
    for i, ids in enumerate(self._delta_ids):
      a, b = np.searchsorted(ids, [lo, lo + n])
      if a == b:
        continue
      local, rows = ids[a:b] - lo, self._rows(i)[a:b]
      values[local], slots[local], flags[local] = rows[:, :e], rows[:, e:], True
    return values, slots, flags


def _local_rows(column: np.ndarray, n: int, path: str) -> np.ndarray:
  """A chunk file's row indices (float32, exact below 2**24) as int64, checked sorted,
  distinct integers in `[0, n)`."""
  local = column.astype(np.int64)
  if local.size and (local[0] < 0 or local[-1] >= n or np.any(np.diff(local) <= 0)
                     or not np.array_equal(local, column)):
    raise ValueError(f"{path}: row indices are not sorted, distinct integers in [0, {n})")
  return local


def load_table(table: host_table_lib.HostTable, directory: str,
               tracker: ChangeTracker | None = None) -> int:
  """Restores a checkpoint into `table`, which must be freshly created (nothing written).

  Chunk by chunk (memory: one chunk plus the deltas' ids), each file's size and CRC-32
  checked before its rows are used; a corrupt file aborts a restore that must then be
  discarded with the table. With `tracker` (the table's), the chunks that deltas
  changed are marked dirty, so the next base checkpoint rewrites them. Returns the
  number of chunks loaded.

  Raises:
    ValueError: a corrupt or incompatible checkpoint (names the file), or a table that
      already holds written rows.
  """
  reader = TableReader(directory)
  check_compatible(reader.manifest, table, os.path.join(directory, MANIFEST_FILE))
  if table.num_materialised:
    raise ValueError(f"load_table: the table already holds {table.num_materialised} written "
                     "rows; restore into a freshly created table")
  for k in reader.chunks:
    values, slots, flags = reader.read(k)
    local = np.flatnonzero(flags)  # only stored rows: a sparse table stays sparse
    table.load_rows(k * CHUNK_ROWS + local, values[local], slots[local])
  if tracker is not None:
    tracker.mark_dirty_chunks(reader.delta_chunks())
  table.flush()
  return len(reader.chunks)
