"""Config blocks generated from algorithm specs (sfjax/automl/algorithms/spec_settings.py)."""

import dataclasses
from typing import ClassVar

import pytest

from sfjax.automl.algorithms import ALGORITHMS, ASHA, PBT, GridSearch, RandomSearch, spec_settings
from sfjax.automl.algorithms.base import AlgorithmSpec


def test_default_block_is_the_specs_fields_and_defaults():
  assert spec_settings.default_block(ASHA) == {"min_budget": 1, "max_budget": 81, "eta": 3}
  assert spec_settings.default_block(PBT) == {"population_size": 16, "pbt_interval": 1.0,
                                              "quantile": 0.25}
  assert spec_settings.default_block(RandomSearch) == {}
  assert spec_settings.default_block(ASHA, exclude=("seed", "min_budget", "max_budget")) == {
      "eta": 3}


def test_every_registered_spec_builds_from_its_block():
  blocks = spec_settings.default_blocks(ALGORITHMS)
  assert list(blocks) == list(ALGORITHMS)
  for name, block in blocks.items():
    assert ALGORITHMS[name](**block, seed=3) == ALGORITHMS[name](seed=3), name


@dataclasses.dataclass(frozen=True)
class _NewAlgorithm(AlgorithmSpec):
  """A spec no config knows: its block comes from its fields alone."""

  name: ClassVar[str] = "new"
  width: int = 4
  temperature: float | None = None
  seed: int = 0

  def build(self, space, objective):
    raise NotImplementedError


def test_a_new_algorithm_gets_a_block_without_any_config_edit():
  blocks = spec_settings.default_blocks({**ALGORITHMS, "new": _NewAlgorithm})
  assert blocks["new"] == {"width": 4, "temperature": None}
  assert spec_settings.setting_types(_NewAlgorithm) == {"width": int, "temperature": float,
                                                        "seed": int}


def test_setting_types_unwrap_optional():
  types = spec_settings.setting_types(GridSearch)
  assert types == {"num_points_per_float": int, "num_points_per_int": int, "shuffle": bool,
                   "seed": int}


def test_a_field_without_a_default_is_refused():
  @dataclasses.dataclass(frozen=True)
  class NoDefault(AlgorithmSpec):
    name: ClassVar[str] = "nodefault"
    size: int

    def build(self, space, objective):
      raise NotImplementedError

  with pytest.raises(TypeError, match="NoDefault.size: a spec field needs a default"):
    spec_settings.default_block(NoDefault)
