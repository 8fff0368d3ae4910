"""What the image steps share: the pipeline's data, recipe, models, and saved weights.

Shared blocks of a vision pipeline config (`experiments/configs/pipeline_digits.py`):

  application   'vision' (which step registry `experiments.pipeline` uses)
  seed          data split, initial weights, batches
  data          name ('digits' | 'mnist_5k'), valid_fraction, test_fraction,
                max_train (0: every training image)
  model         widths (C1, C2, H) of the baseline CNN (`cnn.py`)
  recipe        steps, batch_size, learning_rate, weight_decay: `fully_train`'s recipe,
                for the searched model and the baseline alike
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from sfjax.core.atomic import atomic_write
from sfjax.core.errors import ConfigError
from sfjax.vision import cnn, darts, image_data, training

_RECIPE_FIELDS = ("steps", "batch_size", "learning_rate", "weight_decay")


class Model(NamedTuple):
  """A model the steps train.

  Attributes:
    kind: 'cnn' (the baseline) or 'darts' (a derived genotype).
    init: key -> params.
    apply: (params, x [B, H, W, C]) -> logits [B, classes].
    description: JSON-able (widths, or genotype and supernet spec).
  """

  kind: str
  init: Callable
  apply: Callable
  description: dict


def require(block, field: str, keys) -> None:
  """Raises ConfigError naming `<field>.<key>` for the first key missing from `block`."""
  for key in keys:
    if key not in block:
      raise ConfigError(f"config field {field}.{key}: missing")


@functools.lru_cache(maxsize=4)
def _cached_splits(name, valid_fraction, test_fraction, seed, max_train):
  return image_data.load_splits(name, valid_fraction, test_fraction, seed, max_train or None)


def splits_of(config) -> image_data.ImageSplits:
  """The pipeline's train / valid / test images (cached per process)."""
  require(config, "config", ("seed", "data"))
  d = config.data
  require(d, "data", ("name", "valid_fraction", "test_fraction"))
  return _cached_splits(d.name, float(d.valid_fraction), float(d.test_fraction), int(config.seed),
                        int(d.get("max_train", 0) or 0))


def recipe_of(config, hparams: dict | None = None) -> training.Recipe:
  """The shared `recipe` block, with `hparams` (learning_rate, weight_decay) over it."""
  require(config, "config", ("recipe",))
  require(config.recipe, "recipe", _RECIPE_FIELDS)
  r = config.recipe
  recipe = training.Recipe(int(r.steps), int(r.batch_size), float(r.learning_rate),
                           float(r.weight_decay))
  if recipe.steps < 1 or recipe.batch_size < 1:
    raise ConfigError(f"config field recipe.steps / recipe.batch_size: must be >= 1, got "
                      f"{recipe.steps} / {recipe.batch_size}")
  tuned = hparams or {}
  unknown = sorted(set(tuned) - {"learning_rate", "weight_decay"})
  if unknown:
    raise ConfigError(f"best_hparams: {unknown} are not recipe hyperparameters (learning_rate, "
                      "weight_decay)")
  return recipe._replace(learning_rate=float(tuned.get("learning_rate", recipe.learning_rate)),
                         weight_decay=float(tuned.get("weight_decay", recipe.weight_decay)))


def baseline_model(config) -> Model:
  """The unsearched baseline CNN of `model.widths`."""
  widths = tuple(int(w) for w in config.model.widths)
  if len(widths) != 3 or min(widths) < 1:
    raise ConfigError(f"config field model.widths: expected 3 positive widths, got {widths}")
  return Model("cnn", lambda key: cnn.init_cnn(key, widths), cnn.apply_cnn,
               {"widths": list(widths)})


def darts_model(genotype_json, spec_json: dict) -> Model:
  """The network derived from a DARTS genotype (JSON forms, as steps hand them on)."""
  genotype = darts.genotype_from_json(genotype_json)
  spec = darts.SupernetSpec(**spec_json)
  return Model("darts", lambda key: darts.init_derived(key, genotype, spec),
               lambda p, x: darts.apply_derived(p, x, genotype, spec),
               {"genotype": [[list(p) for p in node] for node in genotype], "spec": dict(spec_json)})


def model_from_description(kind: str, description: dict) -> Model:
  """Inverse of `Model.description` (a step's hand-off) for either kind."""
  if kind == "cnn":
    widths = tuple(description["widths"])
    return Model("cnn", lambda key: cnn.init_cnn(key, widths), cnn.apply_cnn,
                 {"widths": list(widths)})
  if kind == "darts":
    return darts_model(description["genotype"], description["spec"])
  raise ValueError(f"unknown model kind {kind!r} (known: 'cnn', 'darts')")


def save_params(path: str, params) -> None:
  """The leaves of `params` as one .npz (arr_0, arr_1, ... in tree order), atomically."""
  leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]
  atomic_write(path, lambda f: np.savez(f, *leaves))


def load_params(path: str, template) -> Any:
  """Parameters saved by `save_params`, in the structure of `template`.

  Raises:
    ValueError: the file's arrays do not match the template's leaves.
  """
  treedef = jax.tree_util.tree_structure(template)
  shapes = [np.shape(x) for x in jax.tree_util.tree_leaves(template)]
  with np.load(path) as data:
    leaves = [data[f"arr_{i}"] for i in range(len(data.files))]
  if [x.shape for x in leaves] != shapes:
    raise ValueError(f"{path}: saved arrays {[x.shape for x in leaves]} do not match the "
                     f"model's {shapes}")
  return jax.tree_util.tree_unflatten(treedef, leaves)
