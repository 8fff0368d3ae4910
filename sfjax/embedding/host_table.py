"""Host table of the MixCache: embedding rows and optimizer slots in host memory.

ScaleFreeCTR keeps the full table on the host and only a cache of it on the
device (DESIGN.md §2). A `HostTable` stores

  values[V, E] float32   embedding rows (or half-width: `HostTableSpec.dtype`, row_dtype)
  slots[V, S]  float32   row-optimizer slots (`RowOptimizer.slot_width(E)` columns)
  materialised[V] bool   True once a row has been written by `scatter` (an mmap table's:
                         bits, `bit_flags.BitFlags`)

(values and per-element slots stored at each table's own width when a table's embedding
dim is below the model's: `HostTableSpec.table_dims`, `sfjax.embedding.packed_rows`; reads
and writes still speak full rows)

addressed by int64 global row ids (V may exceed 2**31). Two backends share one
interface: in-RAM numpy arrays (`create_ram`) and memory-mapped `.npy` files in a
directory (`create_mmap` / `open_mmap`) for tables larger than RAM.

Rows initialise lazily and deterministically: a row that was never written reads as
`init_rows(seed, 0, ids, E, init_stddev)` (table id 0, the trainer's single concatenated
table) with slots `initial_slot_row`, exactly what the on-device reference table holds, so
nothing proportional to V is ever written. A feature layout whose tables set their own
initializer or optimizer gives each table's rows its own stddev and initial slots
(`HostTableSpec.tables`, `initializers.init_table_rows`). Both backends allocate zero pages
lazily (calloc for RAM, sparse files for mmap): a 1e9-row table costs almost nothing until
rows are touched. The mmap table then grows by a 4 KiB page of its values and its slots per
touched row (~10-40 us a written row in page faults where the rows are far apart, on a VM:
`bench_growth`); its written flags are bits, 32,768 rows a page (`host_table_files`). The
RAM table's arrays are numpy allocations, which numpy advises into transparent huge pages:
where the kernel grants them (THP `madvise` or `always`), a touched row makes its whole
2 MiB region resident (a 1e8-row table: +5.1 GB of RSS after its first 4,000 random rows
written, at ~3 ms a row, on a 2-core VM; +46 MB and 7 us a row with 4 KiB pages), and
dense access is faster for it (gather + scatter of 22k random rows of a resident 2.6M-row
table: 3.4 against 3.7 ms, medians of 9 on a noisy machine).
A RAM table is budgeted at its full size (`placement`); a sparse table past RAM is mmap's.

The table's static description is `sfjax.embedding.host_table_spec.HostTableSpec`. The
mmap backend's directory (meta.json, values.npy, slots.npy, materialised.npy) is
`sfjax.embedding.host_table_files`. `clean` is false while writes are not yet flushed; a
table reopened in that state recounts `num_materialised` from the flags instead of trusting
the stored count. Every write validates ids, shapes and finiteness before touching any
array, so a bad write never corrupts saved state.

The table keeps rows, nothing else: what changed since a checkpoint is tracked by
whoever needs it through a write observer (`add_write_observer`; the checkpointer's
`sfjax.checkpoint.change_tracking.ChangeTracker`), called under the table's lock with
the ids of every `scatter` before its rows change.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np

from sfjax.embedding import host_rows, row_dtype
from sfjax.embedding import host_table_files as files
from sfjax.embedding.bit_flags import BitFlags
from sfjax.embedding.host_table_spec import (
  HostTableSpec,
  array_shapes,
  row_stores,
  spec_from_args,
  spec_from_meta,
)
from sfjax.embedding.initializers import TableInits, init_rows, init_table_rows

# Rows per chunk: the block of `read_chunk`; checkpoints (`sfjax.checkpoint`) save chunks this size.
CHUNK_ROWS = 1 << 16

# Called with the ids [N] int64 (distinct, validated) of a write, before its rows change.
WriteObserver = Callable[[np.ndarray], None]


class HostTable:
  """Embedding rows + optimizer slots in host memory (RAM or memory-mapped files).

  Build with `create_ram`, `create_mmap` or `open_mmap`. `gather` and `scatter`
  are serialised by a lock, so a Host-Manager thread may gather fills while the
  trainer thread writes back evicted rows. Write observers (`add_write_observer`) see
  every `scatter`'s ids under that lock, before the rows change.
  """

  def __init__(self, spec: HostTableSpec, values, slots, flags, num_materialised: int,
               path: str | None, writable: bool, version: int = files.FORMAT_VERSION):
    """Internal; use the `create_ram` / `create_mmap` / `open_mmap` constructors."""
    self.spec = spec
    self.path = path
    self.version = version  # of the mmap table's files (`host_table_files`)
    # [V, E] spec.dtype and [V, S] float32 rows (`PackedRows` over flat buffers when packed)
    self._values, self._slots = row_stores(spec, values, slots)
    self.dtype = row_dtype.row_dtype(spec.dtype)
    self._flags = flags  # [V] bool, or `BitFlags` (an mmap table's)
    self._num_materialised = int(num_materialised)
    self._writable = writable
    self._clean = True
    self._initial_slot_row = np.asarray(spec.initial_slot_row, np.float32).reshape(spec.slot_width)
    self._table_inits = spec.table_inits()
    self._lock = threading.RLock()
    self._observers: list[WriteObserver] = []

  # ---- constructors ---------------------------------------------------------

  @classmethod
  def create_ram(cls, num_rows: int, width: int, slot_width: int, *, seed: int,
                 init_stddev: float, initial_slot_row, tables: TableInits | None = None,
                 dtype="float32") -> HostTable:
    """An in-RAM table; zero pages are allocated lazily by the OS (calloc).

    `tables`: per-table initial rows (None: every row `init_stddev`, `initial_slot_row`);
    `dtype`: the rows' dtype (`HostTableSpec.dtype`).
    """
    spec = spec_from_args(num_rows, width, slot_width, seed, init_stddev, initial_slot_row,
                          tables, dtype)
    values, slots = array_shapes(spec)
    return cls(spec, np.zeros(values, row_dtype.row_dtype(dtype)), np.zeros(slots, np.float32),
               np.zeros((spec.num_rows,), np.bool_), 0, None, True)

  @classmethod
  def create_mmap(cls, path: str, num_rows: int, width: int, slot_width: int, *, seed: int,
                  init_stddev: float, initial_slot_row, tables: TableInits | None = None,
                  dtype="float32") -> HostTable:
    """A memory-mapped table in directory `path` (created; must be absent or empty).

    `tables` and `dtype` as in `create_ram` (recorded in meta.json).

    The data files are sparse: creating a 1e9-row table writes only headers. A creation
    that fails (e.g. ENOSPC, EFBIG) removes the files and directories it made, so the
    next run may create the table again.

    Raises:
      FileExistsError: `path` is a file or a non-empty directory.
      OSError: the creation failed (same errno; the message names `path`).
    """
    spec = spec_from_args(num_rows, width, slot_width, seed, init_stddev, initial_slot_row,
                          tables, dtype)
    path = os.fspath(path)
    if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
      raise FileExistsError(f"{path}: refusing to create a host table over an existing "
                            "non-empty path; use HostTable.open_mmap to reopen it")
    made = files.first_missing_directory(path)
    os.makedirs(path, exist_ok=True)
    try:
      arrays = files.create_arrays(path, spec.num_rows, spec.width, spec.slot_width, spec.dtype,
                                   array_shapes(spec))
      table = cls(spec, *arrays, 0, path, True)
      table._write_meta(clean=True)
    except BaseException as err:
      # A half-made table would block every later run (issue #25): remove what was made.
      files.remove_created(path, made)
      if isinstance(err, OSError) and not isinstance(err, FileExistsError):
        raise OSError(err.errno, f"{path}: cannot create the memory-mapped host table "
                      f"({spec.num_rows} x {spec.width} + {spec.slot_width} slots): "
                      f"{err.strerror or err}; removed what was created") from err
      raise
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
    meta_path = os.path.join(path, files.META_FILE)
    if not os.path.isfile(meta_path):
      raise FileNotFoundError(f"{meta_path}: host table metadata file is missing")
    meta = files.read_table_meta(meta_path)
    try:
      spec = spec_from_meta(meta)
    except (TypeError, ValueError) as err:
      raise ValueError(f"{meta_path}: corrupt host table metadata: {err}") from err
    values, slots, flags = files.open_arrays(path, spec.num_rows, spec.width, spec.slot_width,
                                             writable, spec.dtype, array_shapes(spec),
                                             meta["version"])
    # Not flushed after its last write: the stored count may be stale.
    count = meta["num_materialised"] if meta["clean"] else files.count_written(flags)
    return cls(spec, values, slots, flags, count, path, writable, meta["version"])

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
  def nbytes(self) -> int:
    """Bytes of values, slots and flags with every page resident (half-width rows: less)."""
    return int(self._values.nbytes + self._slots.nbytes + self._flags.nbytes)

  @property
  def num_materialised(self) -> int:
    """Number of rows written at least once by `scatter`."""
    return self._num_materialised

  @property
  def lock(self) -> threading.RLock:
    """The lock every read and write holds; observers run holding it (and may wait on a
    `threading.Condition` of it, which releases it meanwhile)."""
    return self._lock

  def written_ids(self) -> np.ndarray:
    """Sorted ids [M] int64 of every row written (materialised), scanned in blocks."""
    block = CHUNK_ROWS << 8
    with self._lock:
      return np.concatenate([lo + np.flatnonzero(self._flags[lo:lo + block])
                             for lo in range(0, self.num_rows, block)]).astype(np.int64)

  def gather(self, ids) -> tuple[np.ndarray, np.ndarray]:
    """Copies rows out; never-written rows come back initialised.

    Args:
      ids: [N] int64 global row ids in [0, V); duplicates allowed.

    Returns:
      values [N, E] (the table's dtype) and slots [N, S] float32 (fresh arrays).
    """
    ids = self._check_ids(ids, "gather")
    values = np.empty((ids.size, self.spec.width), self.dtype)
    slots = np.empty((ids.size, self.spec.slot_width), np.float32)
    with self._lock:
      stored = self._flags[ids]
      # Read only rows that were written: touching a hole of a huge sparse mmap file
      # costs a page fault per row for nothing but zeros.
      at = np.flatnonzero(stored)
      if at.size:
        rows = ids[at]
        host_rows.put_rows(values, at, self._values.take(rows))
        host_rows.put_rows(slots, at, self._slots.take(rows))
    fresh = np.flatnonzero(~stored)
    if fresh.size and self._table_inits is not None:
      fresh_values, fresh_slots = init_table_rows(self.spec.seed, ids[fresh], self.spec.width,
                                                  self._table_inits)
      host_rows.put_rows(values, fresh, fresh_values)
      host_rows.put_rows(slots, fresh, fresh_slots)
    elif fresh.size:
      host_rows.put_rows(values, fresh, init_rows(self.spec.seed, 0, ids[fresh],
                                                  self.spec.width, self.spec.init_stddev))
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
    values = host_rows.check_rows(values, (n, e), "scatter", "values", self.dtype)
    slots = host_rows.check_rows(slots, (n, s), "scatter", "slots")
    if n > 1:
      ordered = np.sort(ids)
      dup = ordered[1:] == ordered[:-1]
      if dup.any():
        raise ValueError(f"scatter: row id {int(ordered[1:][dup][0])} appears more than once")
    self._values.check(ids, values, "scatter", "values")
    self._slots.check(ids, slots, "scatter", "slots")
    with self._lock:
      for observer in self._observers:  # e.g. copy on write for a checkpoint being written
        observer(ids)
      if self.path is not None and self._clean:
        self._write_meta(clean=False)
      newly = int(np.count_nonzero(~self._flags[ids]))
      self._values.put(ids, values)
      self._slots.put(ids, slots)
      self._flags[ids] = True  # Last: a half-finished write reads as initial rows.
      self._num_materialised += newly

  def add_write_observer(self, observer: WriteObserver) -> None:
    """Calls `observer(ids)` at every `scatter`, under the lock, before the rows change.

    `ids` is the write's [N] int64 distinct validated row ids (the observer must not
    modify it). An observer that raises aborts the write before any row changes.
    """
    with self._lock:
      self._observers.append(observer)

  def remove_write_observer(self, observer: WriteObserver) -> None:
    """Stops calling `observer` (added by `add_write_observer`)."""
    with self._lock:
      self._observers.remove(observer)

  # ---- chunks (bulk reads, checkpoint restores) -------------------------------

  def chunk_range(self, chunk: int) -> tuple[int, int]:
    """Rows `[lo, hi)` of chunk `chunk`."""
    lo = chunk * CHUNK_ROWS
    return lo, min(lo + CHUNK_ROWS, self.num_rows)

  def read_chunk(self, chunk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Copies of chunk `chunk`'s stored values [n,E], slots [n,S] and materialised flags [n]."""
    lo, hi = self.chunk_range(chunk)
    with self._lock:
      return (self._values.read(lo, hi), self._slots.read(lo, hi),
              np.array(self._flags[lo:hi]))

  def load_rows(self, ids, values, slots) -> None:
    """Writes restored rows (a checkpoint restore): materialised; observers are not called
    (restored rows are no change since the checkpoint they came from).

    Only these rows' pages are touched, so restoring a sparse table stays sparse.

    Args:
      ids: [N] int64 distinct row ids; values: [N, E]; slots: [N, S] (finite).
    """
    ids = self._check_ids(ids, "load_rows")
    values = host_rows.check_rows(values, (ids.size, self.width), "load_rows", "values", self.dtype)
    slots = host_rows.check_rows(slots, (ids.size, self.slot_width), "load_rows", "slots")
    self._values.check(ids, values, "load_rows", "values")
    self._slots.check(ids, slots, "load_rows", "slots")
    with self._lock:
      if self.path is not None and self._clean:
        self._write_meta(clean=False)
      self._num_materialised += int(np.count_nonzero(~self._flags[ids]))
      self._values.put(ids, values)
      self._slots.put(ids, slots)
      self._flags[ids] = True

  def flush(self) -> None:
    """Flushes memory-mapped data and metadata to disk (no-op for RAM tables)."""
    if self.path is None or not self._writable:
      return
    with self._lock:
      for array in (self._values.buffer, self._slots.buffer, self._flags):
        if isinstance(array, (np.memmap, BitFlags)):
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
    if self.path is None:
      raise ValueError("an in-memory host table has no meta.json to write")
    files.write_meta(self.path, self.spec, self._num_materialised, clean, self.version)
    self._clean = clean
