"""The CTR search's library-owned defaults (sfjax/ctr_search/defaults.py)."""

import dataclasses

import pytest

from experiments.configs import search_ctr
from sfjax.automl.algorithms import ALGORITHMS
from sfjax.ctr_search import defaults, search_config, search_defaults


def test_search_defaults_hold_a_block_per_registered_algorithm():
  c = search_defaults()
  assert set(ALGORITHMS) <= set(c.study) and c.study.algorithm == "asha"
  for name, spec in ALGORITHMS.items():
    fields = {f.name for f in dataclasses.fields(spec)} - set(defaults.SHARED_SPEC_FIELDS)
    assert set(c.study[name]) == fields, name  # generated from the spec: every field, no other
  # The CTR search's own departures from the specs' defaults; the rest are the specs'.
  assert c.study.tpe.n_startup_trials == 8 and ALGORITHMS["tpe"]().n_startup_trials == 10
  assert c.study.evolution.population_size == 16 and c.study.pbt.population_size == 16
  assert c.study.asha.eta == 3 and c.study.pbt.pbt_interval == 1.0
  assert not any(k in c.study for k in ("eta", "population_size", "n_startup_trials"))
  assert search_ctr.get_config().to_dict() == c.to_dict()  # the default variant adds nothing


def test_search_departures_name_real_settings():
  for name, settings in defaults.SEARCH_ALGORITHM_DEFAULTS.items():
    block = defaults._algorithm_block(name)
    for field, value in settings.items():
      assert field in block and block[field] == value, (name, field)
      assert getattr(ALGORITHMS[name](), field) != value, (name, field)  # a real departure


def test_a_typed_placeholder_takes_an_override():
  c = search_defaults()
  assert c.study.successive_halving.num_configs is None
  c.study.successive_halving.num_configs = 9  # an int placeholder, not a None-typed field
  with pytest.raises(TypeError):
    c.study.successive_halving.num_configs = "nine"
  c.study.algorithm = "successive_halving"
  assert search_config.make_algorithm(c).num_configs == 9


def test_each_call_is_a_fresh_config():
  a, b = search_defaults(), search_defaults()
  a.study.asha.eta, a.task.data.synthetic.num_train = 5, 7
  assert b.study.asha.eta == 3 and b.task.data.synthetic.num_train == 200_000
  assert defaults.study_defaults().to_dict() == b.study.to_dict()
