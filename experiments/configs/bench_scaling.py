"""Config of `python -m experiments.bench_scaling`: the MixCache scaled out over devices.

Run:
  python -m experiments.bench_scaling --config=experiments/configs/bench_scaling.py \\
      [--config.devices=1,2,4,8 --config.shardings=replicated,row --config.steps=24 \\
       --config.batch_size=1024 --config.out=scaling.json]
  python -m experiments.bench_scaling --config=experiments/configs/bench_scaling.py:smoke

Variants (the text after ':'): '' (1, 2, 4 and 8 devices x replicated / row-sharded cache x
VSI on / off, 24 steps of 1024), 'smoke' (seconds: 2 devices, 3 steps of 32 on a tiny table).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.devices = (1, 2, 4, 8)  # device counts of the mesh
  c.shardings = "replicated,row"  # embedding.cache_sharding values, comma-separated
  c.vsi = "on,off"  # on: bucketed unique rows; off: U = B*F rows
  c.steps = 24  # train steps per configuration
  c.batch_size = 1024  # examples per step (divisible by every device count)
  c.cardinality_scale = 0.01  # multiplies the Criteo per-field cardinalities
  c.embed_dim = 16  # embedding dim (DeepFM rows hold dim + 1 floats)
  c.mlp_dims = (64,)  # DeepFM MLP widths
  c.cache_rows = 0  # rows per device; 0 = lookahead x B x F (the smallest a replicated cache may be)
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.devices, c.steps, c.batch_size, c.cardinality_scale = (2,), 3, 32, 0.0005
    c.mlp_dims, c.embed_dim = (8,), 4
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
