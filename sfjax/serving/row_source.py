"""Where the predictor reads embedding rows: `gather(rows [n]) -> float32 [n, E]`.

A bundle's table is chunked files `table/rows_<lo>.npy` (float32, float16, or int8 with
per-row symmetric scales `table/scales_<lo>.npy`: row = q * scale). Two sources:

  MemoryRows   every row decoded to float32 in RAM once (fast; V * E * 4 bytes)
  MmapRows     the chunk files memory-mapped, rows decoded as gathered (RAM: the pages read)

Both satisfy `RowSource`, so a cached huge-table source (a device row cache over the mmap
source, issue #23 item 3) can slot in without the predictor changing, and so does a lazy
table's (`lazy_table.LazyRows`: only the written rows stored, the others computed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import jax
import numpy as np


class RowSource(Protocol):
  """A table the predictor gathers rows from."""

  num_rows: int
  width: int

  def gather(self, rows: np.ndarray) -> np.ndarray | jax.Array:
    """rows [n] int64 global table rows in [0, V), or -1 (padding: a zero row) -> float32
    [n, E] (on the host, or on the device for the row cache)."""


def decode_rows(values: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
  """Stored rows [n, E] (float32 / float16 / int8 with scales [n]) -> float32 [n, E]."""
  if scales is None:
    return np.asarray(values, np.float32)
  return np.asarray(values, np.float32) * np.asarray(scales, np.float32)[:, None]


def quantize_int8(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """float32 rows [n, E] -> (int8 [n, E], float32 scales [n]): per-row symmetric,
  scale = max |row| / 127 (1 for an all-zero row), q = round(row / scale)."""
  values = np.asarray(values, np.float32)
  peak = (np.max(np.abs(values), axis=1) if values.shape[1]
          else np.zeros(values.shape[0], np.float32))
  scales = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
  q = np.clip(np.rint(values / scales[:, None]), -127, 127).astype(np.int8)
  return q, scales


def _load_chunks(path: str, table: Mapping[str, Any], mmap: bool):
  """[(lo, values, scales or None)] of a manifest table, each file memory-mapped or read."""
  mode: Literal["r"] | None = "r" if mmap else None
  out = []
  for chunk in table["chunks"]:
    values = np.load(os.path.join(path, chunk["values"]), mmap_mode=mode)
    scales = (np.load(os.path.join(path, chunk["scales"]), mmap_mode=mode)
              if chunk.get("scales") else None)
    out.append((int(chunk["rows"][0]), values, scales))
  return out


class MemoryRows:
  """The whole table decoded to float32 in RAM.

  Args:
    path: the bundle directory.
    table: the manifest's table entry (`rows`, `dim`, `chunks`).
  """

  def __init__(self, path: str, table: Mapping[str, Any]):
    self.num_rows, self.width = int(table["rows"]), int(table["dim"])
    parts = [decode_rows(v, s) for _, v, s in _load_chunks(path, table, mmap=False)]
    self.values = (np.concatenate(parts) if parts
                   else np.zeros((0, self.width), np.float32))  # [V, E]

  def gather(self, rows: np.ndarray) -> np.ndarray:
    """rows [n] (-1: padding, a zero row) -> float32 [n, E]."""
    rows = np.asarray(rows, np.int64)
    real = rows >= 0
    if real.all():
      return self.values[rows]
    out = np.zeros((rows.shape[0], self.width), np.float32)
    out[real] = self.values[rows[real]]
    return out


class MmapRows:
  """The chunk files memory-mapped; each gather decodes only the rows it reads.

  Args:
    path: the bundle directory.
    table: the manifest's table entry (`rows`, `dim`, `chunk_rows`, `chunks`).
  """

  def __init__(self, path: str, table: Mapping[str, Any]):
    self.num_rows, self.width = int(table["rows"]), int(table["dim"])
    self.chunk_rows = int(table["chunk_rows"])
    self.chunks = _load_chunks(path, table, mmap=True)

  def gather(self, rows: np.ndarray) -> np.ndarray:
    """rows [n] (-1: padding, a zero row) -> float32 [n, E], reading each touched chunk once."""
    rows = np.asarray(rows, np.int64)
    out = np.zeros((rows.shape[0], self.width), np.float32)
    chunk_of = rows // self.chunk_rows  # padding: chunk -1, never read
    for k in np.unique(chunk_of[rows >= 0]).tolist():
      sel = np.flatnonzero(chunk_of == k)
      lo, values, scales = self.chunks[k]
      local = rows[sel] - lo
      out[sel] = decode_rows(values[local], None if scales is None else scales[local])
    return out


def open_rows(path: str, table: Mapping[str, Any], kind: str = "memory", *,
              unique_capacity: int = 0, cache_rows: int = 0, policy: str = "lru") -> RowSource:
  """The row source `kind` over a bundle table.

  Args:
    path: the bundle directory.
    table: the manifest's table entry.
    kind: "memory", "mmap", or "cache" (a device row cache over the mmap files,
      `row_cache.CachedRows`). A lazy table (`storage: "lazy"`, `lazy_table.LazyRows`):
      its written rows in RAM ("memory") or memory-mapped, the others computed.
    unique_capacity: "cache": the most rows one gather asks for.
    cache_rows: "cache": rows held on the device (0: 4 x unique_capacity).
    policy: "cache": "lru" or "lfu".
  """
  if kind not in ("memory", "mmap", "cache"):
    raise ValueError(f"rows must be 'memory', 'mmap' or 'cache', got {kind!r}")
  if table.get("storage", "dense") == "lazy":  # written rows + the init rule, never [V]-sized
    from sfjax.serving.lazy_table import LazyRows
    source: RowSource = LazyRows(path, table, mmap=kind != "memory")
  else:
    source = MemoryRows(path, table) if kind == "memory" else MmapRows(path, table)
  if kind != "cache":
    return source
  from sfjax.serving.row_cache import CachedRows  # loads the embedding cache machinery
  return CachedRows(source, cache_rows or 4 * unique_capacity, unique_capacity, policy)
