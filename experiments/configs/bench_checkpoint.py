"""Config of `python -m experiments.bench_checkpoint`: checkpoint cost of a huge host table.

Run:
  python -m experiments.bench_checkpoint --config=experiments/configs/bench_checkpoint.py \\
      --config.dir=/tmp/sfjax_bench_ckpt [--config.rows=1e8 --config.out=ckpt.json]
  python -m experiments.bench_checkpoint --config=experiments/configs/bench_checkpoint.py:smoke

Variants (the text after ':'): '' (a 1e8-row table, 300 + 20 write-backs of 8192 rows),
'smoke' (seconds: 300k rows of width 4, 20 + 1 write-backs of 256 rows).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.dir = "/tmp/sfjax_bench_checkpoint"  # scratch directory (deleted first, and at the end
  # unless keep_files)
  c.rows = 1e8  # host table rows
  c.width = 16  # embedding width E
  c.steps = 300  # write-backs before the first (full) checkpoint
  c.more_steps = 20  # write-backs before the incremental checkpoint
  c.batch_rows = 8192  # rows per write-back (before deduplication)
  c.zipf = 1.3  # Zipf exponent of the row ranks written
  c.concurrent_steps = 20  # write-backs run while the incremental save writes in the background
  c.keep_files = False  # keep the table and checkpoints
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.rows, c.width, c.steps, c.more_steps = 300_000.0, 4, 20, 1
    c.batch_rows, c.zipf, c.concurrent_steps = 256, 1.1, 3
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
