"""Tests of the algorithm registry and the ask/tell contract every algorithm keeps
(sfjax/automl/algorithms/__init__.py); each algorithm's specifics are in its sibling
test file (random_search_test, evolution_test, optuna_search_test, hyperband_test,
pbt_test, bohb_test, multi_objective_test), the `Searcher` base in base_test."""

import json

import pytest

from sfjax.automl.algorithms import (
  ALGORITHMS,
  ASHA,
  BOHB,
  MOTPE,
  NSGA2,
  PBT,
  TPE,
  AlgorithmSpec,
  GridSearch,
  Hyperband,
  Objective,
  QuasiRandomSearch,
  RandomSearch,
  RegularizedEvolution,
  SuccessiveHalving,
  algorithm_from_dict,
)

AUC = Objective("auc", "maximize")

SPECS = [
    RandomSearch(seed=1), GridSearch(num_points_per_float=2, shuffle=True, seed=1),
    QuasiRandomSearch(seed=1), QuasiRandomSearch(sequence="halton", seed=1),
    RegularizedEvolution(population_size=6, sample_size=3, seed=1), TPE(seed=1, n_startup_trials=4),
    SuccessiveHalving(min_budget=1, max_budget=9, eta=3, seed=1),
    Hyperband(min_budget=1, max_budget=9, eta=3, seed=1), ASHA(min_budget=1, max_budget=9, seed=1),
    BOHB(min_budget=1, max_budget=9, eta=3, num_iterations=2, n_startup_trials=3, seed=1),
    PBT(population_size=4, seed=1), NSGA2(population_size=4, seed=1),
    MOTPE(n_startup_trials=4, seed=1),
]


def run_rounds(searcher, fake_auc, rounds, batch, leave_pending=0):
  """Asks and tells `rounds` batches; the last `leave_pending` of the final batch stay pending."""
  for r in range(rounds):
    suggestions = searcher.ask(batch)
    keep = leave_pending if r == rounds - 1 else 0
    for s in suggestions[:len(suggestions) - keep]:
      searcher.tell(s.trial_id, {"auc": fake_auc(s.config, s.budget)})


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}")
def test_ask_gives_valid_batches(spec, model_space, fake_auc):
  searcher = spec.build(model_space, AUC)
  ids = []
  for _ in range(4):
    batch = searcher.ask(5)
    assert 1 <= len(batch) <= 5
    for s in batch:
      model_space.validate(s.config)
      ids.append(s.trial_id)
      multi_fidelity = spec.name in ("successive_halving", "hyperband", "asha", "bohb")
      assert (s.budget is not None) == multi_fidelity
    for s in batch:
      searcher.tell(s.trial_id, {"auc": fake_auc(s.config, s.budget)})
  assert ids == list(range(len(ids)))
  assert len(searcher.history) == len(ids) and not searcher.pending


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}")
def test_state_dict_round_trips_through_json(spec, model_space, fake_auc):
  searcher = spec.build(model_space, AUC)
  run_rounds(searcher, fake_auc, rounds=4, batch=4, leave_pending=2)
  state = json.loads(json.dumps(searcher.state_dict()))
  restored = algorithm_from_dict(spec.to_dict()).build(model_space, AUC)
  restored.load_state_dict(state)
  assert [s.trial_id for s in restored.pending] == [s.trial_id for s in searcher.pending]
  for s in list(searcher.pending):
    for x in (searcher, restored):
      x.tell(s.trial_id, {"auc": fake_auc(s.config, s.budget)})
  assert restored.ask(3) == searcher.ask(3)


def test_algorithm_from_dict_rejects_unknown_names():
  with pytest.raises(ValueError, match="unknown algorithm 'cmaes'"):
    algorithm_from_dict({"name": "cmaes"})
  with pytest.raises(ValueError, match="'tpe'"):
    algorithm_from_dict({"name": "tpe", "bogus": 1})
  assert algorithm_from_dict(TPE(seed=4).to_dict()) == TPE(seed=4)


def test_registry_keys_are_the_spec_names():
  assert sorted(ALGORITHMS) == sorted([
      "random", "grid", "qmc", "evolution", "tpe", "gp", "successive_halving", "hyperband",
      "asha", "bohb", "pbt", "nsga2", "motpe"])
  for name, spec in ALGORITHMS.items():
    assert spec.name == name
    assert issubclass(spec, AlgorithmSpec)
    default = spec()
    assert default.to_dict()["name"] == name
    assert algorithm_from_dict(json.loads(json.dumps(default.to_dict()))) == default


def test_runner_hooks_are_set_exactly_for_their_algorithms():
  multi_fidelity = {name for name, spec in ALGORITHMS.items() if spec.multi_fidelity}
  assert multi_fidelity == {"successive_halving", "hyperband", "asha", "bohb"}
  population_based = {name for name, spec in ALGORITHMS.items() if spec.population_based}
  assert population_based == {"pbt"}
  multi_objective = {name for name, spec in ALGORITHMS.items()
                     if getattr(spec, "multi_objective", False)}
  assert multi_objective == {"nsga2", "motpe"}
  for spec in SPECS:  # instances see the class attributes too
    assert spec.multi_fidelity == (spec.name in multi_fidelity)
