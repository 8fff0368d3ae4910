"""Incremental, verifiable checkpoints of a `HostTable`: the format, and how one is written.

A checkpoint of the host table is a directory

  manifest.json        {"format", "version", "chunk_rows", "num_rows", "width", "slot_width",
                        "seed", "init_stddev", "initial_slot_row" (absent before it was
                        recorded), "tables" (per-table initial rows, only when a
                        layout's tables set their own), "dtype" (half-width rows only:
                        their values, stored as float32, are exactly that dtype's),
                        "chunks": {"<k>": {"file", "bytes", "crc32"}},
                        "deltas": [{"ids": {...}, "rows": {...}, "count"}], "delta_seq"}
  chunk_<k>.npy        float32 [m, E + S + 1]: the chunk's m written rows: values | optimizer
                       slots | the row's index in the chunk (version 1: all n rows, last
                       column the materialised flag)
  delta_<s>_<p>.ids.npy   int64 [m] sorted row ids written since the previous checkpoint
  delta_<s>_<p>.rows.npy  float32 [m, E + S] their values | optimizer slots

A table whose tables have their own embedding dims (`HostTableSpec.packed`) writes its
rows at each table's own width (version 3, entries marked `"packed": true`): a chunk file
is float32 `[m + P]`, the m rows' indices in the chunk then their kept values and kept
slots (`RowCodec`: `packed_rows.pack_sorted`, row after row, values before slots), and a
delta's rows file float32 `[P]` likewise; the columns past a table's dim are its
constants (0, the initial slot), restored on reading. Entries without the mark (written
before, linked into a later checkpoint) hold full rows and read as before.

The table is the chunk files (the *base*; a chunk absent from it holds only initial
rows) with the deltas applied in order. A checkpoint is one of two kinds
(`plan_save`):

* **delta**: only the rows written since the previous checkpoint (a `ChangeTracker`),
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

Every file's size and CRC-32 (`sfjax.core.digest`) is in the manifest; reading and
verifying is `sfjax.checkpoint.table_reader`. Rows are read through a copy-on-write
`TableSnapshot` (`sfjax.checkpoint.change_tracking`), so the files can be written on a
background thread while training goes on (`sfjax.checkpoint.checkpointer`). Atomicity is
the caller's: write into a fresh temporary directory and rename it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from typing import Any, NamedTuple

import numpy as np

from sfjax.checkpoint.change_tracking import ChangeTracker, TableSnapshot
from sfjax.checkpoint.read_retry import CheckpointReadError, read_retrying
from sfjax.core import digest
from sfjax.core.atomic import atomic_write
from sfjax.embedding import host_table as host_table_lib
from sfjax.embedding import host_table_files, host_table_spec, packed_rows

_FORMAT_NAME = "sfjax.table_checkpoint"
_FORMAT_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)  # version 1: chunks only, no deltas; 3: packed entries
MANIFEST_FILE = "manifest.json"
CHUNK_ROWS = host_table_lib.CHUNK_ROWS
_DELTA_PIECE_ROWS = 1 << 20  # rows per delta file (bounds one file's memory when loaded)
COMPACT_RATIO = 0.5  # deltas beyond this fraction of the base's bytes -> write a new base
_SPEC_KEYS = ("num_rows", "width", "slot_width", "seed", "init_stddev")


def _spec_dict(table: host_table_lib.HostTable) -> dict[str, Any]:
  s = table.spec
  out = {"num_rows": s.num_rows, "width": s.width, "slot_width": s.slot_width, "seed": s.seed,
         "init_stddev": s.init_stddev, "initial_slot_row": list(s.initial_slot_row)}
  if s.tables is not None:  # a layout's tables with their own initializer / optimizer
    out["tables"] = host_table_files.tables_json(s)
  if s.dtype != "float32":  # half-width rows: stored as float32 (exact), read back as `dtype`
    out["dtype"] = s.dtype
  return out


class RowCodec(NamedTuple):
  """How a packed table's rows are stored in its checkpoint files: each table's kept
  columns (`HostTableSpec.packing`), the others its constants.

  Attributes:
    values: the values' `PackedLayout`; value_fill: [T, E] their constants (0).
    slots: the slots' `PackedLayout`, or None (a row-wise accumulator: stored whole);
      slot_fill: [T, S] each table's initial slots.
  """

  values: packed_rows.PackedLayout
  value_fill: np.ndarray
  slots: packed_rows.PackedLayout | None
  slot_fill: np.ndarray

  def size(self, ids: np.ndarray) -> int:
    """float32 values `encode` stores for the ascending row ids `ids`."""
    slots = (ids.size * self.slot_fill.shape[1] if self.slots is None
             else packed_rows.packed_size(self.slots, ids))
    return packed_rows.packed_size(self.values, ids) + slots

  def encode(self, ids: np.ndarray, values: np.ndarray, slots: np.ndarray,
             where: str) -> np.ndarray:
    """float32 [size(ids)]: the rows' kept values, then their kept slots (ValueError naming
    `where` and the row for an unkept column that is not its table's constant)."""
    packed_values = packed_rows.pack_sorted(self.values, self.value_fill, ids,
                                            np.asarray(values, np.float32), where)
    packed_slots = (np.asarray(slots, np.float32).reshape(-1) if self.slots is None
                    else packed_rows.pack_sorted(self.slots, self.slot_fill, ids,
                                                 np.asarray(slots, np.float32), where))
    return np.concatenate([packed_values, packed_slots])

  def decode(self, ids: np.ndarray, flat: np.ndarray,
             where: str) -> tuple[np.ndarray, np.ndarray]:
    """(values [m, E], slots [m, S]) of `encode`'s `flat` for the same ids."""
    if flat.ndim != 1 or flat.size != self.size(ids):
      raise ValueError(f"{where}: holds {flat.size} values, the packed rows of its "
                       f"{ids.size} row ids take {self.size(ids)}")
    split = packed_rows.packed_size(self.values, ids)
    values = packed_rows.unpack_sorted(self.values, self.value_fill, ids, flat[:split], where)
    slots = (flat[split:].reshape(ids.size, self.slot_fill.shape[1]) if self.slots is None
             else packed_rows.unpack_sorted(self.slots, self.slot_fill, ids, flat[split:], where))
    return values, slots


def row_codec(spec: host_table_spec.HostTableSpec) -> RowCodec | None:
  """The `RowCodec` of a packed table's spec; None when every row is stored whole."""
  if not spec.packed:
    return None
  value_layout, slot_layout = spec.packing()
  inits = spec.table_inits()
  assert inits is not None
  t = value_layout.starts.size
  return RowCodec(value_layout, np.zeros((t, spec.width), np.float32), slot_layout,
                  np.asarray(inits.slot_rows, np.float32).reshape(t, spec.slot_width))


def manifest_codec(manifest: dict[str, Any], where: str) -> RowCodec:
  """The `RowCodec` of the table a manifest records (its packed entries' layout).

  Raises:
    ValueError: naming `where`, when the manifest's table is not packed or not readable.
  """
  try:
    spec = host_table_spec.spec_from_meta(manifest)
  except (KeyError, TypeError, ValueError) as err:
    raise ValueError(f"{where}: the table of packed rows is not readable: {err}") from err
  codec = row_codec(spec)
  if codec is None:
    raise ValueError(f"{where}: holds packed rows, but the manifest's tables all store full "
                     "rows (no table dim below latent_dim)")
  return codec


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
  return {"file": name, **digest.bytes_digest(data)}


def _link(previous: str | None, directory: str, entry: dict[str, Any]) -> dict[str, Any]:
  if previous is None:
    raise ValueError(f"{directory}: {entry['file']} is kept from a previous checkpoint, but "
                     "there is none")
  src, dst = os.path.join(previous, entry["file"]), os.path.join(directory, entry["file"])
  try:
    os.link(src, dst)  # same inode: never modified in place, so sharing is safe
  except OSError:
    shutil.copyfile(src, dst)
  return dict(entry)


def _read_text(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def read_manifest(directory: str) -> dict[str, Any]:
  """Loads `directory/manifest.json`; errors name the file."""
  path = os.path.join(directory, MANIFEST_FILE)
  try:
    manifest = json.loads(read_retrying(lambda: _read_text(path), path))
  except CheckpointReadError:
    raise  # unreadable for now, not corrupt
  except (OSError, ValueError) as err:
    raise ValueError(f"{path}: unreadable table checkpoint manifest: {err}") from err
  if not isinstance(manifest, dict) or manifest.get("format") != _FORMAT_NAME \
      or manifest.get("version") not in _READABLE_VERSIONS:
    raise ValueError(f"{path}: not a {_FORMAT_NAME} manifest of version {_READABLE_VERSIONS}")
  manifest.setdefault("deltas", [])
  manifest.setdefault("delta_seq", 0)
  return manifest


def check_compatible(manifest: dict[str, Any], table: host_table_lib.HostTable,
                     where: str) -> None:
  """Raises ValueError naming `where` unless the manifest's table spec and chunk size are
  `table`'s (rows, width, slot width, seed, init scale; initial slots where recorded)."""
  expected = _spec_dict(table)
  keys = _SPEC_KEYS + (("initial_slot_row",) if "initial_slot_row" in manifest else ())
  for key in keys + ("tables",):
    if manifest.get(key) != expected.get(key):
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


def plan_save(tracker: ChangeTracker, previous: str | None,
              compact_ratio: float = COMPACT_RATIO) -> SavePlan:
  """Takes the table's dirty state and decides between a delta and a base checkpoint.

  Pops the dirty rows (and, for a base, the dirty chunks); `unplan_save` puts them back
  if the checkpoint is not committed. Call it with the table quiescent (flushed).

  Args:
    tracker: the host table's change tracker.
    previous: the previous checkpoint's table directory (None: none; a base is written).
    compact_ratio: write a base once the deltas would exceed this times the base bytes.
  """
  table = tracker.table
  rows = tracker.pop_dirty_rows()
  if previous:
    old = read_manifest(previous)
    check_compatible(old, table, os.path.join(previous, MANIFEST_FILE))
    codec = row_codec(table.spec)
    stored = (rows.size * 4 * (table.width + table.slot_width) if codec is None
              else 4 * codec.size(rows))
    if _delta_bytes(old) + 8 * rows.size + stored <= compact_ratio * _base_bytes(old):
      return SavePlan("delta", np.unique(rows // CHUNK_ROWS), rows)
  return SavePlan("base", tracker.pop_dirty_chunks(), rows)


def capture(tracker: ChangeTracker, plan: SavePlan,
            budget_bytes: int) -> tuple[SavePlan, TableSnapshot]:
  """Fixes what `plan` will write, as of now, so training may write on.

  A delta whose rows fit in `budget_bytes` is copied at once (its rows only: a Zipf
  tail spreads them over every chunk, so a chunk snapshot would copy far more);
  otherwise a copy-on-write snapshot over `plan.chunks` is opened with that budget.

  Returns:
    (the plan, with `gathered` set for a copied delta; the snapshot to read and close).
  """
  table = tracker.table
  row_bytes = 4 * (table.width + table.slot_width)
  if plan.kind == "delta" and plan.rows.size * row_bytes <= budget_bytes:
    plan = plan._replace(gathered=table.gather(plan.rows))
    return plan, tracker.begin_snapshot([], budget_bytes)
  return plan, tracker.begin_snapshot(plan.chunks, budget_bytes)


def unplan_save(tracker: ChangeTracker, plan: SavePlan) -> None:
  """Marks a failed checkpoint's rows (and base chunks) dirty again."""
  tracker.mark_dirty_rows(plan.rows)
  if plan.kind == "base":
    tracker.mark_dirty_chunks(plan.chunks)


def write_table(snapshot: TableSnapshot, table: host_table_lib.HostTable, directory: str,
                plan: SavePlan, previous: str | None) -> dict[str, Any]:
  """Writes the checkpoint `plan` describes into the new directory `directory`.

  Args:
    snapshot: the table's snapshot over `plan.chunks` (`ChangeTracker.begin_snapshot`),
      taken when the plan was made; each chunk is read from it once.
    table: the host table (its spec).
    directory: where to write (created; must not exist).
    plan: from `plan_save` (the same `previous`).
    previous: the previous checkpoint's table directory, or None.

  Returns:
    The manifest (also written as `directory/manifest.json`, last).
  """
  os.makedirs(directory)
  old: dict[str, Any] = (read_manifest(previous) if previous
                         else {"chunks": {}, "deltas": [], "delta_seq": 0})
  chunks: dict[str, dict[str, Any]] = {}
  deltas: list[dict[str, Any]] = []
  codec = row_codec(table.spec)
  if plan.kind == "base":
    rewritten = {int(k) for k in plan.chunks}
    for k in sorted(rewritten):
      values, slots, flags = snapshot.read_chunk(k)
      if flags.any():
        local = np.flatnonzero(flags)  # only written rows: a sparse table's base stays small
        chunks[str(k)] = _write_chunk(directory, k, local, values[local], slots[local], codec)
    for key, entry in old["chunks"].items():
      if int(key) not in rewritten:
        chunks[key] = _link(previous, directory, entry)
  else:
    for key, entry in old["chunks"].items():
      chunks[key] = _link(previous, directory, entry)
    for d in old["deltas"]:
      deltas.append({"ids": _link(previous, directory, d["ids"]),
                     "rows": _link(previous, directory, d["rows"]), "count": d["count"]})
    deltas += _write_deltas(snapshot, directory, plan, f"delta_{old['delta_seq']:06d}", codec)
  manifest = {"format": _FORMAT_NAME, "version": _FORMAT_VERSION, "chunk_rows": CHUNK_ROWS,
              **_spec_dict(table),
              "chunks": dict(sorted(chunks.items(), key=lambda x: int(x[0]))),
              "deltas": deltas, "delta_seq": old["delta_seq"] + (plan.kind == "delta")}
  atomic_write(os.path.join(directory, MANIFEST_FILE), json.dumps(manifest, indent=1))
  return manifest


def save_table(tracker: ChangeTracker, directory: str, previous: str | None,
               compact_ratio: float = COMPACT_RATIO) -> dict[str, Any]:
  """Plans and writes one table checkpoint synchronously (`plan_save` + `write_table`).

  On failure the table's dirty state is put back (`unplan_save`). Returns the manifest.
  """
  plan, snapshot = capture(tracker, plan_save(tracker, previous, compact_ratio), budget_bytes=0)
  try:
    return write_table(snapshot, tracker.table, directory, plan, previous)
  except BaseException:
    unplan_save(tracker, plan)
    raise
  finally:
    snapshot.close()


def _write_chunk(directory: str, k: int, local: np.ndarray, values: np.ndarray,
                 slots: np.ndarray, codec: RowCodec | None) -> dict[str, Any]:
  """Writes chunk `k`'s written rows (`local` [m]: their indices in the chunk); its entry."""
  where = os.path.join(directory, _chunk_file(k))
  index = local.astype(np.float32)  # exact below 2**24
  if codec is None:
    block = np.concatenate([values.astype(np.float32), slots, index[:, None]], axis=1)
    return dict(_write_file(directory, _chunk_file(k), _npy_bytes(block)), rows=int(local.size))
  flat = np.concatenate([index, codec.encode(k * CHUNK_ROWS + local, values, slots, where)])
  return dict(_write_file(directory, _chunk_file(k), _npy_bytes(flat)), rows=int(local.size),
              packed=True)


def _write_deltas(snapshot: TableSnapshot, directory: str, plan: SavePlan,
                  prefix: str, codec: RowCodec | None) -> list[dict[str, Any]]:
  """The dirty rows, read chunk by chunk from the snapshot, in files of <= DELTA_PIECE_ROWS
  (at each table's own width with a `codec`)."""
  out: list[dict[str, Any]] = []
  ids_buf: list[np.ndarray] = []
  rows_buf: list[np.ndarray] = []
  count = 0

  def emit():
    nonlocal ids_buf, rows_buf, count
    name = f"{prefix}_{len(out):04d}"
    ids, rows = np.concatenate(ids_buf), np.concatenate(rows_buf)
    rows_entry: dict[str, Any]
    if codec is None:
      rows_entry = _write_file(directory, name + ".rows.npy", _npy_bytes(rows))
    else:
      width = codec.values.columns
      flat = codec.encode(ids, rows[:, :width], rows[:, width:],
                          os.path.join(directory, name + ".rows.npy"))
      rows_entry = dict(_write_file(directory, name + ".rows.npy", _npy_bytes(flat)), packed=True)
    out.append({"ids": _write_file(directory, name + ".ids.npy", _npy_bytes(ids)),
                "rows": rows_entry, "count": int(ids.size)})
    ids_buf, rows_buf, count = [], [], 0

  if plan.gathered is not None:
    block = np.concatenate(plan.gathered, axis=1)
    for start in range(0, plan.rows.size, _DELTA_PIECE_ROWS):
      ids_buf.append(plan.rows[start:start + _DELTA_PIECE_ROWS])
      rows_buf.append(block[start:start + _DELTA_PIECE_ROWS])
      emit()
    return out
  bounds = np.searchsorted(plan.rows, plan.chunks * CHUNK_ROWS)
  stops = list(bounds[1:]) + [plan.rows.size]
  for k, start, stop in zip(plan.chunks.tolist(), bounds, stops, strict=True):
    values, slots, _ = snapshot.read_chunk(k)
    local = plan.rows[start:stop] - k * CHUNK_ROWS
    ids_buf.append(plan.rows[start:stop])
    rows_buf.append(np.concatenate([values[local].astype(np.float32), slots[local]], axis=1))
    count += local.size
    if count >= _DELTA_PIECE_ROWS:
      emit()
  if count:
    emit()
  return out
