"""Config of `python -m experiments.bench_host_cohort`: W trials through one host table vs W
separate cache runs (issue #26 item 2).

Run:
  python -m experiments.bench_host_cohort --config=experiments/configs/bench_host_cohort.py \\
      [--config.widths=1,4,8 --config.steps=40 --config.out=h.json]
  python -m experiments.bench_host_cohort --config=experiments/configs/bench_host_cohort.py:smoke

Variants (the text after ':'): '' (widths 1, 4, 8; 40 steps of batch 128 over a ~340k-row
table behind a 4,096-row cache), 'smoke' (seconds: widths 1, 2; 3 steps; ~34k rows, 900-row cache).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.widths = (1, 4, 8)  # cohort widths W; 1 is the separate run every width is compared with
  c.steps = 40  # train steps per run
  c.batch_size = 128  # examples per train step
  c.cardinality_scale = 0.01  # synthetic Criteo table size (~340k rows at 0.01)
  c.cache_rows = 4096  # device cache rows (>= lookahead x batch_size x 26 fields)
  c.cache_lookahead = 1  # steps planned ahead
  c.eval_rows = 1024  # eval examples per trial
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.widths, c.steps, c.batch_size, c.cardinality_scale, c.cache_rows = (1, 2), 3, 32, 0.001, 900
    c.eval_rows = 256
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
