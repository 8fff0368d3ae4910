"""A table of >= 1e9 rows trained through the MixCache on a 24 GiB machine.

  python -m experiments.bench_huge_table [--config=experiments/configs/bench_huge_table.py[:smoke]]
      [--config.host_path=/tmp/huge_table --config.steps=150 --config.out=huge.json]

Synthetic Criteo-like data at `cardinality_scale=30` (26 fields, ~1.01e9 rows), a
memory-mapped host table initialised lazily (untouched rows cost no disk and no RAM),
a device cache of `--cache_rows` rows, so device memory is bounded by the cache, not by
the table. Prints the process's peak RSS, the disk the table really uses, the bytes
of device state, throughput and cache counters. `run(config)` returns the figures; the
command ends stdout with them as one JSON line (also written to `config.out`).

Old flag -> config field: each `--X` is `--config.X` (host_path, overwrite,
cardinality_scale, steps, batch_size, cache_rows, out).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time

import jax
import ml_collections
from absl import logging

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.data import make_dataset
from sfjax.train import build_trainer, train_and_evaluate


def huge_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """ctr.py with the benchmark's (>= 1e9-row) synthetic table on the mmap-backed cache."""
  c = ctr_config.get_config()
  s = c.data.synthetic
  s.cardinality_scale, s.num_train, s.num_eval = config.cardinality_scale, 10_000_000, 20_000
  c.model.mlp_dims = (256, 256)
  e = c.embedding
  e.backend, e.host_storage, e.host_path = "cache", "mmap", config.host_path
  e.cache_rows, e.lookahead, e.optimizer = float(config.cache_rows), 2, "adagrad"
  c.train.steps, c.train.batch_size = config.steps, config.batch_size
  c.train.eval_every, c.train.log_every, c.train.num_devices = config.steps, 25, 1
  return c


def _disk_bytes(path: str) -> tuple[int, int]:
  out = subprocess.run(["du", "-sb", "--apparent-size", path], capture_output=True, text=True)
  apparent = int(out.stdout.split()[0]) if out.returncode == 0 else -1
  real = sum(os.stat(os.path.join(path, f)).st_blocks * 512 for f in os.listdir(path))
  return real, apparent


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures."""
  logging.set_verbosity(logging.INFO)
  if config.overwrite and os.path.exists(config.host_path):
    shutil.rmtree(config.host_path)
  t0 = time.perf_counter()
  train_config = huge_config(config)
  data = make_dataset(train_config.data, train_config.seed)
  trainer = build_trainer(train_config, data.spec)
  final, state = train_and_evaluate(train_config, dataset=data, trainer=trainer)
  wall = time.perf_counter() - t0
  backend = trainer.backend
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  real, apparent = _disk_bytes(config.host_path)
  stats = final["cache_stats"]
  result = {
      "benchmark": "bench_huge_table", "table_rows": backend.num_rows,
      "row_width": trainer.width, "slot_width": backend.host_table.slot_width,
      "table_bytes_if_dense": backend.num_rows * stats["row_bytes"],
      "cache_rows": backend.num_slots, "device_state_bytes": state_bytes,
      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      "host_table_disk_bytes": real, "host_table_apparent_bytes": apparent,
      "rows_materialised": backend.host_table.num_materialised,
      "steps": config.steps, "batch_size": config.batch_size,
      "examples_per_sec": final["examples_per_sec"], "wall_seconds": wall,
      "auc": final["auc"], "oracle_auc": final["oracle_auc"],
      "cache_hit_rate": stats["cache_hit_rate"], "evictions": stats["evictions"],
      "h2d_bytes_per_example": stats["h2d_bytes_per_example"],
      "d2h_bytes_per_example": stats["d2h_bytes_per_example"],
      "stage_seconds": {k: stats[k] for k in ("loader_seconds", "manager_seconds",
                                              "manager_wait_seconds", "writeback_seconds",
                                              "device_wait_seconds")},
  }
  return result


if __name__ == "__main__":
  cli.run_benchmark("bench_huge_table", run)
