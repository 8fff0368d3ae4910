"""Config for `python -m experiments.pipeline`: PBA augmentation search, then fully train.

Run:
  python -m experiments.pipeline --config=experiments/configs/pipeline_augment.py --workdir=/tmp/au
  python -m experiments.pipeline --config=experiments/configs/pipeline_augment.py:smoke \\
      --workdir=/tmp/au_smoke

Steps: augment (PBT over a vmapped population of the baseline CNN, each member
with its own policy of shift / rotate / noise / cutout probabilities and
magnitudes; exploit copies along the trial axis, explore perturbs) ->
fully_train (the CNN from scratch with the best member's schedule stretched over
the recipe, against the same CNN and recipe without augmentation).

Variants: '' (full), 'smoke' (well under a minute on 2 CPU cores), 'mnist'.
"""

import ml_collections

from experiments.configs import pipeline_digits


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the pipeline config; `arg` selects a variant ('', 'smoke', 'mnist')."""
  c = pipeline_digits.shared(arg)
  smoke = arg == "smoke"
  c.pipeline.order = "augment,fully_train"
  c.steps.augment = ml_collections.ConfigDict({
      "type": "augment", "population": 4 if smoke else 16, "intervals": 2 if smoke else 6,
      "interval_steps": 6 if smoke else 150, "fraction": 0.25})
  if smoke:
    c.recipe.steps = 200  # every augmented step resamples images: the smoke keeps it short
  c.steps.fully_train = ml_collections.ConfigDict({"type": "fully_train"})
  return c
