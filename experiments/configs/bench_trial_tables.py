"""Config of `python -m experiments.bench_trial_tables`: full trial tables vs touched rows.

Run:
  python -m experiments.bench_trial_tables --config=experiments/configs/bench_trial_tables.py \\
      [--config.trials=32 --config.scales=0.01,0.03,0.1,0.3,1,3 --config.out=t.json]
  python -m experiments.bench_trial_tables --config=experiments/configs/bench_trial_tables.py:smoke

Variants (the text after ':'): '' (32 trials, scales 0.01 .. 3), 'smoke' (seconds: 2 trials,
one tiny scale, 2 steps).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.trials = 32  # trials in the cohort
  c.scales = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)  # synthetic cardinality scales (V grows with them)
  c.steps = 20  # train steps per trial
  c.batch_size = 128  # examples per train step
  c.eval_rows = 2048  # eval examples per trial
  c.memory_fraction = 0.7  # run a point only if its estimate is below this share of memory
  c.timeout = 900  # seconds one point may take
  c.point = ""  # internal: run one point 'scale,compact' in this process and return it
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.trials, c.scales, c.steps, c.batch_size, c.eval_rows = 2, (0.001,), 2, 32, 256
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
