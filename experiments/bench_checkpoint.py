"""Checkpoint cost of a huge host table: base vs row-delta saves, stall vs total, verify, restore.

  python -m experiments.bench_checkpoint --dir=/tmp/sfjax_bench_ckpt [--rows=1e8]

A memory-mapped, lazily initialised `HostTable` of `--rows` rows (width `--width`, one
rowwise-AdaGrad slot) receives `--steps` write-backs of `--batch_rows` rows, drawn
Zipf(`--zipf`) by row rank and spread over the table by a fixed odd multiplier (as
hashed ids are); then a first checkpoint (a *base*: every chunk holding a written row);
then `--more_steps` more write-backs and an incremental checkpoint, which holds only
the rows written since (a *delta*), while `--concurrent_steps` further write-backs run
during its background write (training goes on). For each save: the seconds `save`
blocked (the stall), the seconds until it was committed, bytes of new files, and for
the delta the bytes a chunk-granular increment would have rewritten (every written row of
each 65,536-row chunk one of its rows fell in). Then the seconds to verify every CRC
(`checkpoint.verify`) and to restore the newest checkpoint into a fresh mmap table
(checking the restored rows against the table as it was at the save). Ends with one
JSON line (also --out).
"""

from __future__ import annotations

import os
import shutil
import time

import jax.numpy as jnp
import numpy as np
from absl import app, flags

from experiments import report
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable
from sfjax.train.state import TrainState

_DIR = flags.DEFINE_string("dir", "/tmp/sfjax_bench_checkpoint", "Scratch directory (deleted "
                           "first and at the end unless --keep_files).")
_ROWS = flags.DEFINE_float("rows", 1e8, "Host table rows.")
_WIDTH = flags.DEFINE_integer("width", 16, "Embedding width E.")
_STEPS = flags.DEFINE_integer("steps", 300, "Write-backs before the first (full) checkpoint.")
_MORE = flags.DEFINE_integer("more_steps", 20, "Write-backs before the incremental checkpoint.")
_BATCH = flags.DEFINE_integer("batch_rows", 8192, "Rows per write-back (before deduplication).")
_ZIPF = flags.DEFINE_float("zipf", 1.3, "Zipf exponent of the row ranks written.")
_CONCURRENT = flags.DEFINE_integer("concurrent_steps", 20, "Write-backs run while the "
                                   "incremental save writes in the background.")
_KEEP = flags.DEFINE_boolean("keep_files", False, "Keep the table and checkpoints.")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")


SPREAD = 0x9E3779B97F4A7C15 % (1 << 61)  # odd multiplier: Zipf ranks -> spread-out row ids


def _write_backs(table: HostTable, rng: np.random.Generator, steps: int) -> list[np.ndarray]:
  """`steps` write-backs of distinct Zipf-drawn rows; returns the ids of each."""
  written = []
  for _ in range(steps):
    ranks = (rng.zipf(_ZIPF.value, _BATCH.value) - 1).astype(np.uint64)
    ids = np.unique((ranks * np.uint64(SPREAD)) % np.uint64(table.num_rows)).astype(np.int64)
    values = rng.standard_normal((ids.size, table.width), dtype=np.float32)
    slots = rng.random((ids.size, table.slot_width), dtype=np.float32)
    table.scatter(ids, values, slots)
    written.append(ids)
  return written


def _new_bytes(path: str, previous: str | None) -> int:
  """Bytes of the files under `path` that are not hard links into `previous`."""
  old_inodes = set()
  if previous:
    for d, _, names in os.walk(previous):
      old_inodes.update(os.stat(os.path.join(d, n)).st_ino for n in names)
  size = 0
  for d, _, names in os.walk(path):
    for n in names:
      st = os.stat(os.path.join(d, n))
      if st.st_ino not in old_inodes:
        size += st.st_size
  return size


def _state(step: int) -> TrainState:
  return TrainState(jnp.int32(step), {"w": jnp.zeros((256,))}, {"m": jnp.zeros((256,))}, None)


def _timed_save(ckpt: checkpoint.Checkpointer, table: HostTable, step: int, previous: str | None,
                during=None) -> dict:
  """One save: stall (until `save` returns) and commit seconds; `during()` runs meanwhile."""
  table.flush()  # as Backend.sync does before a save
  t0 = time.perf_counter()
  ckpt.save(_state(step), {"history": []})
  stall = time.perf_counter() - t0
  during_seconds = 0.0
  if during is not None:
    t1 = time.perf_counter()
    during()
    during_seconds = time.perf_counter() - t1
  path = ckpt.wait()
  return {"stall_seconds": stall, "commit_seconds": ckpt.last_save["seconds"], "during_seconds": during_seconds,
          "bytes_written": _new_bytes(path, previous),
          "table_bytes_written": _new_bytes(os.path.join(path, "table"),
                                            previous and os.path.join(previous, "table")),
          "kind": ckpt.last_save["kind"],
          "rows": ckpt.last_save["rows"], "snapshot_copies": ckpt.last_save["snapshot_copies"],
          "snapshot_waits": ckpt.last_save["snapshot_waits"], "path": path}


def main(argv):
  del argv
  root = _DIR.value
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  rows, width = int(_ROWS.value), _WIDTH.value
  kw = {"seed": 0, "init_stddev": 0.01, "initial_slot_row": np.full(1, 0.1, np.float32)}
  t0 = time.perf_counter()
  table = HostTable.create_mmap(os.path.join(root, "table"), rows, width, 1, **kw)
  rng = np.random.default_rng(0)
  written = _write_backs(table, rng, _STEPS.value)
  write_seconds = time.perf_counter() - t0
  ckpt = checkpoint.Checkpointer(os.path.join(root, "checkpoints"), keep=2, host_table=table)
  full = _timed_save(ckpt, table, _STEPS.value, None)
  since = np.unique(np.concatenate(_write_backs(table, rng, _MORE.value) or [np.zeros(0, np.int64)]))
  probe = np.unique(np.concatenate([since[:4096], rng.integers(0, rows, 1024)])).astype(np.int64)
  expected = table.gather(probe)  # the table as the incremental checkpoint must hold it
  concurrent_rng = np.random.default_rng(1)
  incremental = _timed_save(ckpt, table, _STEPS.value + _MORE.value, full["path"],
                            during=lambda: _write_backs(table, concurrent_rng, _CONCURRENT.value))
  ckpt.close()
  # A chunk-granular increment rewrites every written row of each chunk a new row fell in.
  materialised = np.unique(np.concatenate([*written, since]))
  touched = np.isin(materialised // CHUNK_ROWS, np.unique(since // CHUNK_ROWS))
  chunk_equivalent = int(np.count_nonzero(touched)) * (width + 1 + 1) * 4

  t0 = time.perf_counter()
  checkpoint.verify(incremental["path"])
  verify_seconds = time.perf_counter() - t0
  fresh = HostTable.create_mmap(os.path.join(root, "restored"), rows, width, 1, **kw)
  reader = checkpoint.Checkpointer(os.path.join(root, "checkpoints"), keep=2, host_table=fresh)
  t0 = time.perf_counter()
  restored = reader.restore(incremental["path"], _state(0))
  restore_seconds = time.perf_counter() - t0
  reader.close()
  same = all(np.array_equal(a, b) for a, b in zip(expected, fresh.gather(probe)))
  result = {
      "benchmark": "bench_checkpoint", "table_rows": rows, "row_width": width, "slot_width": 1,
      "chunk_rows": CHUNK_ROWS, "table_chunks": -(-rows // CHUNK_ROWS),
      "table_bytes_if_dense": rows * (width + 1) * 4, "rows_materialised": table.num_materialised,
      "steps": _STEPS.value, "more_steps": _MORE.value, "batch_rows": _BATCH.value,
      "zipf": _ZIPF.value, "write_back_seconds": write_seconds,
      "full_save_kind": full["kind"], "full_save_stall_seconds": full["stall_seconds"],
      "full_save_seconds": full["commit_seconds"], "full_save_bytes": full["bytes_written"],
      "incremental_save_kind": incremental["kind"],
      "incremental_save_rows": incremental["rows"],
      "incremental_save_stall_seconds": incremental["stall_seconds"],
      "incremental_save_seconds": incremental["commit_seconds"],
      "incremental_save_bytes": incremental["bytes_written"],
      "incremental_table_bytes": incremental["table_bytes_written"],
      "chunk_increment_bytes_equivalent": chunk_equivalent,
      "chunks_touched_since_base": int(np.unique(since // CHUNK_ROWS).size),
      "concurrent_write_backs": _CONCURRENT.value,
      "concurrent_write_back_seconds": incremental["during_seconds"],
      "snapshot_copies": incremental["snapshot_copies"],
      "snapshot_waits": incremental["snapshot_waits"],
      "verify_seconds": verify_seconds, "restore_seconds": restore_seconds,
      "restored_step": restored.step, "restored_rows_equal": bool(same),
  }
  table.close()
  fresh.close()
  if not _KEEP.value:
    shutil.rmtree(root, ignore_errors=True)
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)
