"""Median / percentile pruning of a cohort's members: Optuna's rule, as a pure function.

Issue #26 item 5. A member of a running cohort reports its objective (the valid AUC)
at each eval point (`PrunerSpec.eval_every` steps of its own); `should_prune` then
judges it as Optuna's `PercentilePruner` judges a trial at `trial.report(value, step)`
(`MedianPruner` is the 50th percentile; our own code, the same semantics):

  * no pruning before `n_startup_trials` trials COMPLETED (done: running, pruned and
    failed ones do not count), nor at a step below `n_warmup_steps`;
  * the member's best-so-far value over its reported steps (max for a maximised
    objective; all NaN prunes it) is compared with the p-th percentile of the values
    the completed trials reported at the same step (`numpy.nanpercentile`; for a
    maximised objective the (100 - p)-th, so p = 25 keeps the top quarter's bar);
    no completed trial reported that step: no pruning;
  * maximise: pruned when best < bar; minimise: when best > bar.

Steps are the trial's own global training steps (a promotion resumed at step s
reports from s on), the same steps the Optuna mirror writes. Optuna's
`interval_steps` is 1 here (every eval point is checked) and `n_min_trials` 1.

Config: `study.pruner.{kind: none|median|percentile, percentile, n_startup_trials,
n_warmup_steps, eval_every}` (`from_config`; kind 'none', the default, leaves a
search exactly as without the block).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sfjax.automl.algorithms import TrialStatus, all_objectives
from sfjax.automl.study import TrialRecord

KINDS = ("none", "median", "percentile")
# Metrics a cohort call measures at every eval point (`cohort_call.CohortOutput`).
PRUNABLE_METRICS = ("auc", "logloss")


@dataclasses.dataclass(frozen=True)
class PrunerSpec:
  """A median / percentile pruner (see the module docstring).

  Attributes:
    percentile: p in [0, 100] (median: 50).
    n_startup_trials: completed trials before any pruning.
    n_warmup_steps: no pruning at a reported step below this.
    eval_every: steps between a member's eval points (its own steps, >= 1).
    metric: the reported metric (the study's objective).
    direction: 'maximize' or 'minimize'.
  """

  percentile: float = 50.0
  n_startup_trials: int = 5
  n_warmup_steps: int = 0
  eval_every: int = 1
  metric: str = "auc"
  direction: str = "maximize"

  def __post_init__(self):
    if not 0.0 <= float(self.percentile) <= 100.0:
      raise ValueError(f"study.pruner.percentile must be in [0, 100], got {self.percentile!r}")
    for name, low in (("n_startup_trials", 0), ("n_warmup_steps", 0), ("eval_every", 1)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"study.pruner.{name} must be an integer >= {low}, got {value!r}")
    if self.direction not in ("maximize", "minimize"):
      raise ValueError(f"PrunerSpec.direction must be 'maximize' or 'minimize', got "
                       f"{self.direction!r}")

  def next_eval(self, step: int, end: int) -> int:
    """The member's next eval point after own step `step`: the next multiple of
    `eval_every`, or its end if sooner."""
    return min(int(end), (int(step) // self.eval_every + 1) * self.eval_every)


def best_so_far(values: Mapping[int, float], direction: str) -> float:
  """The best of a member's reported values (NaN if every one is NaN)."""
  finite = [v for v in values.values() if not math.isnan(v)]
  if not finite:
    return math.nan
  return max(finite) if direction == "maximize" else min(finite)


def percentile_bar(completed: Sequence[Mapping[int, float]], step: int, percentile: float,
                   direction: str) -> float:
  """The value a member must reach at `step`: the p-th percentile (maximise: (100 - p)-th)
  of the completed trials' values reported at `step`; NaN when none reported it."""
  at_step = [float(c[step]) for c in completed if step in c]
  if not at_step or all(math.isnan(v) for v in at_step):
    return math.nan
  q = 100.0 - percentile if direction == "maximize" else percentile
  return float(np.nanpercentile(np.asarray(at_step, np.float64), q))


def should_prune(spec: PrunerSpec, values: Mapping[int, float],
                 completed: Sequence[Mapping[int, float]]) -> bool:
  """Whether a member that reported `values` (own step -> value) is pruned now, at its
  latest step, given the completed trials' reports (Optuna's `PercentilePruner.prune`).

  Args:
    spec: the pruner.
    values: the member's reports so far (step -> value).
    completed: per completed (done) trial, its reports (step -> value).
  """
  if not values or not completed or len(completed) < spec.n_startup_trials:
    return False
  step = max(values)
  if step < spec.n_warmup_steps:
    return False
  best = best_so_far(values, spec.direction)
  if math.isnan(best):
    return True
  bar = percentile_bar(completed, step, spec.percentile, spec.direction)
  if math.isnan(bar):
    return False
  return best < bar if spec.direction == "maximize" else best > bar


def from_config(block: Any, objective: Any, steps_for_budget: Callable[[float], int], *,
                executor: str = "local", schedule: str = "rounds",
                population_based: bool = False) -> PrunerSpec | None:
  """The pruner a search's `study.pruner` block describes (None for kind 'none').

  Args:
    block: the `study.pruner` ConfigDict (or mapping): kind, percentile (percentile
      kind only; median is 50), n_startup_trials, n_warmup_steps (training steps),
      eval_every (budget units between eval points).
    objective: the study's objective(s); pruning needs one, on a metric measured at
      every eval point (`PRUNABLE_METRICS`).
    steps_for_budget: budget units -> training steps (`CTRTask.steps_for_budget`).
    executor, schedule, population_based: the search's executor, its dispatch schedule
      and whether its algorithm trains populations (PBT): pruning runs its cohorts in
      the driver, in rounds, and PBT replaces its members itself.

  Raises:
    ValueError: naming the bad `study.pruner.*` field (or the setting it clashes with).
  """
  settings = dict(block.items()) if hasattr(block, "items") else None
  if settings is None:
    raise ValueError(f"study.pruner: expected a block of settings, got {block!r}")
  known = ("kind", "percentile", "n_startup_trials", "n_warmup_steps", "eval_every")
  unknown = sorted(set(settings) - set(known))
  if unknown:
    raise ValueError(f"study.pruner.{unknown[0]}: unknown pruner setting; known: {list(known)}")
  kind = settings.get("kind", "none")
  if kind not in KINDS:
    raise ValueError(f"study.pruner.kind: unknown pruner {kind!r}; known: {list(KINDS)}")
  if kind == "none":
    return None
  objectives = all_objectives(objective)
  if len(objectives) != 1 or objectives[0].metric not in PRUNABLE_METRICS:
    raise ValueError(f"study.pruner.kind={kind!r} needs one objective among "
                     f"{list(PRUNABLE_METRICS)} (reported at every eval point), got "
                     f"{[o.metric for o in objectives]}")
  if executor != "local":
    raise ValueError(f"study.pruner.kind={kind!r} needs study.executor='local' (refills are "
                     f"asked from the study mid-cohort), got {executor!r}")
  if schedule != "rounds":
    raise ValueError(f"study.pruner.kind={kind!r} runs its cohorts in rounds; the search's "
                     f"study.dispatch schedule is {schedule!r}")
  if population_based:
    raise ValueError(f"study.pruner.kind={kind!r}: a population-based algorithm (PBT) "
                     "replaces its members itself; use kind 'none'")
  every = settings.get("eval_every", 1.0)
  if isinstance(every, bool) or not isinstance(every, (int, float)) or not 0 < every < math.inf:
    raise ValueError(f"study.pruner.eval_every: expected budget units > 0, got {every!r}")
  percentile = 50.0 if kind == "median" else settings.get("percentile", 25.0)
  if isinstance(percentile, bool) or not isinstance(percentile, (int, float)):
    raise ValueError(f"study.pruner.percentile: expected a number in [0, 100], got "
                     f"{percentile!r}")
  return PrunerSpec(float(percentile), settings.get("n_startup_trials", 5),
                    settings.get("n_warmup_steps", 0), max(1, int(steps_for_budget(every))),
                    objectives[0].metric, objectives[0].direction)


def summary(trials: Sequence[TrialRecord], planned_steps: Callable[[TrialRecord], int]
            ) -> dict[str, int]:
  """What pruning saved in a study: `num_pruned` trials and `trial_steps_saved`, the
  steps they would have trained to their planned end (`planned_steps`) but did not."""
  pruned = [t for t in trials if t.status == TrialStatus.PRUNED and "steps" in t.metrics]
  return {"num_pruned": len(pruned),
          "trial_steps_saved": int(sum(max(planned_steps(t) - int(t.metrics["steps"]), 0)
                                       for t in pruned))}
