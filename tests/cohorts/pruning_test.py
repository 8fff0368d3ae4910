"""The pruning rule against hand-computed cases and against Optuna's own PercentilePruner."""

import math

import ml_collections
import numpy as np
import pytest

from sfjax.automl.algorithms import Objective, Objectives, Suggestion, TrialStatus
from sfjax.automl.space import Config
from sfjax.automl.study import TrialRecord
from sfjax.cohorts import pruning
from sfjax.cohorts.pruning import PrunerSpec

COMPLETED = [{10: 0.6, 20: 0.62}, {10: 0.7, 20: 0.75}, {10: 0.8}]


def _median(**kwargs):
  return PrunerSpec(**{"percentile": 50.0, "n_startup_trials": 3, **kwargs})


def test_median_rule_by_hand():
  spec = _median()
  assert pruning.should_prune(spec, {10: 0.65}, COMPLETED)  # below the median 0.7
  assert not pruning.should_prune(spec, {10: 0.7}, COMPLETED)  # not worse than it
  assert not pruning.should_prune(spec, {10: 0.75}, COMPLETED)
  # The best so far counts, at the latest step: 0.9 (step 10) beats 0.685 (step 20's median).
  assert not pruning.should_prune(spec, {10: 0.9, 20: 0.5}, COMPLETED)
  assert pruning.should_prune(spec, {10: 0.66, 20: 0.67}, COMPLETED)  # 0.67 < (0.62+0.75)/2
  assert not pruning.should_prune(spec, {30: 0.1}, COMPLETED)  # nobody reported step 30
  assert pruning.should_prune(spec, {10: math.nan}, COMPLETED)  # only NaN: pruned
  assert not pruning.should_prune(spec, {}, COMPLETED)  # nothing reported yet


def test_startup_trials_and_warmup_steps():
  assert not pruning.should_prune(_median(n_startup_trials=4), {10: 0.1}, COMPLETED)
  assert not pruning.should_prune(_median(n_startup_trials=0), {10: 0.1}, [])  # none completed
  assert not pruning.should_prune(_median(n_warmup_steps=11), {10: 0.1}, COMPLETED)
  assert pruning.should_prune(_median(n_warmup_steps=10), {10: 0.1}, COMPLETED)


def test_percentiles_and_directions_by_hand():
  completed = [{5: v} for v in (0.6, 0.7, 0.8, 0.9, math.nan)]  # NaN reports are ignored
  top_quarter = PrunerSpec(percentile=25.0, n_startup_trials=1)
  # maximise: the (100 - 25)th percentile of 0.6..0.9 is 0.8 + 0.25 * 0.1 = 0.825
  assert pruning.percentile_bar(completed, 5, 25.0, "maximize") == pytest.approx(0.825)
  assert pruning.should_prune(top_quarter, {5: 0.82}, completed)
  assert not pruning.should_prune(top_quarter, {5: 0.83}, completed)
  # minimise: the 25th percentile is 0.6 + 0.75 * 0.1 = 0.675; worse means larger
  low = PrunerSpec(percentile=25.0, n_startup_trials=1, direction="minimize", metric="logloss")
  assert pruning.should_prune(low, {5: 0.68}, completed)
  assert not pruning.should_prune(low, {5: 0.67}, completed)
  assert pruning.best_so_far({1: 0.3, 2: 0.2, 3: math.nan}, "minimize") == 0.2


def test_rule_matches_optunas_percentile_pruner():
  optuna = pytest.importorskip("optuna")
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  rng = np.random.default_rng(0)
  outcomes = []
  for case in range(60):
    direction = ("maximize", "minimize")[case % 2]
    percentile = float(rng.choice([10.0, 25.0, 50.0, 90.0]))
    spec = PrunerSpec(percentile, int(rng.integers(0, 4)), int(rng.integers(0, 3)), 1,
                      direction=direction)
    study = optuna.create_study(direction=direction, pruner=optuna.pruners.PercentilePruner(
        percentile, n_startup_trials=spec.n_startup_trials, n_warmup_steps=spec.n_warmup_steps))
    completed = []
    for _ in range(int(rng.integers(0, 6))):
      reports = {s: float(rng.random()) for s in range(int(rng.integers(1, 4)))}
      completed.append(reports)
      study.add_trial(optuna.trial.create_trial(value=0.5, intermediate_values=reports))
    trial = study.ask()
    values = {s: float(rng.random()) for s in range(int(rng.integers(1, 4)))}
    for step, value in values.items():
      trial.report(value, step)
    outcomes.append(trial.should_prune())
    assert pruning.should_prune(spec, values, completed) == outcomes[-1], (case, values)
  assert 10 < sum(outcomes) < 50  # both verdicts are exercised


def test_next_eval_point():
  spec = PrunerSpec(eval_every=25)
  assert [spec.next_eval(s, 100) for s in (0, 24, 25, 90)] == [25, 25, 50, 100]
  assert spec.next_eval(30, 40) == 40


def _block(**kwargs):
  return ml_collections.ConfigDict({"kind": "median", "percentile": 25.0, "n_startup_trials": 5,
                                    "n_warmup_steps": 0, "eval_every": 1.0, **kwargs})


def test_from_config():
  auc = Objective("auc", "maximize")
  assert pruning.from_config(_block(kind="none"), auc, lambda b: 50) is None
  spec = pruning.from_config(_block(eval_every=0.5), auc, lambda b: int(b * 50))
  assert spec == PrunerSpec(50.0, 5, 0, 25, "auc", "maximize")  # median: p = 50
  spec = pruning.from_config(_block(kind="percentile", n_warmup_steps=10),
                             Objective("logloss", "minimize"), lambda b: 50)
  assert (spec.percentile, spec.n_warmup_steps, spec.direction) == (25.0, 10, "minimize")
  for block, objective, kwargs, field in [
      (_block(kind="mean"), auc, {}, "study.pruner.kind"),
      (_block(kind="percentile", percentile=101.0), auc, {}, "study.pruner.percentile"),
      (_block(n_startup_trials=-1), auc, {}, "study.pruner.n_startup_trials"),
      (_block(eval_every=0.0), auc, {}, "study.pruner.eval_every"),
      (_block(patience=3), auc, {}, "study.pruner.patience"),
      (_block(), Objective("params", "minimize"), {}, "one objective"),
      (_block(), Objectives.of([auc, Objective("params", "minimize")]), {}, "one objective"),
      (_block(), auc, {"executor": "dask"}, "study.executor"),
      (_block(), auc, {"schedule": "async"}, "study.dispatch"),
      (_block(), auc, {"population_based": True}, "PBT")]:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
      pruning.from_config(block, objective, lambda b: 50, **kwargs)


def _record(trial_id, status, steps, budget=None):
  s = Suggestion(trial_id, Config({"x": 1.0}), budget=budget)
  return TrialRecord(s, status, {"steps": steps}, None, 0.0, 0.0, 1.0, 1.0, 1)


def test_summary_counts_the_steps_pruned_trials_did_not_train():
  trials = [_record(0, TrialStatus.PRUNED, 25), _record(1, TrialStatus.DONE, 100),
            _record(2, TrialStatus.PRUNED, 50, budget=2.0), _record(3, TrialStatus.FAILED, 10)]
  out = pruning.summary(trials, lambda t: 100 if t.suggestion.budget is None else 80)
  assert out == {"num_pruned": 2, "trial_steps_saved": 75 + 30}
