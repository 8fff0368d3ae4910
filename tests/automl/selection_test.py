"""Which trials of a study win (sfjax/automl/study/selection.py), by hand."""

import pytest

from sfjax.automl.algorithms import Objective, Suggestion
from sfjax.automl.space import Config
from sfjax.automl.study import StudyError, selection
from sfjax.automl.study.trial_record import asked, finished

AUC_PARAMS = {"auc": "maximize", "params": "minimize"}


def _trial(trial_id, budget, status="done", **metrics):
  t = asked(Suggestion(trial_id, Config({"x": trial_id}), budget=budget), 0.0)
  return finished(t, {"status": status, "metrics": metrics, "time": 1.0})


def test_best_trial_competes_only_at_the_largest_budget():
  trials = [_trial(0, 1.0, auc=0.9), _trial(1, 3.0, auc=0.7), _trial(2, 3.0, auc=0.8),
            _trial(3, 3.0, "failed", auc=0.99)]
  assert selection.best_trial(trials, Objective("auc", "maximize")).trial_id == 2
  assert selection.best_trial(trials, Objective("auc", "minimize")).trial_id == 1
  ties = [_trial(5, None, auc=0.5), _trial(4, None, auc=0.5)]
  assert selection.best_trial(ties, Objective("auc", "maximize")).trial_id == 4
  assert selection.best_trial([_trial(0, None, "failed")], Objective("auc", "maximize")) is None


def test_front_per_budget_leaves_out_trials_without_a_metric():
  trials = [_trial(0, 1.0, auc=0.9, params=10.0),
            _trial(1, 3.0, auc=0.7, params=5.0), _trial(2, 3.0, auc=0.8, params=8.0),
            _trial(3, 3.0, auc=0.6, params=9.0),  # dominated by trial 1
            _trial(4, 3.0, auc=0.95)]  # no params: left out
  def ids(ts):
    return [t.trial_id for t in ts]
  assert ids(selection.front(trials, AUC_PARAMS)) == [1, 2]  # the largest budget, 3.0
  assert ids(selection.front(trials, AUC_PARAMS, budget=1.0)) == [0]
  assert ids(selection.front(trials, AUC_PARAMS, budget="all")) == [0, 1, 2]
  assert [(b, ids(f)) for b, f in selection.fronts(trials, AUC_PARAMS)] == [
      (1.0, [0]), (3.0, [1, 2])]
  assert ids(selection.front([_trial(7, None, auc=0.5, params=1.0)], AUC_PARAMS)) == [7]


def test_front_needs_directions():
  with pytest.raises(StudyError, match="pareto_front needs directions"):
    selection.front([], None)
