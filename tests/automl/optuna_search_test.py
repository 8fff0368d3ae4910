"""Tests for the Optuna-backed searches, TPE and GP (sfjax/automl/algorithms/optuna_search.py)."""

import importlib.util

import numpy as np
import optuna
import pytest

from sfjax.automl.algorithms import GP, TPE, Objective, RandomSearch, TrialStatus, optuna_search
from sfjax.automl.space import Categorical, Float, Int, Space

AUC = Objective("auc", "maximize")


def test_tpe_beats_random_search_on_a_quadratic(toy_best):
  def make(seed):
    return TPE(seed=seed)

  seeds = range(5)
  ours = np.median([toy_best(make(s)) for s in seeds])
  random = np.median([toy_best(RandomSearch(seed=s)) for s in seeds])
  assert ours < random / 2, (ours, random)


@pytest.mark.quality  # the GP sampler beats random search on the toy quadratic
def test_gp_needs_torch_or_works(model_space, toy_best):
  if importlib.util.find_spec("torch") is None:
    with pytest.raises(ImportError, match="needs PyTorch"):
      GP().build(model_space, AUC)
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


def test_tpe_is_deterministic_for_a_seed(model_space, fake_auc):
  def proposals(seed):
    searcher, out = TPE(seed=seed, n_startup_trials=3).build(model_space, AUC), []
    for _ in range(3):
      batch = searcher.ask(3)
      out += [s.config for s in batch]
      for s in batch:
        searcher.tell(s.trial_id, {"auc": fake_auc(s.config)})
    return out

  assert proposals(2) == proposals(2)
  assert proposals(2) != proposals(3)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_history_and_pending_are_replayed_with_their_states():
  from optuna.samplers._base import _CONSTRAINTS_KEY  # pylint: disable=g-import-not-at-top
  space = Space({"x": Float(0.0, 1.0)})
  searcher = TPE(seed=0).build(space, Objective("loss", "minimize"))
  batch = searcher.ask(5)
  searcher.tell(0, {"loss": 0.5})
  searcher.tell(1, {"loss": 0.25})
  searcher.tell(2, {}, TrialStatus.FAILED)
  searcher.tell(3, {}, TrialStatus.PRUNED)
  rejected = searcher.ask(1)[0]
  searcher.tell(rejected.trial_id, {}, TrialStatus.REJECTED)
  study = optuna_search.rebuilt_study(optuna, space, searcher.objective, optuna.samplers.RandomSampler(),
                                      searcher.history, [s.config for s in searcher.pending])
  state = optuna.trial.TrialState
  trials = study.get_trials(deepcopy=False)
  # History in the order told, then pending (trial 4) as RUNNING for the constant liar.
  assert [t.state for t in trials] == [state.COMPLETE, state.COMPLETE, state.FAIL, state.FAIL,
                                       state.COMPLETE, state.RUNNING]
  assert [t.params["x"] for t in trials] == [batch[i].config["x"] for i in (0, 1, 2, 3)] + \
      [rejected.config["x"], batch[4].config["x"]]
  assert [t.value for t in trials[:2]] == [0.5, 0.25]
  assert trials[4].value == 0.5  # a rejected trial scores the worst value seen, and
  constraints = [t.system_attrs.get(_CONSTRAINTS_KEY) for t in trials]
  assert constraints[:2] == [(0.0,), (0.0,)] and constraints[4] == (1.0,)  # is infeasible


def test_optuna_logging_is_left_as_found():
  before = optuna.logging.get_verbosity()
  optuna.logging.set_verbosity(optuna.logging.INFO)
  try:
    searcher = TPE(seed=0).build(Space({"x": Float(0.0, 1.0)}), AUC)
    searcher.tell(searcher.ask(1)[0].trial_id, {"auc": 0.5})
    searcher.ask(2)
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
  finally:
    optuna.logging.set_verbosity(before)


def test_names():
  assert (TPE.name, GP.name) == ("tpe", "gp")
  assert not TPE.multi_fidelity and not GP.population_based
