"""A table of >= 1e9 rows trained through the MixCache on a 24 GiB machine.

  python -m experiments.bench_huge_table --host_path=/tmp/huge_table [--steps=150]

Synthetic Criteo-like data at `cardinality_scale=30` (26 fields, ~1.01e9 rows), a
memory-mapped host table initialised lazily (untouched rows cost no disk and no RAM),
a device cache of `--cache_rows` rows, so device memory is bounded by the cache, not by
the table. Prints the process's peak RSS, the disk the table really uses, the bytes
of device state, throughput and cache counters; ends with one JSON line (also --out).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time

import jax
from absl import app, flags, logging

from experiments import report
from experiments.configs import ctr as ctr_config
from sfjax.data import dataset as dataset_lib
from sfjax.train import loop

_HOST_PATH = flags.DEFINE_string("host_path", "/tmp/sfjax_huge_table", "Directory of the mmap table "
                                 "(deleted first if --overwrite).")
_OVERWRITE = flags.DEFINE_boolean("overwrite", True, "Delete an existing --host_path first.")
_SCALE = flags.DEFINE_float("cardinality_scale", 30.0, "Multiplier of Criteo's cardinalities.")
_STEPS = flags.DEFINE_integer("steps", 150, "Train steps.")
_BATCH = flags.DEFINE_integer("batch_size", 2048, "Examples per step.")
_CACHE = flags.DEFINE_integer("cache_rows", 1_000_000, "Device cache rows.")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")


def huge_config():
  """ctr.py with a >= 1e9-row synthetic table on the mmap-backed cache."""
  c = ctr_config.get_config()
  s = c.data.synthetic
  s.cardinality_scale, s.num_train, s.num_eval = _SCALE.value, 10_000_000, 20_000
  c.model.mlp_dims = (256, 256)
  e = c.embedding
  e.backend, e.host_storage, e.host_path = "cache", "mmap", _HOST_PATH.value
  e.cache_rows, e.lookahead, e.optimizer = float(_CACHE.value), 2, "adagrad"
  c.train.steps, c.train.batch_size = _STEPS.value, _BATCH.value
  c.train.eval_every, c.train.log_every, c.train.num_devices = _STEPS.value, 25, 1
  return c


def _disk_bytes(path: str) -> tuple[int, int]:
  out = subprocess.run(["du", "-sb", "--apparent-size", path], capture_output=True, text=True)
  apparent = int(out.stdout.split()[0]) if out.returncode == 0 else -1
  real = sum(os.stat(os.path.join(path, f)).st_blocks * 512 for f in os.listdir(path))
  return real, apparent


def main(argv):
  del argv
  logging.set_verbosity(logging.INFO)
  if _OVERWRITE.value and os.path.exists(_HOST_PATH.value):
    shutil.rmtree(_HOST_PATH.value)
  t0 = time.perf_counter()
  config = huge_config()
  data = dataset_lib.make_dataset(config.data, config.seed)
  trainer = loop.build_trainer(config, data.spec)
  final, state = loop.train_and_evaluate(config, dataset=data, trainer=trainer)
  wall = time.perf_counter() - t0
  backend = trainer.backend
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  real, apparent = _disk_bytes(_HOST_PATH.value)
  stats = final["cache_stats"]
  result = {
      "benchmark": "bench_huge_table", "table_rows": backend.num_rows,
      "row_width": trainer.width, "slot_width": backend.host_table.slot_width,
      "table_bytes_if_dense": backend.num_rows * stats["row_bytes"],
      "cache_rows": backend.num_slots, "device_state_bytes": state_bytes,
      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      "host_table_disk_bytes": real, "host_table_apparent_bytes": apparent,
      "rows_materialised": backend.host_table.num_materialised,
      "steps": _STEPS.value, "batch_size": _BATCH.value,
      "examples_per_sec": final["examples_per_sec"], "wall_seconds": wall,
      "auc": final["auc"], "oracle_auc": final["oracle_auc"],
      "cache_hit_rate": stats["cache_hit_rate"], "evictions": stats["evictions"],
      "h2d_bytes_per_example": stats["h2d_bytes_per_example"],
      "d2h_bytes_per_example": stats["d2h_bytes_per_example"],
      "stage_seconds": {k: stats[k] for k in ("loader_seconds", "manager_seconds",
                                              "manager_wait_seconds", "writeback_seconds",
                                              "device_wait_seconds")},
  }
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)
