"""Tests for the default CTR space (search_spaces/default.py): generated models by default,
the named families when a config names them, the named models as presets."""

import numpy as np
import pytest

from experiments.configs import search_ctr
from search_spaces import SPACES, blocks, ctr, default
from sfjax.cohorts.arch import split_config
from sfjax.ctr_search import search_defaults
from sfjax.models import generator


def _space_cfg(families="", mlp_widths="32,64,128,256"):
  cfg = search_defaults().space
  cfg.families, cfg.mlp_widths = families, mlp_widths
  return cfg


def test_the_default_space_generates_models_from_blocks():
  assert search_defaults().space.families == ""
  space = default.SEARCH_SPACE.from_config(search_defaults().space)
  assert "model.name" not in space.keys and "model.fm.use" in space.keys
  assert space["model.tower.width"].choices == (32, 64, 128, 256)
  assert SPACES["ctr"] is default.SEARCH_SPACE
  smoke = default.SEARCH_SPACE.from_config(search_ctr.get_config("smoke").space)
  assert "model.cross.use" in smoke.keys and smoke["model.tower.width"].choices == (32, 64)


def test_a_config_naming_families_searches_them_as_before():
  cfg = _space_cfg("lr,fm,deepfm", "32,400")
  space, named = default.SEARCH_SPACE.from_config(cfg), ctr.space_from_config(cfg)
  assert space.keys == named.keys and space["model.name"].choices == ("lr", "fm", "deepfm")
  rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
  for _ in range(20):  # the same draws: a seeded study asks the same trials
    point = space.sample(rng_a)
    assert point == named.sample(rng_b)
    assert default.runner_config(point) == ctr.runner_config(point)
  assert default.default_config(space) == ctr.default_config(space)


def test_the_baseline_is_the_trainers_named_deepfm():
  # default_config(None) is what a search's `default auc` trains: unchanged by the new default.
  assert default.default_config(None) == ctr.default_config()
  arch, _ = split_config(default.runner_config(default.default_config(None)))
  assert arch.model_name == "deepfm"
  space = default.SEARCH_SPACE.from_config(search_defaults().space)
  with pytest.raises(Exception, match="model.tower.width"):  # 400 is not among 32..256
    default.default_config(space)
  wide = blocks.block_space()
  assert default.default_config(wide) == blocks.preset_config("deepfm", wide)


@pytest.mark.parametrize("name", blocks.PRESETS)
def test_every_named_model_is_a_preset_point_of_the_default_space(name):
  space = blocks.block_space()  # the default space's with the trainer's tower width (400)
  point = blocks.preset_config(name, space)
  arch, hparams = split_config(default.runner_config(point))
  assert arch.model_name == "composed"
  spec = generator.spec_from_json(dict(arch.model_hparams)["blocks"])
  assert spec == generator.named_model_spec(name, 16, **{**blocks._trainer_hparams(name),  # pylint: disable=protected-access
                                               **blocks.PRESET_HPARAMS.get(name, {})})
  assert hparams["embedding.learning_rate"] == ctr.default_config()["embedding.learning_rate"]


def test_bucket_fixed_keys_of_either_space():
  named = ctr.default_config(ctr.ctr_space(("fm", "deepfm")))
  assert "model.name" in default.bucket_fixed_keys(named, list(named))
  point = blocks.preset_config("deepfm")
  fixed = default.bucket_fixed_keys(point, list(point))
  assert fixed == blocks.bucket_fixed_keys(point, list(point))
  assert "model.tower.width" not in fixed and "model.embedding.group0.dim" in fixed
