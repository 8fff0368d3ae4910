"""Config of `python -m experiments.bench_table_widths`: host rows at each table's own width.

Run:
  python -m experiments.bench_table_widths
  python -m experiments.bench_table_widths --config=experiments/configs/bench_table_widths.py:smoke

Variants: '' (4M rows in 4 tables of dims 4, 8, 16 and the model's 16, DeepFM rows of 17
columns, row-wise Adagrad; 23k ids a step, the cache benchmark's misses), 'smoke' (seconds).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.num_rows = 4_000_000  # rows of the concatenated table, split evenly among the tables
  c.dims = "4,8,16,0"  # each table's embedding dim (0: the model's)
  c.embed_dim = 16  # the model's latent columns D
  c.first_order = 1  # columns after the latent ones (DeepFM's first-order weight)
  c.optimizer = "rowwise_adagrad"  # rowwise_adagrad (1 slot), adagrad (E slots), adam (2E)
  c.ids_per_step = 23_000  # distinct rows gathered and written back per timed step
  c.steps = 30  # timed gather + write-back steps (fresh ids each); medians reported
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.num_rows, c.ids_per_step, c.steps = 40_000, 2_000, 3
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
