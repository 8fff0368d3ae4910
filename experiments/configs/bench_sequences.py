"""Config of `python -m experiments.bench_sequences`: what bags and histories are worth (#22).

Run:
  python -m experiments.bench_sequences                      # MovieLens-100k + planted, 3 seeds
  python -m experiments.bench_sequences --config=experiments/configs/bench_sequences.py:smoke

Variants: '' (3 seeds; MovieLens: one-genre DeepFM vs all genres + mean-pooled history
DeepFM vs DIN; the planted multi-hot data: DeepFM on the one-hot fields only vs DeepFM
on every feature (mean-pooled history) vs DIN, beside the oracle), 'smoke' (seconds: one
seed, the multihot_smoke data, a few steps, no MovieLens).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.seeds = (0, 1, 2)  # one training per seed and variant; mean and spread reported
  # ctr.py variants trained on MovieLens-100k ('' = skip); the first is the baseline
  c.movielens = ("movielens_onehot,movielens,movielens_din,movielens_din_softmax,"
                 "movielens_labels,movielens_din_labels")  # *_labels: + train-label histories
  c.multihot = "multihot"  # the ctr.py variant of the planted multi-hot data ('' = skip)
  c.multihot_steps = 0  # > 0: overrides the variant's train.steps
  c.out = ""  # also write the JSON result here
  if arg == "smoke":
    c.seeds, c.movielens, c.multihot, c.multihot_steps = (0,), "", "multihot_smoke", 20
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
