"""Incremental, verifiable checkpoints of a `HostTable`: chunk bases plus row deltas.

A checkpoint of the host table is a directory

  manifest.json        {"format", "version", "chunk_rows", "num_rows", "width", "slot_width",
                        "seed", "init_stddev", "chunks": {"<k>": {"file", "bytes", "crc32"}},
                        "deltas": [{"ids": {...}, "rows": {...}, "count"}], "delta_seq"}
  chunk_<k>.npy        float32 [m, E + S + 1]: the chunk's m written rows: values | optimizer
                       slots | the row's index in the chunk (version 1: all n rows, last
                       column the materialised flag)
  delta_<s>_<p>.ids.npy   int64 [m] sorted row ids written since the previous checkpoint
  delta_<s>_<p>.rows.npy  float32 [m, E + S] their values | optimizer slots

The table is the chunk files (the *base*; a chunk absent from it holds only initial
rows) with the deltas applied in order. A checkpoint is one of two kinds
(`plan_save`):

* **delta**: only the rows `HostTable.scatter` wrote since the previous checkpoint,
  as `delta_*` files; the base and earlier deltas are hard-linked. On a Zipf tail the
  written rows are spread over nearly every chunk, so this is what keeps a save
  proportional to the rows touched (chunk granularity rewrote ~54% of a 1e8-row table).
* **base**: when the deltas would exceed `compact_ratio` times the base's bytes (or
  there is no previous checkpoint), the chunks written since the previous base are
  rewritten (their written rows only: a lazily initialised table's base is as large as
  the rows trained, not the table), the other chunk files hard-linked, and the deltas
  dropped. So disk
  use stays within (1 + compact_ratio) times the base.

Hard links (copies where unsupported) make every checkpoint directory self-contained:
deleting an old one never breaks a newer one. Files are written once, fsynced, and
never modified in place; the manifest is written last.

Rows are read through a copy-on-write `TableSnapshot`, so the files can be written on
a background thread while training goes on (`sfjax.checkpoint.checkpointer`). Atomicity is
the caller's: write into a fresh temporary directory and rename it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np

from sfjax.core.atomic import atomic_write
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding.table_snapshot import TableSnapshot

FORMAT_NAME = "sfjax.table_checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1: chunks only, no deltas
MANIFEST_FILE = "manifest.json"
CHUNK_ROWS = host_table_lib.CHUNK_ROWS
DELTA_PIECE_ROWS = 1 << 20  # rows per delta file (bounds one file's memory when loaded)
COMPACT_RATIO = 0.5  # deltas beyond this fraction of the base's bytes -> write a new base
_SPEC_KEYS = ("num_rows", "width", "slot_width", "seed", "init_stddev")


def _spec_dict(table: host_table_lib.HostTable) -> dict[str, Any]:
  s = table.spec
  return {"num_rows": s.num_rows, "width": s.width, "slot_width": s.slot_width, "seed": s.seed,
          "init_stddev": s.init_stddev}


def _chunk_file(chunk: int) -> str:
  return f"chunk_{chunk:08d}.npy"


def _npy_bytes(array: np.ndarray) -> bytes:
  buf = io.BytesIO()
  np.save(buf, array)
  return buf.getvalue()


def _write_file(directory: str, name: str, data: bytes) -> dict[str, Any]:
  """Writes and fsyncs `directory/name`; returns its manifest entry."""
  with open(os.path.join(directory, name), "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  return {"file": name, "bytes": len(data), "crc32": zlib.crc32(data)}


def _link(previous: str, directory: str, entry: dict[str, Any]) -> dict[str, Any]:
  src, dst = os.path.join(previous, entry["file"]), os.path.join(directory, entry["file"])
  try:
    os.link(src, dst)  # same inode: never modified in place, so sharing is safe
  except OSError:
    shutil.copyfile(src, dst)
  return dict(entry)


def read_manifest(directory: str) -> dict[str, Any]:
  """Loads `directory/manifest.json`; errors name the file."""
  path = os.path.join(directory, MANIFEST_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (OSError, ValueError) as err:
    raise ValueError(f"{path}: unreadable table checkpoint manifest: {err}") from err
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME \
      or manifest.get("version") not in READABLE_VERSIONS:
    raise ValueError(f"{path}: not a {FORMAT_NAME} manifest of version {READABLE_VERSIONS}")
  manifest.setdefault("deltas", [])
  manifest.setdefault("delta_seq", 0)
  return manifest


def check_compatible(manifest: dict[str, Any], table: host_table_lib.HostTable,
                     where: str) -> None:
  """Raises ValueError naming `where` unless the manifest's table spec and chunk size are
  `table`'s (rows, width, slot width, seed, init scale)."""
  expected = _spec_dict(table)
  for key in _SPEC_KEYS:
    if manifest.get(key) != expected[key]:
      raise ValueError(f"{where}: table checkpoint has {key}={manifest.get(key)!r}, the table "
                       f"has {expected[key]!r}")
  if manifest.get("chunk_rows") != CHUNK_ROWS:
    raise ValueError(f"{where}: chunk_rows={manifest.get('chunk_rows')}, expected {CHUNK_ROWS}")


def _base_bytes(manifest: dict[str, Any]) -> int:
  return sum(e["bytes"] for e in manifest["chunks"].values())


def _delta_bytes(manifest: dict[str, Any]) -> int:
  return sum(d["ids"]["bytes"] + d["rows"]["bytes"] for d in manifest["deltas"])


class SavePlan(NamedTuple):
  """What one table checkpoint writes (`plan_save`).

  Attributes:
    kind: "base" (whole chunks, deltas dropped) or "delta" (dirty rows only).
    chunks: [K] int64 chunks read through the snapshot.
    rows: [D] int64 sorted dirty row ids (a delta's rows; a base covers them too).
    gathered: a small delta's rows read at capture time (values [D,E], slots [D,S]);
      None: rows are read through the snapshot.
  """

  kind: str
  chunks: np.ndarray
  rows: np.ndarray
  gathered: tuple[np.ndarray, np.ndarray] | None = None


def plan_save(table: host_table_lib.HostTable, previous: str | None,
              compact_ratio: float = COMPACT_RATIO) -> SavePlan:
  """Takes the table's dirty state and decides between a delta and a base checkpoint.

  Pops the dirty rows (and, for a base, the dirty chunks); `unplan_save` puts them back
  if the checkpoint is not committed. Call it with the table quiescent (flushed).

  Args:
    table: the host table.
    previous: the previous checkpoint's table directory (None: none; a base is written).
    compact_ratio: write a base once the deltas would exceed this times the base bytes.
  """
  rows = table.pop_dirty_rows()
  old = read_manifest(previous) if previous else None
  if old is not None:
    check_compatible(old, table, os.path.join(previous, MANIFEST_FILE))
    row_bytes = 8 + 4 * (table.width + table.slot_width)
    if _delta_bytes(old) + rows.size * row_bytes <= compact_ratio * _base_bytes(old):
      return SavePlan("delta", np.unique(rows // CHUNK_ROWS), rows)
  return SavePlan("base", table.pop_dirty_chunks(), rows)


def capture(table: host_table_lib.HostTable, plan: SavePlan,
            budget_bytes: int) -> tuple[SavePlan, TableSnapshot]:
  """Fixes what `plan` will write, as of now, so training may write on.

  A delta whose rows fit in `budget_bytes` is copied at once (its rows only: a Zipf
  tail spreads them over every chunk, so a chunk snapshot would copy far more);
  otherwise a copy-on-write snapshot over `plan.chunks` is opened with that budget.

  Returns:
    (the plan, with `gathered` set for a copied delta; the snapshot to read and close).
  """
  row_bytes = 4 * (table.width + table.slot_width)
  if plan.kind == "delta" and plan.rows.size * row_bytes <= budget_bytes:
    plan = plan._replace(gathered=table.gather(plan.rows))
    return plan, table.begin_snapshot([], budget_bytes)
  return plan, table.begin_snapshot(plan.chunks, budget_bytes)


def unplan_save(table: host_table_lib.HostTable, plan: SavePlan) -> None:
  """Marks a failed checkpoint's rows (and base chunks) dirty again."""
  table.mark_dirty_rows(plan.rows)
  if plan.kind == "base":
    table.mark_dirty_chunks(plan.chunks)


def write_table(snapshot: TableSnapshot, table: host_table_lib.HostTable, directory: str,
                plan: SavePlan, previous: str | None) -> dict[str, Any]:
  """Writes the checkpoint `plan` describes into the new directory `directory`.

  Args:
    snapshot: the table's snapshot over `plan.chunks` (`HostTable.begin_snapshot`),
      taken when the plan was made; each chunk is read from it once.
    table: the host table (its spec).
    directory: where to write (created; must not exist).
    plan: from `plan_save` (the same `previous`).
    previous: the previous checkpoint's table directory, or None.

  Returns:
    The manifest (also written as `directory/manifest.json`, last).
  """
  os.makedirs(directory)
  old = read_manifest(previous) if previous else {"chunks": {}, "deltas": [], "delta_seq": 0}
  chunks: dict[str, dict[str, Any]] = {}
  deltas: list[dict[str, Any]] = []
  if plan.kind == "base":
    rewritten = {int(k) for k in plan.chunks}
    for k in sorted(rewritten):
      values, slots, flags = snapshot.read_chunk(k)
      if flags.any():
        local = np.flatnonzero(flags)  # only written rows: a sparse table's base stays small
        block = np.concatenate([values[local], slots[local],
                                local[:, None].astype(np.float32)], axis=1)  # exact below 2**24
        chunks[str(k)] = dict(_write_file(directory, _chunk_file(k), _npy_bytes(block)),
                              rows=int(local.size))
    for key, entry in old["chunks"].items():
      if int(key) not in rewritten:
        chunks[key] = _link(previous, directory, entry)
  else:
    for key, entry in old["chunks"].items():
      chunks[key] = _link(previous, directory, entry)
    for d in old["deltas"]:
      deltas.append({"ids": _link(previous, directory, d["ids"]),
                     "rows": _link(previous, directory, d["rows"]), "count": d["count"]})
    deltas += _write_deltas(snapshot, directory, plan, f"delta_{old['delta_seq']:06d}")
  manifest = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "chunk_rows": CHUNK_ROWS,
              **_spec_dict(table),
              "chunks": dict(sorted(chunks.items(), key=lambda x: int(x[0]))),
              "deltas": deltas, "delta_seq": old["delta_seq"] + (plan.kind == "delta")}
  atomic_write(os.path.join(directory, MANIFEST_FILE), json.dumps(manifest, indent=1))
  return manifest


def save_table(table: host_table_lib.HostTable, directory: str, previous: str | None,
               compact_ratio: float = COMPACT_RATIO) -> dict[str, Any]:
  """Plans and writes one table checkpoint synchronously (`plan_save` + `write_table`).

  On failure the table's dirty state is put back (`unplan_save`). Returns the manifest.
  """
  plan, snapshot = capture(table, plan_save(table, previous, compact_ratio), budget_bytes=0)
  try:
    return write_table(snapshot, table, directory, plan, previous)
  except BaseException:
    unplan_save(table, plan)
    raise
  finally:
    snapshot.close()


def _write_deltas(snapshot: TableSnapshot, directory: str, plan: SavePlan,
                  prefix: str) -> list[dict[str, Any]]:
  """The dirty rows, read chunk by chunk from the snapshot, in files of <= DELTA_PIECE_ROWS."""
  out, ids_buf, rows_buf, count = [], [], [], 0

  def emit():
    nonlocal ids_buf, rows_buf, count
    name = f"{prefix}_{len(out):04d}"
    ids = np.concatenate(ids_buf)
    out.append({"ids": _write_file(directory, name + ".ids.npy", _npy_bytes(ids)),
                "rows": _write_file(directory, name + ".rows.npy",
                                    _npy_bytes(np.concatenate(rows_buf))),
                "count": int(ids.size)})
    ids_buf, rows_buf, count = [], [], 0

  if plan.gathered is not None:
    block = np.concatenate(plan.gathered, axis=1)
    for start in range(0, plan.rows.size, DELTA_PIECE_ROWS):
      ids_buf.append(plan.rows[start:start + DELTA_PIECE_ROWS])
      rows_buf.append(block[start:start + DELTA_PIECE_ROWS])
      emit()
    return out
  bounds = np.searchsorted(plan.rows, plan.chunks * CHUNK_ROWS)
  for k, start, stop in zip(plan.chunks.tolist(), bounds, list(bounds[1:]) + [plan.rows.size]):
    values, slots, _ = snapshot.read_chunk(k)
    local = plan.rows[start:stop] - k * CHUNK_ROWS
    ids_buf.append(plan.rows[start:stop])
    rows_buf.append(np.concatenate([values[local], slots[local]], axis=1))
    count += local.size
    if count >= DELTA_PIECE_ROWS:
      emit()
  if count:
    emit()
  return out


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
               host_table_lib.META_FILE, host_table_lib.META_FILE + ".tmp"):  # .tmp: killed mid-write
    if os.path.exists(os.path.join(path, name)):
      os.remove(os.path.join(path, name))
  if not os.listdir(path):
    os.rmdir(path)
  return True


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
    ValueError: naming the file, when it is unreadable, truncated or altered.
  """
  path = os.path.join(directory, entry["file"])
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as err:
    raise ValueError(f"{path}: unreadable table checkpoint file: {err}") from err
  crc = zlib.crc32(data)
  if len(data) != entry["bytes"] or crc != entry["crc32"]:
    raise ValueError(f"{path}: table checkpoint file is corrupt (size {len(data)} vs "
                     f"{entry['bytes']}, crc32 {crc} vs {entry['crc32']})")
  return data


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
    touched = {int(k) for k in m["chunks"]}
    for ids in self._delta_ids:
      touched.update(np.unique(ids // CHUNK_ROWS).tolist())
    self.chunks = tuple(sorted(touched))  # chunks holding any stored row

  def delta_chunks(self) -> np.ndarray:
    """[K] int64 chunks that some delta changes (they differ from the base)."""
    if not self._delta_ids:
      return np.zeros((0,), np.int64)
    return np.unique(np.concatenate([ids // CHUNK_ROWS for ids in self._delta_ids]))

  def _rows(self, i: int) -> np.ndarray:
    if self._delta_rows[i] is None:
      d = self.manifest["deltas"][i]
      self._delta_rows[i] = _load_npy(self.directory, d["rows"],
                                      (d["count"], self.width + self.slot_width), np.float32)
    return self._delta_rows[i]

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
    else:  # the written rows only, last column their index in the chunk
      block = _load_npy(self.directory, entry, (entry["rows"], e + s + 1), np.float32)
      local = block[:, -1].astype(np.int64)
      if local.size and (local[0] < 0 or local[-1] >= n or np.any(np.diff(local) <= 0)
                         or not np.array_equal(local, block[:, -1])):
        raise ValueError(f"{os.path.join(self.directory, entry['file'])}: row indices are not "
                         f"sorted, distinct integers in [0, {n})")
      values, slots = np.zeros((n, e), np.float32), np.zeros((n, s), np.float32)
      flags = np.zeros((n,), np.bool_)
      values[local], slots[local], flags[local] = block[:, :e], block[:, e:e + s], True
    for i, ids in enumerate(self._delta_ids):
      a, b = np.searchsorted(ids, [lo, lo + n])
      if a == b:
        continue
      local, rows = ids[a:b] - lo, self._rows(i)[a:b]
      values[local], slots[local], flags[local] = rows[:, :e], rows[:, e:], True
    return values, slots, flags


def load_table(table: host_table_lib.HostTable, directory: str) -> int:
  """Restores a checkpoint into `table`, which must be freshly created (nothing written).

  Chunk by chunk (memory: one chunk plus the deltas' ids), each file's size and CRC-32
  checked before its rows are used; a corrupt file aborts a restore that must then be
  discarded with the table. Chunks that deltas changed are marked dirty, so the next
  base checkpoint rewrites them. Returns the number of chunks loaded.

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
  table.mark_dirty_chunks(reader.delta_chunks())
  table.flush()
  return len(reader.chunks)
