"""Config of `python -m experiments.bench_autofis`: AutoFIS on planted synthetic data.

Run:
  python -m experiments.bench_autofis --config=experiments/configs/bench_autofis.py \\
      [--config.seeds=0,1,2 --config.search_steps=1500 --config.out=bench.json]
  python -m experiments.bench_autofis --config=experiments/configs/bench_autofis.py:smoke

Variants (the text after ':'): '' (3 seeds, 1500 search + 800 retrain steps), 'smoke'
(seconds: one seed, a dozen search steps, FM of dim 2 on a tiny table).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.seeds = (0, 1, 2)  # data seeds (each its own planted model)
  c.search_steps = 1500  # AutoFIS search steps (warm-up included)
  c.warmup_steps = 300  # search steps with the gates off
  c.retrain_steps = 800  # retrain steps
  c.batch_size = 512  # examples per step
  c.embed_dim = 8  # embedding dimension
  c.mlp_dims = ()  # MLP widths (empty: the FM variant)
  c.grda_c = 0.005  # gRDA threshold scale c
  c.grda_mu = 0.8  # gRDA threshold growth mu
  c.grda_lr = 1.0  # gRDA learning rate of the gates
  c.cardinality_scale = 1e-3  # synthetic Criteo cardinality scale
  c.eval_rows = 20_000  # eval rows (first half valid, second half test)
  c.shares = (0.5, 0.8)  # variance shares defining the planted truth
  c.baselines = True  # also retrain on random / all / no pairs
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.seeds, c.search_steps, c.warmup_steps, c.retrain_steps = (2,), 12, 4, 4
    c.batch_size, c.embed_dim, c.eval_rows = 64, 2, 512
    c.cardinality_scale, c.grda_c, c.shares = 1e-4, 0.0001, (0.5,)
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
