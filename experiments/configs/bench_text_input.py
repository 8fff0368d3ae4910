"""Config of `python -m experiments.bench_text_input`: text input per process, resume by seeking.

Run:
  python -m experiments.bench_text_input --config=experiments/configs/bench_text_input.py \\
      [--config.rows=300000 --config.out=text_input.json]
  python -m experiments.bench_text_input --config=experiments/configs/bench_text_input.py:smoke

Variants (the text after ':'): '' (300k Criteo lines, batches of 4096, resume after 10 and
10^4 batches of 256), 'smoke' (seconds: 3000 lines, resume after 10 and 300 batches of 32).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.rows = 300_000  # train lines written as Criteo TSV
  c.batch_size = 4096  # examples per batch of the rate measurements
  c.rate_batches = 200  # batches per rate measurement
  c.hash_rows = 100_000  # hash rows per field
  c.shuffle_buffer = 65536  # data.shuffle_buffer (the default)
  c.seek_steps = (10, 10_000)  # resume start-up measured after these many batches
  c.seek_batch_size = 256  # of the seek measurement (the feed is stepped to each)
  c.repeats = 3  # restarts timed per step count (the median is reported)
  c.workdir = ""  # where the files go ('': a temporary folder, removed at the end)
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.rows, c.batch_size, c.rate_batches, c.hash_rows = 3000, 256, 8, 1000
    c.shuffle_buffer, c.seek_steps, c.seek_batch_size, c.repeats = 512, (10, 300), 32, 2
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
