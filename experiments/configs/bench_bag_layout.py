"""Config of `python -m experiments.bench_bag_layout`: padded bags vs values + offsets.

Run:
  python -m experiments.bench_bag_layout
  python -m experiments.bench_bag_layout --config=experiments/configs/bench_bag_layout.py:smoke

Variants: '' (batch 1024, dim 16, ctr.py:multihot's profile), 'smoke' (seconds).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.variant = "multihot"  # the ctr.py variant whose data.multihot profile is used
  c.batch_size = 1024
  c.embed_dim = 16
  c.batches = 8  # distinct fresh batches, cycled
  c.reps = 30  # timed calls of each layout; the median is reported
  c.buckets = 32  # ragged: T_cap is T rounded up to a multiple of B*S/buckets
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.variant, c.batch_size, c.embed_dim, c.batches, c.reps = "multihot_smoke", 32, 4, 2, 3
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
