"""Shared step helpers: recipe, models, saved weights, errors naming fields."""

import chex
import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import pipeline_digits
from sfjax.core.errors import ConfigError
from sfjax.vision import vision_task


def test_recipe_and_overrides():
  config = pipeline_digits.get_config("smoke")
  recipe = vision_task.recipe_of(config, {"learning_rate": 0.5})
  assert recipe.learning_rate == 0.5 and recipe.steps == config.recipe.steps
  assert recipe.weight_decay == config.recipe.weight_decay
  with pytest.raises(ConfigError, match=r"best_hparams: \['steps'\] are not recipe"):
    vision_task.recipe_of(config, {"steps": 3})
  del config.recipe.batch_size
  with pytest.raises(ConfigError, match="recipe.batch_size"):
    vision_task.recipe_of(config)
  config = pipeline_digits.get_config("smoke")
  config.model.widths = (4, 4)
  with pytest.raises(ConfigError, match="model.widths"):
    vision_task.baseline_model(config)


def test_models_round_trip_through_their_descriptions(tmp_path):
  config = pipeline_digits.get_config("smoke")
  base = vision_task.baseline_model(config)
  again = vision_task.model_from_description(base.kind, base.description)
  params = base.init(jax.random.key(0))
  path = str(tmp_path / "m.npz")
  vision_task.save_params(path, params)
  loaded = vision_task.load_params(path, again.init(jax.random.key(1)))
  chex.assert_trees_all_close(loaded, params)
  genotype = [[[0, "skip"], [1, "conv_3x3"]]]
  derived = vision_task.darts_model(genotype, {"channels": 2, "num_nodes": 1})
  x = np.zeros((2, 8, 8, 1), np.float32)
  chex.assert_shape(derived.apply(derived.init(jax.random.key(0)), x), (2, 10))
  with pytest.raises(ValueError, match="do not match"):
    vision_task.load_params(path, derived.init(jax.random.key(0)))
  with pytest.raises(ValueError, match="unknown model kind"):
    vision_task.model_from_description("vit", {})


def test_splits_come_from_the_data_block():
  config = ml_collections.ConfigDict({"seed": 0, "data": {"name": "digits", "valid_fraction": 0.1,
                                                          "test_fraction": 0.1, "max_train": 50}})
  splits = vision_task.splits_of(config)
  assert splits.train_x.shape == (50, 8, 8, 1) and len(splits.valid_y) == 180
  config.data.name = "svhn"
  with pytest.raises(ConfigError, match="data.name"):
    vision_task.splits_of(config)
