"""The memory-mapped host table's directory: its files, checked on open, and their removal.

  meta.json          {"format", "version", "num_rows", "width", "slot_width", "seed",
                      "init_stddev", "initial_slot_row", "num_materialised", "clean",
                      "tables" (optional: {"starts", "stddevs", "slot_rows"} of a layout
                      whose tables set their own initializer or optimizer, and "dims",
                      "latent_dim" when a table has its own embedding dim),
                      "dtype" (optional: the rows' dtype, default "float32")}
  values.npy         [V, E] of the rows' dtype (float32, float16, or uint16: the bits of
                     bfloat16 rows); flat [size] when a table stores fewer columns
                     (`packed_rows`)
  slots.npy          [V, S] float32 (absent when S == 0); flat when packed
  written.npy        version 2 (every table created now): [ceil(V / 8)] uint8, row r's
                     written flag is bit r & 7 of byte r >> 3 (`bit_flags.BitFlags`)
  materialised.npy   version 1 (still opened, read and written): [V] bool, in place of
                     written.npy

The files are created sparse (only headers are written), so a 1e9-row table costs almost
nothing until rows are touched. Each file grows by a 4 KiB page where a row lands far from
the others, and a page fault on a sparse file costs microseconds (the file system
allocates a block). Version 1's byte flags (4,096 rows a page) made `gather` fault on the
flag page of every never-written far row and kept up to 1 GB of flag pages resident on a
1e9-row table; a page of bits covers 32,768 rows. `bench_growth`'s rows sweep at 1e9 rows
(2-core AMD VM, 2026-12-08, alternated with version 1): peak RSS 1,361 against 2,216 MiB,
1.39 against 1.72 page faults per evicted row, examples/s the same within noise (11.3k
against 11.7k). The spread sweep (rows 1,000 apart, already ~4 to a byte-flag page) is
unchanged: the values' and slots' pages are its cost (2.86 faults per evicted row).

Tried and not kept: one record per row (values then slots in one file, one page a far
row). It halved the faults again, but on this project's 2-core VM (ext4, kernel 6.18)
random writes of 1.7M rows into the 72-byte records of a 1e8-row table (the default
table: 17 float32 values + 1 slot) set the kernel writing the file back continuously, at
1.8-2.2 s for 53k rows a step, while 68-, 76- and 80-byte rows took 0.13-0.2 s: the
cause was not found, and the default fell on it.

`meta.json` is replaced atomically; `clean` is false while writes are not yet flushed
(`sfjax.embedding.host_table.HostTable`).
"""

from __future__ import annotations

import json
import os
from typing import Literal

import numpy as np

from sfjax.embedding import bit_flags, row_dtype
from sfjax.embedding.initializers import TableInits

_FORMAT_NAME = "sfjax.host_table"
FORMAT_VERSION = 2  # what `create_arrays` writes
_READ_VERSIONS = (1, 2)
META_FILE = "meta.json"
_VALUES_FILE = "values.npy"
_SLOTS_FILE = "slots.npy"
_WRITTEN_FILE = "written.npy"  # version 2: a bit per row
_FLAGS_FILE = "materialised.npy"  # version 1: a bool per row
_OWN_FILES = (_VALUES_FILE, _SLOTS_FILE, _WRITTEN_FILE, _FLAGS_FILE, META_FILE, META_FILE + ".tmp")
_SCAN_ROWS = 1 << 24  # flags counted per block (bounded memory on a huge table)

_META_TYPES: dict[str, type | tuple[type, ...]] = {
    "format": str, "version": int, "num_rows": int, "width": int, "slot_width": int,
    "seed": int, "init_stddev": (int, float), "initial_slot_row": list,
    "num_materialised": int, "clean": bool,
}

# values [V, E], slots [V, S], flags (`BitFlags`, or version 1's [V] bool)
Arrays = tuple[np.ndarray, np.ndarray, bit_flags.BitFlags | np.ndarray]


def create_arrays(path: str, num_rows: int, width: int, slot_width: int,
                  dtype="float32", shapes=None) -> Arrays:
  """Creates a version-2 table's sparse `.npy` files in the existing directory `path`;
  returns (values [V, E] viewed as rows of `dtype`, slots [V, S], flags `BitFlags`) over
  their maps. `shapes`: (values, slots) shapes other than `[V, E]`, `[V, S]` (a packed
  table's flat buffers)."""
  return _map_arrays(path, num_rows, width, slot_width, dtype, shapes, "w+", FORMAT_VERSION)


def open_arrays(path: str, num_rows: int, width: int, slot_width: int, writable: bool,
                dtype="float32", shapes=None, version: int = FORMAT_VERSION) -> Arrays:
  """Maps the `.npy` files of a table of format `version` in directory `path` after checking
  each header and size (values: rows of `dtype`; `shapes` as in `create_arrays`; flags: a
  `BitFlags`, or version 1's [V] bool map).

  Raises:
    FileNotFoundError / ValueError: naming the missing or mismatched file.
  """
  return _map_arrays(path, num_rows, width, slot_width, dtype, shapes,
                     "r+" if writable else "r", version)


def _map_arrays(path: str, num_rows: int, width: int, slot_width: int, dtype, shapes,
                mode: Literal["r", "r+", "w+"], version: int) -> Arrays:
  """`create_arrays` (`mode` 'w+') or `open_arrays`: values, slots (no file when S == 0)
  and the flags of format `version`, in that order."""
  v = num_rows
  value_shape, slot_shape = shapes or ((v, width), (v, slot_width))
  dtype = row_dtype.row_dtype(dtype)
  values = row_dtype.from_storage(
      _map_npy(path, _VALUES_FILE, row_dtype.storage_dtype(dtype), value_shape, mode), dtype)
  slots = (_map_npy(path, _SLOTS_FILE, np.float32, slot_shape, mode) if slot_width
           else np.zeros((v, 0), np.float32))
  if version == 1:
    return values, slots, _map_npy(path, _FLAGS_FILE, np.bool_, (v,), mode)
  bits = _map_npy(path, _WRITTEN_FILE, np.uint8, (bit_flags.num_bytes(v),), mode)
  return values, slots, bit_flags.BitFlags(bits, v)


def _map_npy(path: str, name: str, dtype, shape: tuple[int, ...],
             mode: Literal["r", "r+", "w+"]) -> np.memmap:
  """File `name` of directory `path` mapped: created sparse (`mode` 'w+'), or opened after
  `_open_npy`'s checks."""
  full = os.path.join(path, name)
  if mode == "w+":
    return np.lib.format.open_memmap(full, mode, dtype, shape)
  return _open_npy(full, dtype, shape, mode)


def count_written(flags) -> int:
  """Number of set flags (`BitFlags`, or a [V] bool map), counted in blocks (a huge map is
  never loaded at once)."""
  if isinstance(flags, bit_flags.BitFlags):
    return flags.count()
  return sum(int(np.count_nonzero(flags[i:i + _SCAN_ROWS])) for i in range(0, flags.size,
                                                                           _SCAN_ROWS))


def write_meta(path: str, spec, num_materialised: int, clean: bool,
               version: int = FORMAT_VERSION) -> None:
  """Replaces `path/meta.json` atomically (fsynced) with `spec` (a `HostTableSpec`), state and
  the files' format `version`."""
  meta = {
      "format": _FORMAT_NAME, "version": version, "num_rows": spec.num_rows,
      "width": spec.width, "slot_width": spec.slot_width, "seed": spec.seed,
      "init_stddev": spec.init_stddev, "initial_slot_row": list(spec.initial_slot_row),
      "num_materialised": num_materialised, "clean": clean,
  }
  if spec.tables is not None:
    meta["tables"] = tables_json(spec)
  if spec.dtype != "float32":  # float32 tables keep the meta.json they always had
    meta["dtype"] = spec.dtype
  final = os.path.join(path, META_FILE)
  tmp = final + ".tmp"
  try:
    with open(tmp, "w") as f:
      json.dump(meta, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, final)  # Atomic: a crash leaves the old or the new metadata.
  except BaseException:
    if os.path.exists(tmp):  # e.g. ENOSPC: the old metadata stays, no stray .tmp
      os.remove(tmp)
    raise


def tables_json(spec) -> dict | None:
  """The JSON record of a `HostTableSpec`'s per-table initial rows (None: rows alike)."""
  if spec.tables is None:
    return None
  starts, stddevs, slot_rows = spec.tables
  out = {"starts": list(starts), "stddevs": list(stddevs),
         "slot_rows": [list(r) for r in slot_rows]}
  if spec.table_dims is not None:
    out.update(dims=list(spec.table_dims), latent_dim=spec.latent_dim)
  return out


def meta_tables(meta: dict) -> TableInits | None:
  """The per-table initial rows meta.json records (`initializers.TableInits`), or None."""
  tables = meta.get("tables")
  if tables is None:
    return None
  try:
    dims = tables.get("dims")
    return TableInits(np.asarray(tables["starts"], np.int64),
                      np.asarray(tables["stddevs"], np.float64),
                      np.asarray(tables["slot_rows"], np.float32),
                      None if dims is None else np.asarray(dims, np.int64),
                      int(tables.get("latent_dim", 0)))
  except (KeyError, TypeError, ValueError) as err:
    raise ValueError(f"corrupt host table metadata: key 'tables': {err}") from err


def read_table_meta(meta_path: str) -> dict:
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
  if meta["format"] != _FORMAT_NAME or meta["version"] not in _READ_VERSIONS:
    raise ValueError(f"{meta_path}: unsupported host table format {meta['format']!r} version "
                     f"{meta['version']} (expected {_FORMAT_NAME!r} version "
                     f"{' or '.join(map(str, _READ_VERSIONS))})")
  return meta


def _open_npy(path: str, dtype, shape: tuple[int, ...], mode: Literal["r", "r+"]) -> np.memmap:
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


def first_missing_directory(path: str) -> str | None:
  """The outermost directory of `path` (itself included) that does not exist yet, or None:
  what `os.makedirs(path)` will create from."""
  path = os.path.abspath(path)
  missing = None
  while not os.path.exists(path):
    missing, parent = path, os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return missing


def remove_created(path: str, made: str | None) -> None:
  """Undoes a failed table creation in `path`: deletes the table's files, then the
  directories from `path` up to `made` (`first_missing_directory` before the creation)
  that are empty. Other files, and directories that existed before, are kept."""
  for name in _OWN_FILES:
    full = os.path.join(path, name)
    if os.path.isfile(full):
      os.remove(full)
  if made is None:
    return
  made, current = os.path.abspath(made), os.path.abspath(path)
  while (os.path.commonpath([made, current]) == made and os.path.isdir(current)
         and not os.listdir(current)):
    os.rmdir(current)
    if current == made:
      break
    current = os.path.dirname(current)


def discard_mmap_table(path: str) -> bool:
  """Deletes the memory-mapped host table in directory `path` (before restoring a checkpoint).

  A run resumed from a checkpoint must not see rows its crashed predecessor wrote after
  that checkpoint, so its mmap table is recreated empty and then loaded. Only a
  directory whose `meta.json` says it is a host table is touched (its files, then the
  directory if empty), or one holding nothing but a table's own file names (a creation
  killed before `meta.json` was written). Returns False if `path` does not exist.

  Raises:
    ValueError: `path` exists but is not a host table (nothing is deleted).
  """
  if not os.path.exists(path):
    return False
  try:
    with open(os.path.join(path, META_FILE), encoding="utf-8") as f:
      is_table = json.load(f).get("format") == _FORMAT_NAME
  except (OSError, ValueError, AttributeError):
    is_table = False
  own_names = set(_OWN_FILES)
  if not is_table and not (os.path.isdir(path) and set(os.listdir(path)) <= own_names):
    raise ValueError(f"{path}: not a host table directory (no valid {META_FILE}); "
                     "refusing to delete it")
  for name in sorted(own_names):  # META_FILE.tmp: killed mid-write
    if os.path.exists(os.path.join(path, name)):
      os.remove(os.path.join(path, name))
  if not os.listdir(path):
    os.rmdir(path)
  return True
