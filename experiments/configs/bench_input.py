"""Config of `python -m experiments.bench_input`: Criteo text versus preprocessed binary shards.

Run:
  python -m experiments.bench_input --config=experiments/configs/bench_input.py \\
      [--config.rows=1000000 --config.batch_size=4096 --config.out=input.json]
  python -m experiments.bench_input --config=experiments/configs/bench_input.py:smoke

Variants (the text after ':'): '' (1M text rows, 20M binary examples per measurement, 3
repeats), 'smoke' (seconds: 3000 rows in 3 shards, 20k binary examples, 2 repeats).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.rows = 1_000_000  # train rows written as Criteo TSV
  c.eval_rows = 10_000  # eval rows (preprocessing needs an eval split)
  c.batch_size = 4096  # examples per batch
  c.hash_rows = 1_000_000  # hash rows per field
  c.rows_per_shard = 1 << 18  # examples per shard
  c.shuffle_buffer = 65536  # shuffle buffer of the shuffled runs (the block shuffle's window)
  c.block_rows = 2048  # data.shuffle_block_rows of the block-shuffled runs
  c.binary_examples = 20_000_000  # examples per binary measurement (epochs repeat)
  c.repeats = 3  # binary measurements of each kind
  c.grain_examples = 2_000_000  # examples per Grain measurement (per-record reads: slow)
  c.grain_threads = 16  # Grain's reading threads (its default)
  c.seek_steps = (10, 100_000)  # resume start-up measured after these many batches
  c.seek_batch_size = 256  # of the seek measurement (the index order is stepped to each)
  c.workdir = ""  # where the files go ('': a temporary folder, removed at the end)
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.rows, c.eval_rows, c.batch_size, c.hash_rows = 3000, 200, 256, 1000
    c.rows_per_shard, c.shuffle_buffer, c.binary_examples, c.repeats = 1000, 512, 20_000, 2
    c.grain_examples, c.grain_threads, c.seek_steps = 2_000, 1, (10, 300)
    c.block_rows = 64
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
