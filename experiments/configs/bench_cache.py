"""Config of `python -m experiments.bench_cache`: MixCache hit rate and traffic vs cache size.

Run:
  python -m experiments.bench_cache --config=experiments/configs/bench_cache.py \\
      [--config.steps=800 --config.batch_size=512 --config.out=cache.json]
  python -m experiments.bench_cache --config=experiments/configs/bench_cache.py:smoke

Variants (the text after ':'): '' (800 batches of 512 over a 1.7M-row table, three Zipf
exponents x three cache sizes), 'smoke' (seconds: 40 batches of 16 over 3443 rows; the
smallest cache is too small and is reported as an error entry).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.steps = 800  # batches in each stream
  c.batch_size = 512  # examples per batch
  c.cardinality_scale = 0.05  # multiplies the Criteo per-field cardinalities
  c.zipf = (1.05, 1.1, 1.2)  # Zipf exponents of the id streams
  c.cache_fraction = (0.01, 0.05, 0.2)  # cache sizes as fractions of the rows
  c.policies = "lru,lfu"  # planner policies, comma-separated (cache_planner.CACHE_POLICIES)
  c.lookahead = 2  # planned-but-unretired steps
  c.embed_width = 17  # E: floats per embedding row
  c.slot_width = 17  # S: optimizer slot floats per row (adagrad: E)
  c.timing_steps = 10  # timed plans at 50k ids / 1M slots (0: skip)
  c.seed = 0  # data seed
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.steps, c.batch_size, c.cardinality_scale = 40, 16, 1e-4
    c.zipf, c.cache_fraction, c.timing_steps = (1.05, 1.2), (0.05, 0.15, 0.5), 1
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
