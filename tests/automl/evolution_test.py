"""Tests for regularised (aging) evolution (sfjax/automl/algorithms/evolution.py)."""

import numpy as np
import pytest

from sfjax.automl.algorithms import (
    Objective,
    RandomSearch,
    RegularizedEvolution,
    TrialStatus,
    algorithm_from_dict,
    mutate,
    project,
)
from sfjax.automl.space import Categorical, Config, Fixed, Float, Int, Space

AUC = Objective("auc", "maximize")


def test_spec_name_and_checks():
  assert RegularizedEvolution.name == "evolution"
  spec = RegularizedEvolution(population_size=8, sample_size=2, mutation_scale=0.1, seed=4)
  assert algorithm_from_dict(spec.to_dict()) == spec
  with pytest.raises(ValueError, match=r"need 1 <= sample_size \(6\) <= population_size \(5\)"):
    RegularizedEvolution(population_size=5, sample_size=6)
  with pytest.raises(ValueError, match=r"sample_size \(0\)"):
    RegularizedEvolution(sample_size=0)
  with pytest.raises(ValueError, match="mutation_scale must be > 0, got 0"):
    RegularizedEvolution(mutation_scale=0)


def test_mutation_changes_one_parameter_and_respects_conditions(model_space):
  rng = np.random.default_rng(0)
  parent = model_space.validate({"model": "fm", "lr": 0.01, "dropout": 0.1})
  changed_keys = set()
  for _ in range(200):
    child = mutate(model_space, parent, rng, scale=0.2)
    model_space.validate(child)
    if child["model"] == "fm":
      changed = [k for k in parent if child[k] != parent[k]]
      assert len(changed) == 1
      changed_keys.update(changed)
    else:  # the model changed: depth and width became active with fresh values
      assert {"depth", "width"} <= set(child) and child["lr"] == parent["lr"]
      changed_keys.add("model")
  assert changed_keys == {"model", "lr", "dropout"}


def test_mutation_respects_forbidden_clauses_and_its_scale():
  rng = np.random.default_rng(1)
  space = Space({"a": Categorical((0, 1, 2))}, forbidden=[{"a": 1}])
  assert {mutate(space, Config({"a": 0}), rng, 0.2)["a"] for _ in range(50)} == {2}
  space = Space({"x": Float(0.0, 1.0)})
  steps = [mutate(space, Config({"x": 0.5}), rng, 0.01)["x"] - 0.5 for _ in range(200)]
  assert all(s != 0 for s in steps) and max(abs(s) for s in steps) < 0.05  # 5 sigma
  assert 0.005 < np.std(steps) < 0.015


def test_mutation_falls_back_to_a_sample_when_nothing_can_change():
  space = Space({"a": Categorical(("only",)), "n": Int(2, 2), "steps": Fixed(10)})
  config = Config({"a": "only", "n": 2, "steps": 10})
  assert mutate(space, config, np.random.default_rng(0), 0.2) == config


def test_first_population_is_random_then_children_of_tournament_winners():
  searcher = RegularizedEvolution(population_size=3, sample_size=3, seed=0).build(
      Space({"x": Float(0.0, 1.0)}), AUC)
  first = searcher.ask(5)  # P random, then still random: no result yet to mutate
  assert [s.parent_trial_id for s in first] == [None] * 5
  for s, auc in zip(first, (0.9, 0.1, 0.2, 0.3, 0.4), strict=True):
    searcher.tell(s.trial_id, {"auc": auc})
  assert [r.trial_id for r in searcher.population()] == [2, 3, 4]  # aging: 0.9 aged out
  (child,) = searcher.ask(1)
  assert child.parent_trial_id == 4  # sample_size = P: the best of the population
  assert child.config != first[4].config
  searcher.tell(child.trial_id, {}, TrialStatus.FAILED)  # failures never join
  assert [r.trial_id for r in searcher.population()] == [2, 3, 4]
  (child,) = searcher.ask(1)
  searcher.tell(child.trial_id, {"auc": 0.0})  # the newest joins even though it is worst
  assert [r.trial_id for r in searcher.population()] == [3, 4, child.trial_id]


def test_evolution_beats_random_search_on_a_quadratic(toy_best):
  def make(seed):
    return RegularizedEvolution(population_size=10, sample_size=3, mutation_scale=0.1,
                                seed=seed)

  seeds = range(5)
  ours = np.median([toy_best(make(s)) for s in seeds])
  random = np.median([toy_best(RandomSearch(seed=s)) for s in seeds])
  assert ours < random / 2, (ours, random)


def test_project_moves_a_config_into_a_fixing(model_space):
  rng = np.random.default_rng(0)
  deep = model_space.validate({"model": "deepfm", "depth": 3, "width": 64, "lr": 0.01,
                               "dropout": 0.1})
  # Same keys active: only the fixed one changes, the others keep their exact values.
  assert project(model_space.fixing({"depth": 1}), deep, rng) == {**deep, "depth": 1}
  # To fm: depth / width switch off.
  assert project(model_space.fixing({"model": "fm"}), deep, rng) == {
      "model": "fm", "lr": 0.01, "dropout": 0.1}
  # From fm to dcnv2 (depth 3 forbidden there): newly active keys drawn, clause respected.
  fm = model_space.validate({"model": "fm", "lr": 0.001, "dropout": 0.3})
  dcn = model_space.fixing({"model": "dcnv2"})
  for _ in range(20):
    child = project(dcn, fm, rng)
    model_space.validate(child)
    assert child["model"] == "dcnv2" and child["lr"] == 0.001 and child["dropout"] == 0.3


def test_fixed_children_come_from_parents_inside_the_bucket(model_space, fake_auc):
  searcher = RegularizedEvolution(population_size=6, sample_size=6, seed=0).build(model_space,
                                                                                   AUC)
  fixed = {"model": "deepfm", "depth": 2}
  for batch in (searcher.ask(4, fixed={"model": "fm"}), searcher.ask(2, fixed=fixed)):
    for s in batch:
      searcher.tell(s.trial_id, {"auc": fake_auc(s.config)})
  bucket = {r.trial_id for r in searcher.population() if r.suggestion.config.agrees(fixed)}
  assert len(bucket) == 2
  for child in searcher.ask(8, fixed=fixed):
    assert child.parent_trial_id in bucket  # the fm members are never parents here
    assert child.config["model"] == "deepfm" and child.config["depth"] == 2
  # A bucket with no member: the tournament winner is projected into it.
  for child in searcher.ask(4, fixed={"model": "dcnv2", "depth": 1}):
    assert child.parent_trial_id is not None
    assert child.config["model"] == "dcnv2" and child.config["depth"] == 1
    model_space.validate(child.config)
