"""Config of `python -m experiments.bench_ablation`: SFCTR's ablation on one workload.

Run:
  python -m experiments.bench_ablation --config=experiments/configs/bench_ablation.py \\
      [--config.steps=48 --config.batch_size=256 --config.plot=docs/ablation.png]
  python -m experiments.bench_ablation --config=experiments/configs/bench_ablation.py:smoke

Variants (the text after ':'): '' (48 steps of 256 examples, the first 24 untimed, on a 338k-row Criteo-like
table, 5% cache, 8 fake devices for rows d and e), 'smoke' (seconds: 6 steps of 16 on a
tiny table).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.steps = 48  # train steps per row
  c.warmup_steps = 24  # untimed first steps: they compile the cache step's bucket shapes
  c.batch_size = 256  # examples per step (divisible by `devices`)
  c.devices = 8  # devices of rows d and e (fake CPU devices without an accelerator)
  c.cache_fraction = 0.05  # device cache rows / table rows, in every cached row
  c.cardinality_scale = 0.01  # multiplies the Criteo per-field cardinalities (Zipf ids)
  c.embed_dim = 16  # embedding dim (DeepFM rows hold dim + 1 floats)
  c.mlp_dims = (64,)  # DeepFM MLP widths
  c.rows = "a,b,c,d,e"  # which ablation rows to run, comma-separated
  c.plot = ""  # also write the bar chart here (PNG)
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.steps, c.warmup_steps, c.batch_size, c.cardinality_scale = 6, 2, 16, 0.0005
    c.mlp_dims, c.embed_dim = (8,), 4
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
