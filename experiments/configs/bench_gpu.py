"""Config of `python -m experiments.bench_gpu`: every speed figure of sfjax in one command.

Run:
  python -m experiments.bench_gpu --config=experiments/configs/bench_gpu.py --config.out=gpu.json
  python -m experiments.bench_gpu --config=experiments/configs/bench_gpu.py:smoke \\
      --config.out=/tmp/smoke.json   # tiny sizes, CPU is fine
  python -m experiments.bench_gpu --config.only=train,scaling

Variants (the text after ':'): '' (the sizes of a GPU run, under 8 minutes on one H200),
'smoke' (every benchmark's smoke variant: a CPU check of the wiring).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.smoke = False  # tiny sizes and limits (the benchmarks' smoke variants)
  c.only = ""  # run only these benchmarks, comma-separated (train, input, scaling, trials)
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.smoke = True
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
