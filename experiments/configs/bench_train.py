"""Config of `python -m experiments.bench_train`: the trainer's step on the benchmark workload.

Run:
  python -m experiments.bench_train --config=experiments/configs/bench_train.py
  python -m experiments.bench_train --config.backend=both --config.floor=True --config.repeats=3
  python -m experiments.bench_train --config=experiments/configs/bench_train.py:smoke

Variants (the text after ':'): '' (DeepFM, batch 4096, 26 fields x 100k rows, dim 16, on
the device backend), 'smoke' (seconds: batch 16, 4 fields x 100 rows, dim 4, both backends
with a 130-row cache), 'multihot' (issue #22: the multi-hot workload, batch 1024, a 5.4M-row
table, device and cache at 5%), 'multihot_smoke' (seconds).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.steps = 40  # timed steps (each window: waited, then pipelined)
  c.warmup = 8  # untimed steps after compilation
  c.batch_size = 4096  # examples per step
  c.rows_per_field = 100_000  # vocabulary per field
  c.num_fields = 26  # categorical fields
  c.embed_dim = 16  # embedding dimension
  c.zipf = 1.1  # power-law exponent of the ids
  c.model = "deepfm"  # model name
  c.distinct_batches = 0  # distinct host batches cycled through (0: a fresh batch every step)
  c.profile = False  # also time each phase separately (device backend)
  c.backend = "device"  # embedding backend: device | cache | both (device then cache)
  c.cache_rows = 0.05  # cache backend: rows, or a fraction of the table
  c.lookahead = 2  # cache backend: steps planned ahead
  # Padded unique ids per step (0: the largest unique count of the batches, rounded up to 256).
  c.unique_capacity = 0
  c.embedding_optimizer = "rowwise_adagrad"  # row optimizer of the embedding table
  c.embedding = e = ml_collections.ConfigDict()  # copied into the trainer's embedding block
  e.dtype = "float32"  # table rows: float32 | bfloat16 | float16 (sfjax/embedding/row_dtype.py)
  e.stochastic_rounding = False  # half-width rows: stochastic rounding of the updates
  e.keep_upcoming = -1  # cache backend: next batches whose rows are evicted last (-1: lookahead-1;
  #                      0: the policy alone, every refill of a just-evicted row waits for it)
  c.repeats = 1  # rounds of (floor, backends), interleaved; figures are medians over rounds
  c.chunk_steps = 5  # waited (device-only) and pipelined (end-to-end) steps alternate in chunks
  c.split_input = True  # model.split_input, the trainer's default (deepfm: no concatenated MLP
  #                      input; issue #27); False: the concatenated layout
  c.loader_nice = 10  # train.loader_nice: niceness of both backends' host threads
  c.loader_idle = False  # train.loader_idle: those threads under SCHED_IDLE instead (opt-in)
  c.host_allocator = "tuned"  # train.host_allocator: tuned | system (glibc's defaults); once
  #                             per process, so compare the two in separate runs
  c.xla_cpu_dots = "auto"  # train.xla_cpu_dots: auto | eigen | xla (the steps' dots on CPU; the
  #                         floor is compiled with the same options)
  c.floor = False  # also run the plain-JAX floor (experiments/floor_deepfm.py) in each round
  c.out = ""  # also write the JSON result here
  c.workload = "onehot"  # onehot (the fields above) | multihot (data.format=multihot rows)
  # workload=multihot: data.multihot fields (sfjax/train/defaults.py) over ctr.py:multihot's
  c.multihot = mh = ml_collections.ConfigDict()
  mh.user_rows, mh.item_rows = 1_000_000, 2_000_000  # a 5% cache holds 270k of 5.4M rows
  mh.short_bag_rows, mh.long_bag_rows, mh.context_rows = 100_000, 1_000_000, 1000
  if arg in ("multihot", "multihot_smoke"):
    c.workload, c.batch_size, c.backend = "multihot", 1024, "both"
  if arg == "multihot_smoke":
    c.batch_size, c.embed_dim, c.steps, c.warmup = 16, 4, 4, 2
    c.cache_rows = 2560.0  # >= lookahead 2 x the 1024-row unique capacity, of ~11k rows
    mh.user_rows, mh.item_rows = 2000, 4000
    mh.short_bag_rows, mh.long_bag_rows, mh.context_rows = 200, 2000, 50
  elif arg == "smoke":
    c.batch_size, c.rows_per_field, c.num_fields, c.embed_dim = 16, 100, 4, 4
    c.steps, c.warmup, c.unique_capacity = 4, 2, 64
    # 4 fields x 16 examples: at most 64 unique ids per batch, so a cache of 130 rows passes
    # the lookahead 2 x 64 = 128 start-up check.
    c.backend, c.cache_rows = "both", 130.0
  elif arg and arg != "multihot":
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke', 'multihot', "
                     "'multihot_smoke')")
  return c
