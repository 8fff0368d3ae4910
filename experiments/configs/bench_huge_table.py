"""Config of `python -m experiments.bench_huge_table`: a >= 1e9-row table through the MixCache.

Run:
  python -m experiments.bench_huge_table --config=experiments/configs/bench_huge_table.py \\
      --config.host_path=/tmp/huge_table [--config.steps=150 --config.out=huge.json]
  python -m experiments.bench_huge_table --config=experiments/configs/bench_huge_table.py:smoke

Variants (the text after ':'): '' (cardinality scale 30: ~1.01e9 rows), 'smoke' (seconds:
a ~34k-row table, 4 steps of 32 examples through a 20k-row cache).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.host_path = "/tmp/sfjax_huge_table"  # directory of the mmap table (deleted first if overwrite)
  c.overwrite = True  # delete an existing host_path first
  c.cardinality_scale = 30.0  # multiplier of Criteo's cardinalities
  c.steps = 150  # train steps
  c.batch_size = 2048  # examples per step
  c.cache_rows = 1_000_000  # device cache rows
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.cardinality_scale, c.steps, c.batch_size, c.cache_rows = 1e-3, 4, 32, 20_000
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
