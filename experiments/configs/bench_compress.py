"""Config of `python -m experiments.bench_compress`: the Prune-EA search's time per dots choice.

Run:
  python -m experiments.bench_compress [--config.choices=xla,eigen --config.rounds=3]
  python -m experiments.bench_compress --config=experiments/configs/bench_compress.py:smoke

Variants (the text after ':'): '' (DeepFM, 16-wide rows, a 400-400-400 MLP, 8 candidates
fine-tuned 20 steps of 1024 examples, one generation after the first), 'smoke' (seconds).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.choices = "xla,eigen"  # `train.xla_cpu_dots` choices timed, in turn each round
  c.rounds = 3  # rounds (each choice once per round, a fresh search: compiles included)
  c.embed_dim = 16  # the trained model's row width D
  c.mlp_dims = (400, 400, 400)  # its MLP
  c.num_train = 40_000  # synthetic train examples (the fine-tune batches' source)
  c.num_eval = 8_000  # synthetic eval examples (valid rows; the test split's as many)
  c.population = 8  # candidates per generation
  c.generations = 1  # generations after the first
  c.finetune_steps = 20  # fine-tune steps per candidate
  c.batch_size = 1024  # examples per fine-tune step
  c.valid_rows = 4_000  # eval rows the search selects on
  c.seed = 0
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.rounds, c.embed_dim, c.mlp_dims, c.num_train, c.num_eval = 1, 4, (8, 6), 2_000, 600
    c.population, c.generations, c.finetune_steps, c.batch_size, c.valid_rows = 3, 0, 3, 64, 300
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
