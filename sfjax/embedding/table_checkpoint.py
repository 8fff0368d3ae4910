"""Incremental, verifiable checkpoints of a `HostTable` in chunks of rows.

A checkpoint of the host table is a directory

  manifest.json        {"format", "version", "chunk_rows", "num_rows", "width", "slot_width",
                        "seed", "init_stddev", "chunks": {"<k>": {"file", "bytes", "crc32"}}}
  chunk_<k>.npy        float32 [n, E + S + 1]: values | optimizer slots | materialised (0/1)

for every chunk `k` (rows `[k * CHUNK_ROWS, (k + 1) * CHUNK_ROWS)`) that holds a written
row; a chunk absent from the manifest is all initial rows (never written). Only chunks
that `HostTable.scatter` touched since the previous checkpoint are written; the others
are hard-linked from the previous checkpoint's files (copied where links are not
supported), so every checkpoint directory is self-contained and deleting an old one
never breaks a newer one. Files are written once and never modified in place.

Atomicity is the caller's: write into a fresh temporary directory and rename it
(`sfjax.train.checkpoint`). Each chunk is fsynced; the manifest is written last.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zlib
from typing import Any, Iterable

import numpy as np

from sfjax.core.atomic import atomic_write
from sfjax.embedding import host_table as host_table_lib

FORMAT_NAME = "sfjax.table_checkpoint"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
CHUNK_ROWS = host_table_lib.CHUNK_ROWS
_SPEC_KEYS = ("num_rows", "width", "slot_width", "seed", "init_stddev")


def _spec_dict(table: host_table_lib.HostTable) -> dict[str, Any]:
  s = table.spec
  return {"num_rows": s.num_rows, "width": s.width, "slot_width": s.slot_width, "seed": s.seed,
          "init_stddev": s.init_stddev}


def _chunk_file(chunk: int) -> str:
  return f"chunk_{chunk:08d}.npy"


def _write_file(path: str, data: bytes) -> None:
  with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def read_manifest(directory: str) -> dict[str, Any]:
  """Loads `directory/manifest.json`; errors name the file."""
  path = os.path.join(directory, MANIFEST_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (OSError, ValueError) as err:
    raise ValueError(f"{path}: unreadable table checkpoint manifest: {err}") from err
  if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
    raise ValueError(f"{path}: not a {FORMAT_NAME} version {FORMAT_VERSION} manifest")
  return manifest


def _check_compatible(manifest: dict[str, Any], table: host_table_lib.HostTable,
                      where: str) -> None:
  expected = _spec_dict(table)
  for key in _SPEC_KEYS:
    if manifest.get(key) != expected[key]:
      raise ValueError(f"{where}: table checkpoint has {key}={manifest.get(key)!r}, the table "
                       f"has {expected[key]!r}")
  if manifest.get("chunk_rows") != CHUNK_ROWS:
    raise ValueError(f"{where}: chunk_rows={manifest.get('chunk_rows')}, expected {CHUNK_ROWS}")


def save_table(table: host_table_lib.HostTable, directory: str, dirty_chunks: Iterable[int],
               previous: str | None) -> dict[str, Any]:
  """Writes a checkpoint of `table` into the new directory `directory`.

  Args:
    table: the host table (flushed: no write may run concurrently).
    directory: where to write (created; must not exist).
    dirty_chunks: chunks written since `previous` (`HostTable.pop_dirty_chunks`); every
      chunk of `table` holding written rows must be dirty or in `previous`.
    previous: the previous checkpoint's table directory (None: the table was empty then).

  Returns:
    The manifest (also written as `directory/manifest.json`, last).
  """
  os.makedirs(directory)
  old = read_manifest(previous) if previous else None
  if old is not None:
    _check_compatible(old, table, os.path.join(previous, MANIFEST_FILE))
  chunks: dict[str, dict[str, Any]] = {}
  dirty = {int(k) for k in dirty_chunks}
  for k in sorted(dirty):
    values, slots, flags = table.read_chunk(k)
    if not flags.any():
      continue
    block = np.concatenate([values, slots, flags[:, None].astype(np.float32)], axis=1)
    buf = io.BytesIO()
    np.save(buf, block)
    data = buf.getvalue()
    _write_file(os.path.join(directory, _chunk_file(k)), data)
    chunks[str(k)] = {"file": _chunk_file(k), "bytes": len(data), "crc32": zlib.crc32(data)}
  for key, entry in (old or {"chunks": {}})["chunks"].items():
    if int(key) in dirty:
      continue
    src, dst = os.path.join(previous, entry["file"]), os.path.join(directory, entry["file"])
    try:
      os.link(src, dst)  # same inode: never modified in place, so sharing is safe
    except OSError:
      shutil.copyfile(src, dst)
    chunks[key] = dict(entry)
  manifest = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "chunk_rows": CHUNK_ROWS,
              **_spec_dict(table), "chunks": dict(sorted(chunks.items(), key=lambda x: int(x[0])))}
  atomic_write(os.path.join(directory, MANIFEST_FILE), json.dumps(manifest, indent=1))
  return manifest


def discard_mmap_table(path: str) -> bool:
  """Deletes the memory-mapped host table in directory `path` (before restoring a checkpoint).

  A run resumed from a checkpoint must not see rows its crashed predecessor wrote after
  that checkpoint, so its mmap table is recreated empty and then loaded. Only a
  directory whose `meta.json` says it is a host table is touched (its files, then the
  directory if empty). Returns False if `path` does not exist.

  Raises:
    ValueError: `path` exists but is not a host table (nothing is deleted).
  """
  if not os.path.exists(path):
    return False
  meta_path = os.path.join(path, host_table_lib.META_FILE)
  try:
    with open(meta_path, encoding="utf-8") as f:
      is_table = json.load(f).get("format") == host_table_lib.FORMAT_NAME
  except (OSError, ValueError, AttributeError):
    is_table = False
  if not is_table:
    raise ValueError(f"{path}: not a host table directory (no valid {host_table_lib.META_FILE}); "
                     "refusing to delete it")
  for name in (host_table_lib.VALUES_FILE, host_table_lib.SLOTS_FILE, host_table_lib.FLAGS_FILE,
               host_table_lib.META_FILE):
    if os.path.exists(os.path.join(path, name)):
      os.remove(os.path.join(path, name))
  if not os.listdir(path):
    os.rmdir(path)
  return True


def verify_table(directory: str) -> int:
  """Checks the manifest and every chunk file's size and CRC-32 without loading rows.

  Reads each chunk once (one chunk in memory at a time). Returns the number of chunks.

  Raises:
    ValueError: naming the first unreadable manifest or missing, truncated or altered chunk.
  """
  manifest = read_manifest(directory)
  for entry in manifest["chunks"].values():
    _read_chunk(directory, entry)
  return len(manifest["chunks"])


def _read_chunk(directory: str, entry: dict[str, Any]) -> bytes:
  """A chunk file's bytes, checked against its manifest entry (size and CRC-32).

  Raises:
    ValueError: naming the file, when it is unreadable, truncated or altered.
  """
  path = os.path.join(directory, entry["file"])
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as err:
    raise ValueError(f"{path}: unreadable table checkpoint chunk: {err}") from err
  crc = zlib.crc32(data)
  if len(data) != entry["bytes"] or crc != entry["crc32"]:
    raise ValueError(f"{path}: table checkpoint chunk is corrupt (size {len(data)} vs "
                     f"{entry['bytes']}, crc32 {crc} vs {entry['crc32']})")
  return data


def load_chunk_file(directory: str, entry: dict[str, Any], rows: int,
                    width: int, slot_width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Reads and verifies one chunk file: (values [n,E], slots [n,S], flags [n] bool)."""
  path = os.path.join(directory, entry["file"])
  block = np.load(io.BytesIO(_read_chunk(directory, entry)))
  if block.shape != (rows, width + slot_width + 1) or block.dtype != np.float32:
    raise ValueError(f"{path}: chunk has shape {block.shape} {block.dtype}, expected "
                     f"({rows}, {width + slot_width + 1}) float32")
  return (np.ascontiguousarray(block[:, :width]),
          np.ascontiguousarray(block[:, width:width + slot_width]), block[:, -1] > 0.5)


def load_table(table: host_table_lib.HostTable, directory: str) -> int:
  """Restores a checkpoint into `table`, which must be freshly created (nothing written).

  Each chunk's size and CRC-32 are checked before its rows are written (chunk by chunk,
  so memory stays one chunk; a corrupt chunk aborts a restore that must then be
  discarded with the table). Returns the number of chunks loaded.

  Raises:
    ValueError: a corrupt or incompatible checkpoint (names the file), or a table that
      already holds written rows.
  """
  manifest = read_manifest(directory)
  _check_compatible(manifest, table, os.path.join(directory, MANIFEST_FILE))
  if table.num_materialised:
    raise ValueError(f"load_table: the table already holds {table.num_materialised} written "
                     "rows; restore into a freshly created table")
  for key, entry in manifest["chunks"].items():
    k = int(key)
    rows = min(CHUNK_ROWS, table.num_rows - k * CHUNK_ROWS)
    table.load_chunk(k, *load_chunk_file(directory, entry, rows, table.width, table.slot_width))
  table.flush()
  return len(manifest["chunks"])
