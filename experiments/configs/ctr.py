"""Config for `python -m experiments.train_ctr`.

Run:
  python -m experiments.train_ctr --config=experiments/configs/ctr.py --workdir=/tmp/ctr
  python -m experiments.train_ctr --config=experiments/configs/ctr.py:smoke --workdir=/tmp/ctr
  python -m experiments.train_ctr --config=experiments/configs/ctr.py:movielens --workdir=/tmp/ml
  python -m experiments.train_ctr --config=experiments/configs/ctr.py \
      --config.embedding.backend=cache --workdir=/tmp/ctr_cache   # cache_rows: auto-sized

Variants (the text after ':'): '' (default: DeepFM on synthetic Criteo-like data,
about a minute on 2 CPU cores), 'smoke' (seconds), 'movielens' (MovieLens-100k).
Every field and its default (with a comment) is in `sfjax/train/defaults.py`.
"""

import ml_collections

from sfjax.train import ctr_defaults


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the CTR training config; `arg` selects a variant."""
  c = ctr_defaults()
  d, s, mo, e, o, t = c.data, c.data.synthetic, c.model, c.embedding, c.optimizer, c.train
  if arg == "smoke":
    s.num_train, s.num_eval = 50_000, 20_000
    mo.mlp_dims = (64, 64)
    t.steps, t.batch_size, t.eval_every, t.log_every = 60, 512, 30, 20
  elif arg == "movielens":
    # Chosen by validation AUC in a small sweep (adagrad lr, embedding L2, weight decay,
    # dim); model selection on 'valid', test reported at the best-valid eval.
    d.format = "movielens"
    mo.mlp_dims = (256, 256)
    e.learning_rate, e.l2 = 0.05, 1e-4
    o.weight_decay = 1e-3
    t.steps, t.batch_size, t.eval_every, t.log_every = 1000, 1024, 50, 200
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke', 'movielens')")
  return c
