"""Checkpoint cost of a huge host table: base vs row-delta saves, stall vs total, verify, restore.

  python -m experiments.bench_checkpoint [--config=experiments/configs/bench_checkpoint.py[:smoke]]
      [--config.dir=/tmp/sfjax_bench_ckpt --config.rows=1e8 --config.out=ckpt.json]

A memory-mapped, lazily initialised `HostTable` of `rows` rows (width `width`, one
rowwise-AdaGrad slot) receives `steps` write-backs of `batch_rows` rows, drawn
Zipf(`zipf`) by row rank and spread over the table by a fixed odd multiplier (as
hashed ids are); then a first checkpoint (a *base*: every chunk holding a written row);
then `more_steps` more write-backs and an incremental checkpoint, which holds only
the rows written since (a *delta*), while `concurrent_steps` further write-backs run
during its background write (training goes on). For each save: the seconds `save`
blocked (the stall), the seconds until it was committed, bytes of new files, and for
the delta the bytes a chunk-granular increment would have rewritten (every written row of
each 65,536-row chunk one of its rows fell in). Then the seconds to verify every CRC
(`checkpoint.verify`) and to restore the newest checkpoint into a fresh mmap table
(checking the restored rows against the table as it was at the save). `run(config)`
returns the figures; the command ends stdout with them as one JSON line (also written
to `config.out`).

Old flag -> config field: each `--X` is `--config.X` (dir, rows, width, steps,
more_steps, batch_rows, zipf, concurrent_steps, keep_files, out).
"""

from __future__ import annotations

import functools
import os
import shutil
import time

import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments import cli
from sfjax.checkpoint import Checkpointer, verify
from sfjax.embedding import CHUNK_ROWS, HostTable
from sfjax.train import TrainState

SPREAD = 0x9E3779B97F4A7C15 % (1 << 61)  # odd multiplier: Zipf ranks -> spread-out row ids


def _write_backs(table: HostTable, rng: np.random.Generator, steps: int, batch_rows: int,
                 zipf: float) -> list[np.ndarray]:
  """`steps` write-backs of distinct Zipf-drawn rows; returns the ids of each."""
  written = []
  for _ in range(steps):
    ranks = (rng.zipf(zipf, batch_rows) - 1).astype(np.uint64)
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


def _timed_save(ckpt: Checkpointer, table: HostTable, step: int, previous: str | None,
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


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures."""
  root = config.dir
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  rows, width = int(config.rows), config.width
  write_backs = functools.partial(_write_backs, batch_rows=config.batch_rows, zipf=config.zipf)
  kw = {"seed": 0, "init_stddev": 0.01, "initial_slot_row": np.full(1, 0.1, np.float32)}
  t0 = time.perf_counter()
  table = HostTable.create_mmap(os.path.join(root, "table"), rows, width, 1, **kw)
  rng = np.random.default_rng(0)
  written = write_backs(table, rng, config.steps)
  write_seconds = time.perf_counter() - t0
  ckpt = Checkpointer(os.path.join(root, "checkpoints"), keep=2, host_table=table)
  full = _timed_save(ckpt, table, config.steps, None)
  since = np.unique(np.concatenate(write_backs(table, rng, config.more_steps)
                                   or [np.zeros(0, np.int64)]))
  probe = np.unique(np.concatenate([since[:4096], rng.integers(0, rows, 1024)])).astype(np.int64)
  expected = table.gather(probe)  # the table as the incremental checkpoint must hold it
  concurrent_rng = np.random.default_rng(1)
  incremental = _timed_save(ckpt, table, config.steps + config.more_steps, full["path"],
                            during=lambda: write_backs(table, concurrent_rng,
                                                       config.concurrent_steps))
  ckpt.close()
  # A chunk-granular increment rewrites every written row of each chunk a new row fell in.
  materialised = np.unique(np.concatenate([*written, since]))
  touched = np.isin(materialised // CHUNK_ROWS, np.unique(since // CHUNK_ROWS))
  chunk_equivalent = int(np.count_nonzero(touched)) * (width + 1 + 1) * 4

  t0 = time.perf_counter()
  verify(incremental["path"])
  verify_seconds = time.perf_counter() - t0
  fresh = HostTable.create_mmap(os.path.join(root, "restored"), rows, width, 1, **kw)
  reader = Checkpointer(os.path.join(root, "checkpoints"), keep=2, host_table=fresh)
  t0 = time.perf_counter()
  restored = reader.restore(incremental["path"], _state(0))
  restore_seconds = time.perf_counter() - t0
  reader.close()
  same = all(np.array_equal(a, b) for a, b in zip(expected, fresh.gather(probe), strict=True))
  result = {
      "benchmark": "bench_checkpoint", "table_rows": rows, "row_width": width, "slot_width": 1,
      "chunk_rows": CHUNK_ROWS, "table_chunks": -(-rows // CHUNK_ROWS),
      "table_bytes_if_dense": rows * (width + 1) * 4, "rows_materialised": table.num_materialised,
      "steps": config.steps, "more_steps": config.more_steps, "batch_rows": config.batch_rows,
      "zipf": config.zipf, "write_back_seconds": write_seconds,
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
      "concurrent_write_backs": config.concurrent_steps,
      "concurrent_write_back_seconds": incremental["during_seconds"],
      "snapshot_copies": incremental["snapshot_copies"],
      "snapshot_waits": incremental["snapshot_waits"],
      "verify_seconds": verify_seconds, "restore_seconds": restore_seconds,
      "restored_step": restored.step, "restored_rows_equal": bool(same),
  }
  table.close()
  fresh.close()
  if not config.keep_files:
    shutil.rmtree(root, ignore_errors=True)
  return result


if __name__ == "__main__":
  cli.run_benchmark("bench_checkpoint", run)
