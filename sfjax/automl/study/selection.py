"""Which trials of a study win: the best one and the Pareto fronts, budget-aware.

With budgets (multi-fidelity algorithms), trials compete only with trials of the
same budget, by default the largest one reached: a low-fidelity result never
beats a full one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sfjax.automl.algorithms.base import Objective, TrialStatus
from sfjax.automl.pareto import pareto_front
from sfjax.automl.study.trial_record import StudyError, TrialRecord


def _done(trials: Sequence[TrialRecord]) -> list[TrialRecord]:
  return [t for t in trials if t.status == TrialStatus.DONE]


def best_trial(trials: Sequence[TrialRecord], objective: Objective) -> TrialRecord | None:
  """Best DONE trial by `objective` (ties: the lower id); with budgets, among those at
  the largest budget reached. None when no trial is done."""
  done = _done(trials)
  budgets = [t.suggestion.budget for t in done if t.suggestion.budget is not None]
  if budgets:
    done = [t for t in done if t.suggestion.budget == max(budgets)]
  if not done:
    return None
  return min(done, key=lambda t: (objective.loss(objective.value(t.metrics)), t.trial_id))


def front(trials: Sequence[TrialRecord], directions: Mapping[str, str] | None,
          budget: float | None | str = "largest") -> list[TrialRecord]:
  """Non-dominated DONE trials over `directions`, in the order of `trials`.

  Args:
    trials: the study's trials.
    directions: metric -> 'maximize' / 'minimize'.
    budget: the budget whose trials compete: 'largest' (the largest budget
      reached), a budget value, or 'all' (every budget mixed).

  Trials lacking one of the metrics are left out.

  Raises:
    StudyError: no directions.
  """
  if not directions:
    raise StudyError("pareto_front needs directions, e.g. {'auc': 'maximize', "
                     "'params': 'minimize'}")
  names = list(directions)
  done = [t for t in _done(trials) if all(m in t.metrics for m in names)]
  if budget == "largest":
    budgets = [t.suggestion.budget for t in done if t.suggestion.budget is not None]
    budget = max(budgets) if budgets else "all"
  if budget != "all":
    done = [t for t in done if t.suggestion.budget == budget]
  points = np.array([[t.metrics[m] for m in names] for t in done]).reshape(len(done), len(names))
  return [done[i] for i in pareto_front(points, [directions[m] for m in names])]


def fronts(trials: Sequence[TrialRecord], directions: Mapping[str, str] | None
           ) -> list[tuple[float | None, list[TrialRecord]]]:
  """`(budget, front)` for every budget with a DONE trial, smallest budget first
  (one `(None, front)` entry for trials without budgets)."""
  budgets = {t.suggestion.budget for t in _done(trials)}
  order = sorted(b for b in budgets if b is not None) + ([None] if None in budgets else [])
  return [(b, front(trials, directions, budget=b)) for b in order]
