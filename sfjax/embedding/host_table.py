"""Host table of the MixCache: embedding rows and optimizer slots in host memory.

ScaleFreeCTR keeps the full table on the host and only a cache of it on the
device (DESIGN.md §2). A `HostTable` stores

  values[V, E] float32   embedding rows
  slots[V, S]  float32   row-optimizer slots (`RowOptimizer.slot_width(E)` columns)
  materialised[V] bool   True once a row has been written by `scatter`

addressed by int64 global row ids (V may exceed 2**31). Two backends share one
interface: in-RAM numpy arrays (`create_ram`) and memory-mapped `.npy` files in a
directory (`create_mmap` / `open_mmap`) for tables larger than RAM.

Rows initialise lazily and deterministically: a row that was never written reads
as `init_rows(seed, 0, ids, E, init_stddev)` (table id 0, the trainer's single
concatenated table) with slots `initial_slot_row`, exactly what the on-device
reference table holds, so nothing proportional to V is ever written. Both
backends allocate zero pages lazily (calloc for RAM, sparse files for mmap): a
1e9-row table costs almost nothing until rows are touched.

Directory layout of the mmap backend:

  meta.json          {"format", "version", "num_rows", "width", "slot_width", "seed",
                      "init_stddev", "initial_slot_row", "num_materialised", "clean"}
  values.npy         [V, E] float32
  slots.npy          [V, S] float32 (absent when S == 0)
  materialised.npy   [V] bool

`clean` is false while writes are not yet flushed; a table reopened in that state
recounts `num_materialised` from the flags instead of trusting the stored count.
Every write validates ids, shapes and finiteness before touching any array, so a
bad write never corrupts saved state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading

import numpy as np

from sfjax.embedding.initializers import init_rows
from sfjax.embedding.table_snapshot import DirtyRows, TableSnapshot

FORMAT_NAME = "sfjax.host_table"
FORMAT_VERSION = 1
META_FILE = "meta.json"
VALUES_FILE = "values.npy"
SLOTS_FILE = "slots.npy"
FLAGS_FILE = "materialised.npy"
# Rows per chunk of dirty tracking; checkpoints (`table_checkpoint.py`) save chunks this size.
CHUNK_ROWS = 1 << 16


@dataclasses.dataclass(frozen=True)
class HostTableSpec:
  """Static description of a host table.

  Attributes:
    num_rows: V, number of rows (global ids are in [0, V)).
    width: E, embedding row width.
    slot_width: S, optimizer slot columns per row (0 for SGD).
    seed: seed of the deterministic row initialiser.
    init_stddev: standard deviation of `init_rows`.
    initial_slot_row: the S slot values of a never-written row.
  """

  num_rows: int
  width: int
  slot_width: int
  seed: int
  init_stddev: float
  initial_slot_row: tuple[float, ...]

  def __post_init__(self):
    for name, low in (("num_rows", 1), ("width", 1), ("slot_width", 0)):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"HostTableSpec.{name} must be an int >= {low}, got {value!r}")
    if not (math.isfinite(self.init_stddev) and self.init_stddev >= 0):
      raise ValueError(f"HostTableSpec.init_stddev must be finite and >= 0, got {self.init_stddev}")
    if len(self.initial_slot_row) != self.slot_width:
      raise ValueError(f"HostTableSpec.initial_slot_row has {len(self.initial_slot_row)} values, "
                       f"slot_width is {self.slot_width}")
    if not all(math.isfinite(v) for v in self.initial_slot_row):
      raise ValueError(f"HostTableSpec.initial_slot_row must be finite, got {self.initial_slot_row}")


def _make_spec(num_rows, width, slot_width, seed, init_stddev, initial_slot_row) -> HostTableSpec:
  row = tuple(float(v) for v in np.asarray(initial_slot_row, np.float32).reshape(-1))
  return HostTableSpec(int(num_rows), int(width), int(slot_width), int(seed), float(init_stddev), row)


class HostTable:
  """Embedding rows + optimizer slots in host memory (RAM or memory-mapped files).

  Build with `create_ram`, `create_mmap` or `open_mmap`. `gather` and `scatter`
  are serialised by a lock, so a Host-Manager thread may gather fills while the
  trainer thread writes back evicted rows.
  """

  def __init__(self, spec: HostTableSpec, values, slots, flags, num_materialised: int,
               path: str | None, writable: bool):
    """Internal; use the `create_ram` / `create_mmap` / `open_mmap` constructors."""
    self.spec = spec
    self.path = path
    self._values = values  # [V, E] float32
    self._slots = slots  # [V, S] float32
    self._flags = flags  # [V] bool
    self._num_materialised = int(num_materialised)
    self._writable = writable
    self._clean = True
    self._initial_slot_row = np.asarray(spec.initial_slot_row, np.float32).reshape(spec.slot_width)
    self._lock = threading.RLock()
    self._cond = threading.Condition(self._lock)
    self._dirty = np.zeros((-(-spec.num_rows // CHUNK_ROWS),), np.bool_)  # [V / CHUNK_ROWS]
    self._dirty_rows = DirtyRows()  # rows written since the last checkpoint
    self._snapshot: TableSnapshot | None = None

  # ---- constructors ---------------------------------------------------------

  @classmethod
  def create_ram(cls, num_rows: int, width: int, slot_width: int, *, seed: int,
                 init_stddev: float, initial_slot_row) -> HostTable:
    """An in-RAM table; zero pages are allocated lazily by the OS (calloc)."""
    spec = _make_spec(num_rows, width, slot_width, seed, init_stddev, initial_slot_row)
    v, e, s = spec.num_rows, spec.width, spec.slot_width
    return cls(spec, np.zeros((v, e), np.float32), np.zeros((v, s), np.float32),
               np.zeros((v,), np.bool_), 0, None, True)

  @classmethod
  def create_mmap(cls, path: str, num_rows: int, width: int, slot_width: int, *, seed: int,
                  init_stddev: float, initial_slot_row) -> HostTable:
    """A memory-mapped table in directory `path` (created; must be absent or empty).

    The data files are sparse: creating a 1e9-row table writes only headers.
    """
    spec = _make_spec(num_rows, width, slot_width, seed, init_stddev, initial_slot_row)
    path = os.fspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
      raise FileExistsError(f"{path}: refusing to create a host table over an existing "
                            "non-empty path; use HostTable.open_mmap to reopen it")
    os.makedirs(path, exist_ok=True)
    v, e, s = spec.num_rows, spec.width, spec.slot_width
    fmt = np.lib.format
    values = fmt.open_memmap(os.path.join(path, VALUES_FILE), "w+", np.float32, (v, e))
    slots = (fmt.open_memmap(os.path.join(path, SLOTS_FILE), "w+", np.float32, (v, s))
             if s else np.zeros((v, 0), np.float32))
    flags = fmt.open_memmap(os.path.join(path, FLAGS_FILE), "w+", np.bool_, (v,))
    table = cls(spec, values, slots, flags, 0, path, True)
    table._write_meta(clean=True)
    return table

  @classmethod
  def open_mmap(cls, path: str, *, writable: bool = True) -> HostTable:
    """Reopens a table written by `create_mmap`, validating every file.

    Raises:
      FileNotFoundError: the directory, metadata or a data file is missing.
      ValueError: corrupt metadata, or a data file whose header or size does not
        match the metadata (the message names the file).
    """
    path = os.fspath(path)
    meta_path = os.path.join(path, META_FILE)
    if not os.path.isfile(meta_path):
      raise FileNotFoundError(f"{meta_path}: host table metadata file is missing")
    meta = _read_meta(meta_path)
    try:
      spec = _make_spec(meta["num_rows"], meta["width"], meta["slot_width"], meta["seed"],
                        meta["init_stddev"], meta["initial_slot_row"])
    except (TypeError, ValueError) as err:
      raise ValueError(f"{meta_path}: corrupt host table metadata: {err}") from err
    v, e, s = spec.num_rows, spec.width, spec.slot_width
    mode = "r+" if writable else "r"
    values = _open_npy(os.path.join(path, VALUES_FILE), np.float32, (v, e), mode)
    slots = (_open_npy(os.path.join(path, SLOTS_FILE), np.float32, (v, s), mode)
             if s else np.zeros((v, 0), np.float32))
    flags = _open_npy(os.path.join(path, FLAGS_FILE), np.bool_, (v,), mode)
    if meta["clean"]:
      count = meta["num_materialised"]
    else:  # Not flushed after its last write: the stored count may be stale.
      count = sum(int(np.count_nonzero(flags[i:i + (1 << 24)])) for i in range(0, v, 1 << 24))
    return cls(spec, values, slots, flags, count, path, writable)

  # ---- reads ----------------------------------------------------------------

  @property
  def num_rows(self) -> int:
    return self.spec.num_rows

  @property
  def width(self) -> int:
    return self.spec.width

  @property
  def slot_width(self) -> int:
    return self.spec.slot_width

  @property
  def num_materialised(self) -> int:
    """Number of rows written at least once by `scatter`."""
    return self._num_materialised

  def gather(self, ids) -> tuple[np.ndarray, np.ndarray]:
    """Copies rows out; never-written rows come back initialised.

    Args:
      ids: [N] int64 global row ids in [0, V); duplicates allowed.

    Returns:
      values [N, E] float32 and slots [N, S] float32 (fresh arrays).
    """
    ids = self._check_ids(ids, "gather")
    values = np.empty((ids.size, self.spec.width), np.float32)
    slots = np.empty((ids.size, self.spec.slot_width), np.float32)
    with self._lock:
      stored = self._flags[ids]
      # Read only rows that were written: touching a hole of a huge sparse mmap file
      # costs a page fault per row for nothing but zeros.
      if stored.any():
        rows = ids[stored]  # np.take: ~4x faster than fancy indexing on [V, E] tables
        values[stored] = np.take(self._values, rows, axis=0)
        slots[stored] = np.take(self._slots, rows, axis=0)
    fresh = ~stored
    if fresh.any():
      values[fresh] = init_rows(self.spec.seed, 0, ids[fresh], self.spec.width, self.spec.init_stddev)
      slots[fresh] = self._initial_slot_row
    return values, slots

  def read_all(self, max_rows: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """The whole table as dense arrays (small tables, tests): values [V,E], slots [V,S]."""
    if self.num_rows > max_rows:
      raise ValueError(f"read_all: table has {self.num_rows} rows > max_rows={max_rows}")
    return self.gather(np.arange(self.num_rows, dtype=np.int64))

  # ---- writes ---------------------------------------------------------------

  def scatter(self, ids, values, slots) -> None:
    """Writes rows back and marks them materialised.

    Everything is validated before any array is touched.

    Args:
      ids: [N] int64 distinct global row ids in [0, V).
      values: [N, E] floating, finite.
      slots: [N, S] floating, finite.

    Raises:
      ValueError: bad ids (out of range, duplicated), shapes, dtypes or non-finite values.
      PermissionError: the table was opened read-only.
    """
    if not self._writable:
      raise PermissionError(f"{self.path}: host table was opened read-only")
    ids = self._check_ids(ids, "scatter")
    n, e, s = ids.shape[0], self.spec.width, self.spec.slot_width
    values = _check_rows(values, (n, e), "values")
    slots = _check_rows(slots, (n, s), "slots")
    if n > 1:
      ordered = np.sort(ids)
      dup = ordered[1:] == ordered[:-1]
      if dup.any():
        raise ValueError(f"scatter: row id {int(ordered[1:][dup][0])} appears more than once")
    with self._lock:
      chunks = ids // CHUNK_ROWS
      if self._snapshot is not None and not self._snapshot.closed:
        self._snapshot.preserve(chunks)  # copy on write for a checkpoint being written
      if self.path is not None and self._clean:
        self._write_meta(clean=False)
      newly = int(np.count_nonzero(~self._flags[ids]))
      self._values[ids] = values
      self._slots[ids] = slots
      self._flags[ids] = True  # Last: a half-finished write reads as initial rows.
      self._num_materialised += newly
      self._dirty[chunks] = True
      self._dirty_rows.add(ids)

  # ---- chunks (checkpoints) ---------------------------------------------------

  def pop_dirty_chunks(self) -> np.ndarray:
    """Indices of chunks `scatter` wrote since the last pop (cleared; see `mark_dirty_chunks`)."""
    with self._lock:
      chunks = np.flatnonzero(self._dirty)
      self._dirty[chunks] = False
      return chunks

  def mark_dirty_chunks(self, chunks) -> None:
    """Marks chunks dirty again (a checkpoint that popped them failed before it was committed)."""
    with self._lock:
      self._dirty[np.asarray(chunks, np.int64)] = True

  def pop_dirty_rows(self) -> np.ndarray:
    """Sorted distinct ids [D] int64 of rows `scatter` wrote since the last pop (cleared)."""
    with self._lock:
      return self._dirty_rows.pop()

  def mark_dirty_rows(self, ids) -> None:
    """Marks rows dirty again (a checkpoint that popped them failed before it was committed)."""
    with self._lock:
      self._dirty_rows.mark(ids)

  def num_dirty_rows(self) -> int:
    """Distinct rows written since the last `pop_dirty_rows`."""
    with self._lock:
      return self._dirty_rows.count()

  def chunk_range(self, chunk: int) -> tuple[int, int]:
    """Rows `[lo, hi)` of chunk `chunk`."""
    lo = chunk * CHUNK_ROWS
    return lo, min(lo + CHUNK_ROWS, self.num_rows)

  def _chunk_bytes(self, chunk: int) -> int:
    lo, hi = self.chunk_range(chunk)
    return (hi - lo) * (4 * (self.width + self.slot_width) + 1)

  def read_chunk(self, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copies of chunk `chunk`'s stored values [n,E], slots [n,S] and materialised flags [n]."""
    lo, hi = self.chunk_range(chunk)
    with self._lock:
      return (np.array(self._values[lo:hi]), np.array(self._slots[lo:hi]),
              np.array(self._flags[lo:hi]))

  def begin_snapshot(self, chunks, budget_bytes: int) -> TableSnapshot:
    """A copy-on-write view of `chunks` as they are now (one open snapshot at a time).

    Writes keep going; a write to a chunk the snapshot's reader has not read yet copies
    the chunk aside first, holding at most `budget_bytes` of copies (then it waits for
    the reader). Close it when done (`TableSnapshot.close`).

    Raises:
      RuntimeError: another snapshot is still open.
    """
    with self._lock:
      if self._snapshot is not None and not self._snapshot.closed:
        raise RuntimeError("begin_snapshot: a snapshot of this table is still open")
      self._snapshot = TableSnapshot(chunks, self._dirty.size, self.read_chunk, self._chunk_bytes,
                                     self._cond, budget_bytes)
      return self._snapshot

  def load_chunk(self, chunk: int, values, slots, flags) -> None:
    """Overwrites chunk `chunk` with `read_chunk`'s arrays (a checkpoint restore; not dirty)."""
    lo, hi = self.chunk_range(chunk)
    if values.shape != (hi - lo, self.width) or slots.shape != (hi - lo, self.slot_width):
      raise ValueError(f"load_chunk: chunk {chunk} needs {hi - lo} rows of width {self.width} "
                       f"+ {self.slot_width} slots, got {values.shape} and {slots.shape}")
    with self._lock:
      if self._snapshot is not None and not self._snapshot.closed:
        raise RuntimeError("load_chunk: a checkpoint snapshot of this table is open")
      if self.path is not None and self._clean:
        self._write_meta(clean=False)
      self._num_materialised += int(np.count_nonzero(flags)) - int(
          np.count_nonzero(self._flags[lo:hi]))
      self._values[lo:hi], self._slots[lo:hi], self._flags[lo:hi] = values, slots, flags

  def load_rows(self, ids, values, slots) -> None:
    """Writes restored rows (a checkpoint restore): materialised, not marked dirty.

    Only these rows' pages are touched, so restoring a sparse table stays sparse.

    Args:
      ids: [N] int64 distinct row ids; values: [N, E]; slots: [N, S] (finite).
    """
    ids = self._check_ids(ids, "load_rows")
    values = _check_rows(values, (ids.size, self.width), "values")
    slots = _check_rows(slots, (ids.size, self.slot_width), "slots")
    with self._lock:
      if self._snapshot is not None and not self._snapshot.closed:
        raise RuntimeError("load_rows: a checkpoint snapshot of this table is open")
      if self.path is not None and self._clean:
        self._write_meta(clean=False)
      self._num_materialised += int(np.count_nonzero(~self._flags[ids]))
      self._values[ids], self._slots[ids] = values, slots
      self._flags[ids] = True

  def flush(self) -> None:
    """Flushes memory-mapped data and metadata to disk (no-op for RAM tables)."""
    if self.path is None or not self._writable:
      return
    with self._lock:
      for array in (self._values, self._slots, self._flags):
        if isinstance(array, np.memmap):
          array.flush()
      self._write_meta(clean=True)

  def close(self) -> None:
    """Flushes and releases the memory maps; the table is unusable afterwards."""
    self.flush()
    self._values = self._slots = self._flags = None

  def __enter__(self) -> HostTable:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # ---- helpers --------------------------------------------------------------

  def _check_ids(self, ids, where: str) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1:
      raise ValueError(f"{where}: ids must be 1-D [N], got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
      raise ValueError(f"{where}: ids must be integers, got dtype {ids.dtype}")
    if ids.size == 0:
      return ids.astype(np.int64)
    if ids.dtype.kind == "u" and int(ids.max()) > np.iinfo(np.int64).max:
      raise ValueError(f"{where}: row id {int(ids.max())} out of range [0, {self.num_rows})")
    ids = ids.astype(np.int64, copy=False)
    bad = (ids < 0) | (ids >= self.num_rows)
    if bad.any():
      raise ValueError(f"{where}: row id {int(ids[bad][0])} out of range [0, {self.num_rows}) "
                       f"(V = {self.num_rows})")
    return ids

  def _write_meta(self, clean: bool) -> None:
    spec = self.spec
    meta = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "num_rows": spec.num_rows,
        "width": spec.width, "slot_width": spec.slot_width, "seed": spec.seed,
        "init_stddev": spec.init_stddev, "initial_slot_row": list(spec.initial_slot_row),
        "num_materialised": self._num_materialised, "clean": clean,
    }
    final = os.path.join(self.path, META_FILE)
    tmp = final + ".tmp"
    with open(tmp, "w") as f:
      json.dump(meta, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, final)  # Atomic: a crash leaves the old or the new metadata.
    self._clean = clean


_META_TYPES = {
    "format": str, "version": int, "num_rows": int, "width": int, "slot_width": int,
    "seed": int, "init_stddev": (int, float), "initial_slot_row": list,
    "num_materialised": int, "clean": bool,
}


def _read_meta(meta_path: str) -> dict:
  """Loads and type-checks meta.json; errors name the file and the key."""
  try:
    with open(meta_path) as f:
      meta = json.load(f)
  except (OSError, ValueError) as err:
    raise ValueError(f"{meta_path}: corrupt host table metadata: {err}") from err
  if not isinstance(meta, dict):
    raise ValueError(f"{meta_path}: corrupt host table metadata: expected a JSON object")
  for key, kind in _META_TYPES.items():
    if key not in meta:
      raise ValueError(f"{meta_path}: corrupt host table metadata: missing key {key!r}")
    if not isinstance(meta[key], kind) or (kind is int and isinstance(meta[key], bool)):
      raise ValueError(f"{meta_path}: corrupt host table metadata: key {key!r} has "
                       f"wrong type {type(meta[key]).__name__}")
  if meta["format"] != FORMAT_NAME or meta["version"] != FORMAT_VERSION:
    raise ValueError(f"{meta_path}: unsupported host table format {meta['format']!r} version "
                     f"{meta['version']} (expected {FORMAT_NAME!r} version {FORMAT_VERSION})")
  return meta


def _open_npy(path: str, dtype, shape: tuple[int, ...], mode: str) -> np.memmap:
  """Memory-maps an existing .npy file after checking its header and byte size."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: host table data file is missing")
  fmt = np.lib.format
  try:
    with open(path, "rb") as f:
      version = fmt.read_magic(f)
      read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
      found_shape, fortran, found_dtype = read_header(f)
      offset = f.tell()
  except (OSError, ValueError) as err:
    raise ValueError(f"{path}: corrupt .npy header: {err}") from err
  if tuple(found_shape) != tuple(shape) or found_dtype != np.dtype(dtype) or fortran:
    raise ValueError(f"{path}: header says shape {tuple(found_shape)} dtype {found_dtype}, "
                     f"metadata expects shape {tuple(shape)} dtype {np.dtype(dtype)}")
  expected = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  actual = os.path.getsize(path)
  if actual != expected:
    raise ValueError(f"{path}: file is {actual} bytes, expected {expected} for shape {tuple(shape)}")
  return np.memmap(path, dtype=dtype, mode=mode, shape=shape, offset=offset)


def _check_rows(rows, shape: tuple[int, int], name: str) -> np.ndarray:
  """Validates a [N, W] block of rows to be written; returns it as float32."""
  rows = np.asarray(rows)
  if rows.shape != shape:
    raise ValueError(f"scatter: {name} must have shape {shape}, got {rows.shape}")
  if rows.dtype.kind != "f":
    raise ValueError(f"scatter: {name} must be floating point, got dtype {rows.dtype}")
  rows = rows.astype(np.float32, copy=False)
  if not np.isfinite(rows).all():
    bad = np.argwhere(~np.isfinite(rows))[0]
    raise ValueError(f"scatter: {name}[{bad[0]}, {bad[1]}] is {rows[bad[0], bad[1]]} (not finite)")
  return rows
