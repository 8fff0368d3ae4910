"""Tests shared by every search algorithm, plus random / grid / quasi-random / evolution /
Optuna-backed specifics (sfjax/automl/algorithms)."""

import importlib.util
import json

import numpy as np
import pytest

from sfjax.automl.algorithms import (
    ASHA,
    GP,
    TPE,
    GridSearch,
    Hyperband,
    Objective,
    QuasiRandomSearch,
    RandomSearch,
    RegularizedEvolution,
    SuccessiveHalving,
    TrialStatus,
    algorithm_from_dict,
    mutate,
)
from sfjax.automl.space import Categorical, Condition, Float, Int, Space

SPACE = Space(
    {"model": Categorical(("fm", "deepfm", "dcnv2")), "depth": Int(1, 3),
     "width": Int(16, 256, log=True), "lr": Float(1e-4, 1e-1, log=True), "dropout": Float(0, 0.5)},
    [Condition("depth", "model", "in", ("deepfm", "dcnv2")),
     Condition("width", "model", "in", ("deepfm", "dcnv2"))],
    [{"model": "dcnv2", "depth": 3}])
AUC = Objective("auc", "maximize")

SPECS = [
    RandomSearch(seed=1), GridSearch(num_points_per_float=2, shuffle=True, seed=1),
    QuasiRandomSearch(seed=1), QuasiRandomSearch(sequence="halton", seed=1),
    RegularizedEvolution(population_size=6, sample_size=3, seed=1), TPE(seed=1, n_startup_trials=4),
    SuccessiveHalving(min_budget=1, max_budget=9, eta=3, seed=1),
    Hyperband(min_budget=1, max_budget=9, eta=3, seed=1), ASHA(min_budget=1, max_budget=9, seed=1),
]


def fake_auc(config, budget=None) -> float:
  """A smooth toy objective of the config (higher is better)."""
  auc = 0.7 - (np.log10(config["lr"]) + 2.5) ** 2 / 20 - config["dropout"] / 10
  if config["model"] != "fm":
    auc += 0.02 * config["depth"] - (np.log2(config["width"]) - 6) ** 2 / 400
  return float(auc + (0.0 if budget is None else 0.01 * np.log(budget)))


def run_rounds(searcher, rounds, batch, leave_pending=0):
  """Asks and tells `rounds` batches; the last `leave_pending` of the final batch stay pending."""
  for r in range(rounds):
    suggestions = searcher.ask(batch)
    keep = leave_pending if r == rounds - 1 else 0
    for s in suggestions[:len(suggestions) - keep]:
      searcher.tell(s.trial_id, {"auc": fake_auc(s.config, s.budget)})


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}")
def test_ask_gives_valid_batches(spec):
  searcher = spec.build(SPACE, AUC)
  ids = []
  for _ in range(4):
    batch = searcher.ask(5)
    assert 1 <= len(batch) <= 5
    for s in batch:
      SPACE.validate(s.config)
      ids.append(s.trial_id)
      multi_fidelity = spec.name in ("successive_halving", "hyperband", "asha")
      assert (s.budget is not None) == multi_fidelity
    for s in batch:
      searcher.tell(s.trial_id, {"auc": fake_auc(s.config, s.budget)})
  assert ids == list(range(len(ids)))
  assert len(searcher.history) == len(ids) and not searcher.pending


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}")
def test_state_dict_round_trips_through_json(spec):
  searcher = spec.build(SPACE, AUC)
  run_rounds(searcher, rounds=4, batch=4, leave_pending=2)
  state = json.loads(json.dumps(searcher.state_dict()))
  restored = algorithm_from_dict(spec.to_dict()).build(SPACE, AUC)
  restored.load_state_dict(state)
  assert [s.trial_id for s in restored.pending] == [s.trial_id for s in searcher.pending]
  for s in list(searcher.pending):
    for x in (searcher, restored):
      x.tell(s.trial_id, {"auc": fake_auc(s.config, s.budget)})
  assert restored.ask(3) == searcher.ask(3)


def test_tell_errors_and_nan():
  searcher = RandomSearch().build(SPACE, AUC)
  a, b, c = searcher.ask(3)
  with pytest.raises(ValueError, match="lack the objective metric 'auc'"):
    searcher.tell(a.trial_id, {"loss": 0.3})
  searcher.tell(a.trial_id, {"auc": 0.7, "loss": 0.3})
  with pytest.raises(KeyError, match="already told"):
    searcher.tell(a.trial_id, {"auc": 0.7})
  with pytest.raises(KeyError, match="never asked"):
    searcher.tell(99, {"auc": 0.7})
  with pytest.raises(ValueError, match="must be final"):
    searcher.tell(b.trial_id, {}, "running")
  assert searcher.tell(b.trial_id, {"auc": float("nan")}).status == TrialStatus.FAILED
  assert searcher.tell(c.trial_id, {}, "failed").loss == float("inf")
  assert searcher.history[0].loss == -0.7  # maximise -> negated


def test_grid_search_enumerates_then_finishes():
  space = Space({"a": Categorical(("x", "y")), "b": Int(1, 3)})
  searcher = GridSearch().build(space, AUC)
  seen = []
  while not searcher.finished:
    batch = searcher.ask(4)
    seen += [s.config for s in batch]
    for s in batch:
      searcher.tell(s.trial_id, {"auc": 0.5})
  assert len(seen) == 6 and set(seen) == set(space.grid())
  assert searcher.ask(4) == []


def test_sobol_points_are_stratified():
  space = Space({"x": Float(0.0, 1.0)})
  searcher = QuasiRandomSearch(seed=3).build(space, AUC)
  xs = [s.config["x"] for s in searcher.ask(8)]
  # The first 2^3 points of a (scrambled) Sobol sequence hit each eighth once.
  assert sorted(int(x * 8) for x in xs) == list(range(8))


def test_mutation_changes_one_parameter_and_respects_conditions():
  rng = np.random.default_rng(0)
  parent = SPACE.validate({"model": "fm", "lr": 0.01, "dropout": 0.1})
  changed_keys = set()
  for _ in range(200):
    child = mutate(SPACE, parent, rng, scale=0.2)
    SPACE.validate(child)
    if child["model"] == "fm":
      changed = [k for k in parent if child[k] != parent[k]]
      assert len(changed) == 1
      changed_keys.update(changed)
    else:  # the model changed: depth and width became active with fresh values
      assert {"depth", "width"} <= set(child) and child["lr"] == parent["lr"]
      changed_keys.add("model")
  assert changed_keys == {"model", "lr", "dropout"}


def toy_best(spec, trials=60, batch=4, seed_objective=True):
  """Best loss on a 2-D quadratic with minimum 0 at (1.5, -2)."""
  space = Space({"x": Float(-5.0, 5.0), "y": Float(-5.0, 5.0)})
  searcher = spec.build(space, Objective("loss", "minimize"))
  best = np.inf
  while len(searcher.history) < trials:
    for s in searcher.ask(batch):
      loss = (s.config["x"] - 1.5) ** 2 + (s.config["y"] + 2) ** 2
      best = min(best, loss)
      searcher.tell(s.trial_id, {"loss": loss})
  return best


@pytest.mark.parametrize("make", [
    lambda seed: RegularizedEvolution(population_size=10, sample_size=3, mutation_scale=0.1,
                                      seed=seed),
    lambda seed: TPE(seed=seed),
], ids=["evolution", "tpe"])
def test_beats_random_search_on_a_quadratic(make):
  seeds = range(5)
  ours = np.median([toy_best(make(s)) for s in seeds])
  random = np.median([toy_best(RandomSearch(seed=s)) for s in seeds])
  assert ours < random / 2, (ours, random)


def test_gp_needs_torch_or_works():
  if importlib.util.find_spec("torch") is None:
    with pytest.raises(ImportError, match="needs PyTorch"):
      GP().build(SPACE, AUC)
  else:
    assert toy_best(GP(seed=0), trials=30) < toy_best(RandomSearch(seed=0), trials=30)


def test_tpe_skips_forbidden_suggestions():
  space = Space({"a": Categorical((0, 1, 2))}, forbidden=[{"a": 0}, {"a": 1}])
  searcher = TPE(seed=0, n_startup_trials=2).build(space, AUC)
  for _ in range(3):
    batch = searcher.ask(2)
    assert [s.config["a"] for s in batch] == [2, 2]
    for s in batch:
      searcher.tell(s.trial_id, {"auc": 0.5})


def test_tpe_learns_to_avoid_rejected_configs():
  space = Space({"x": Float(-3.0, 3.0), "width": Int(16, 256, log=True)})

  def late_rejections(spec):
    searcher, rejected = spec.build(space, Objective("loss", "minimize")), []
    for _ in range(20):
      for s in searcher.ask(4):
        rejected.append(s.config["width"] > 100)  # a quota filter's verdict
        if rejected[-1]:
          searcher.tell(s.trial_id, {}, TrialStatus.REJECTED)
        else:
          searcher.tell(s.trial_id, {"loss": (s.config["x"] - 1) ** 2})
    return sum(rejected[-40:])

  tpe = sum(late_rejections(TPE(seed=s)) for s in range(4))
  random = sum(late_rejections(RandomSearch(seed=s)) for s in range(4))
  assert tpe < random / 2, (tpe, random)


def test_algorithm_from_dict_rejects_unknown_names():
  with pytest.raises(ValueError, match="unknown algorithm 'cmaes'"):
    algorithm_from_dict({"name": "cmaes"})
  with pytest.raises(ValueError, match="'tpe'"):
    algorithm_from_dict({"name": "tpe", "bogus": 1})
  assert algorithm_from_dict(TPE(seed=4).to_dict()) == TPE(seed=4)
