"""Checkpoint cost of a huge host table: full vs incremental save, verify, restore.

  python -m experiments.bench_checkpoint --dir=/tmp/sfjax_bench_ckpt [--rows=1e8]

A memory-mapped, lazily initialised `HostTable` of `--rows` rows (width `--width`, one
rowwise-AdaGrad slot) receives `--steps` write-backs of `--batch_rows` rows, drawn
Zipf(`--zipf`) by row rank (popular ids are dense at the low end of the table, the tail
spreads over it, as write-backs of a cache do); then a first, full checkpoint
(`sfjax.train.checkpoint.Checkpointer`, every dirty chunk written); then `--more_steps`
more write-backs and an incremental checkpoint (only chunks written since are new
files, the rest hard-linked). Reports for each save its seconds, bytes of new files and
chunk counts; then the seconds to verify every CRC (`checkpoint.verify`) and to restore
the newest checkpoint into a fresh mmap table (and checks the restored rows). Only
dirty chunks are ever written, so disk use is bounded by the rows touched, not by
`--rows`. Ends with one JSON line (also --out).
"""

from __future__ import annotations

import os
import shutil
import time

import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from experiments import report
from sfjax.embedding.host_table import CHUNK_ROWS
from sfjax.embedding.host_table import HostTable
from sfjax.train import checkpoint
from sfjax.train.state import TrainState

_DIR = flags.DEFINE_string("dir", "/tmp/sfjax_bench_checkpoint", "Scratch directory (deleted "
                           "first and at the end unless --keep_files).")
_ROWS = flags.DEFINE_float("rows", 1e8, "Host table rows.")
_WIDTH = flags.DEFINE_integer("width", 16, "Embedding width E.")
_STEPS = flags.DEFINE_integer("steps", 300, "Write-backs before the first (full) checkpoint.")
_MORE = flags.DEFINE_integer("more_steps", 20, "Write-backs before the incremental checkpoint.")
_BATCH = flags.DEFINE_integer("batch_rows", 8192, "Rows per write-back (before deduplication).")
_ZIPF = flags.DEFINE_float("zipf", 1.3, "Zipf exponent of the row ranks written.")
_KEEP = flags.DEFINE_boolean("keep_files", False, "Keep the table and checkpoints.")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")


def _write_backs(table: HostTable, rng: np.random.Generator, steps: int) -> None:
  for _ in range(steps):
    ids = np.unique((rng.zipf(_ZIPF.value, _BATCH.value) - 1) % table.num_rows).astype(np.int64)
    values = rng.standard_normal((ids.size, table.width), dtype=np.float32)
    slots = rng.random((ids.size, table.slot_width), dtype=np.float32)
    table.scatter(ids, values, slots)


def _new_bytes(path: str, previous: str | None) -> tuple[int, int, int]:
  """(bytes of files new in checkpoint `path`, new table chunks, hard-linked table chunks)."""
  old_inodes = set()
  if previous:
    for d, _, names in os.walk(previous):
      old_inodes.update(os.stat(os.path.join(d, n)).st_ino for n in names)
  size = new_chunks = linked = 0
  for d, _, names in os.walk(path):
    for n in names:
      st = os.stat(os.path.join(d, n))
      is_chunk = n.startswith("chunk_")
      if st.st_ino in old_inodes:
        linked += is_chunk
      else:
        size, new_chunks = size + st.st_size, new_chunks + is_chunk
  return size, new_chunks, linked


def _state(step: int) -> TrainState:
  return TrainState(jnp.int32(step), {"w": jnp.zeros((256,))}, {"m": jnp.zeros((256,))}, None)


def _timed_save(ckpt: checkpoint.Checkpointer, table: HostTable, step: int,
                previous: str | None) -> dict:
  table.flush()  # as Backend.sync does before a save
  t0 = time.perf_counter()
  path = ckpt.save(_state(step), {"history": []})
  seconds = time.perf_counter() - t0
  size, new_chunks, linked = _new_bytes(path, previous)
  return {"seconds": seconds, "bytes_written": size, "chunks_written": new_chunks,
          "chunks_linked": linked, "path": path}


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
  _write_backs(table, rng, _STEPS.value)
  write_seconds = time.perf_counter() - t0
  ckpt = checkpoint.Checkpointer(os.path.join(root, "checkpoints"), keep=2, host_table=table)
  full = _timed_save(ckpt, table, _STEPS.value, None)
  _write_backs(table, rng, _MORE.value)
  incremental = _timed_save(ckpt, table, _STEPS.value + _MORE.value, full["path"])
  ckpt.close()

  t0 = time.perf_counter()
  checkpoint.verify(incremental["path"])
  verify_seconds = time.perf_counter() - t0
  fresh = HostTable.create_mmap(os.path.join(root, "restored"), rows, width, 1, **kw)
  reader = checkpoint.Checkpointer(os.path.join(root, "checkpoints"), keep=2, host_table=fresh)
  t0 = time.perf_counter()
  restored = reader.restore(incremental["path"], _state(0))
  restore_seconds = time.perf_counter() - t0
  reader.close()
  probe = np.unique(np.concatenate([
      (rng.zipf(_ZIPF.value, 4096) - 1) % rows, rng.integers(0, rows, 1024)])).astype(np.int64)
  same = all(np.array_equal(a, b) for a, b in zip(table.gather(probe), fresh.gather(probe)))
  result = {
      "benchmark": "bench_checkpoint", "table_rows": rows, "row_width": width, "slot_width": 1,
      "chunk_rows": CHUNK_ROWS, "table_chunks": -(-rows // CHUNK_ROWS),
      "table_bytes_if_dense": rows * (width + 1) * 4, "rows_materialised": table.num_materialised,
      "steps": _STEPS.value, "more_steps": _MORE.value, "batch_rows": _BATCH.value,
      "zipf": _ZIPF.value, "write_back_seconds": write_seconds,
      "full_save_seconds": full["seconds"], "full_save_bytes": full["bytes_written"],
      "full_save_chunks": full["chunks_written"],
      "incremental_save_seconds": incremental["seconds"],
      "incremental_save_bytes": incremental["bytes_written"],
      "incremental_save_chunks": incremental["chunks_written"],
      "incremental_chunks_linked": incremental["chunks_linked"],
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
