"""Config of `python -m experiments.bench_growth`: cost growth of the cache path.

Run:
  python -m experiments.bench_growth --config=experiments/configs/bench_growth.py \\
      [--config.sweeps=rows,spread,batch,fields --config.plot=docs/growth.png]
  python -m experiments.bench_growth --config=experiments/configs/bench_growth.py:smoke

Variants (the text after ':'): '' (table 1e6 -> 1e9 rows, with the ids of each size's data
or the first size's spread over it, batch 1k -> 64k, fields 26 -> 100; ~5 minutes on 2 cores), 'smoke' (seconds: two tiny points per sweep).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.sweeps = "rows,spread,batch,fields"  # which sweeps to run, comma-separated
  c.rows = (1e6, 1e7, 1e8, 1e9)  # table rows of the rows sweep (about: Criteo's cardinalities
  #                                scaled) and of the spread sweep (the first point's ids, spread)
  c.batches = (1024, 4096, 16384, 65536)  # batch sizes of the batch sweep
  c.fields = (26, 52, 100)  # categorical fields of the fields sweep
  c.base_rows = 1e6  # table rows of the fields sweep (per 26 fields)
  c.batch_sweep_rows = 1e8  # table rows of the batch sweep (past its largest cache: it evicts)
  c.base_batch = 1024  # batch of the rows and fields sweeps
  c.steps = 20  # timed train steps per point, after the warm-up
  c.warmup_steps = 20  # warm-up steps at least (untimed: compiles, the cache filling)
  c.warmup_chunk = 10  # the warm-up runs in chunks of this many steps until a chunk evicts
  #                      rows (the cache is full) and compiles no new program shape
  c.max_warmup_steps = 2000  # ... or until this many (the point is then marked not steady)
  c.cache_rows = 262_144  # device cache rows, fixed over the rows sweep (raised when a point needs more)
  c.embed_dim = 16  # embedding dim (DeepFM rows hold dim + 1 floats)
  c.mlp_dims = (64,)  # DeepFM MLP widths
  c.host_dir = "/tmp/sfjax_growth"  # parent of each point's mmap host table (deleted after)
  c.plot = ""  # also write the log-log plot here (PNG)
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.rows, c.batches, c.fields = (2e4, 2e5), (16, 64), (26, 40)
    c.base_rows, c.base_batch, c.steps, c.cache_rows = 2e4, 16, 4, 1024
    c.batch_sweep_rows, c.warmup_steps, c.warmup_chunk, c.max_warmup_steps = 2e5, 4, 4, 200
    c.embed_dim, c.mlp_dims = 4, (8,)
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
