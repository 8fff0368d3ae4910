"""Multi-objective search through Optuna: NSGA-II (`nsga2`) and multi-objective TPE (`motpe`).

Objectives: `Objectives` holds several `Objective`s (e.g. AUC up, parameters
down) and behaves as its first one wherever a single objective is needed (a
study's `best()`, the leaderboard), so every single-objective consumer keeps
working. The searchers here read all of them.

Like `optuna_search`, the searcher's state is `history + pending + generator`: at
every `ask(n)` a fresh in-memory Optuna study with `directions=[...]` is rebuilt
from it (DONE trials as COMPLETE with one value per objective; quota rejections
as COMPLETE but infeasible, constraint 1.0 > 0, with the worst value seen of each
objective; failed ones as FAIL; pending ones as RUNNING), and asked with a
sampler seeded from the searcher's generator.

NSGA-II (Deb et al. 2002) also needs each trial's **generation**, which Optuna
stores on the trial when it is first sampled. It is a non-decreasing function
of the ask order, so the searcher keeps it as a short run-length list
(`[[first_trial_id, generation], ...]`) in its core state and writes it back
onto the rebuilt trials; Optuna recomputes the parent populations (elite
selection by non-dominated rank and crowding distance) from them.

A DONE trial needs every objective metric; a NaN in any of them makes it FAILED.

`ask(n, fixed)`: the study is rebuilt from the whole history as for a free ask and
asked through Optuna's `PartialFixedSampler` (`optuna_search.hold_fixed`): NSGA-II
draws parents from the whole population and crosses / mutates only the free keys,
MOTPE fits on every trial and samples only the free keys; the generations are
still read from the NSGA-II sampler itself.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from sfjax.automl.algorithms import optuna_search
from sfjax.automl.algorithms.base import (
  AlgorithmSpec,
  Objective,
  Searcher,
  Suggestion,
  TrialResult,
  TrialStatus,
)
from sfjax.automl.space import Space

# Optuna reads constraints only from trials we build ourselves (REJECTED = infeasible).
_constraints = optuna_search._stored_constraints  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class Objectives(Objective):
  """Several objectives: the first is `metric` / `direction`, the others `secondary`.

  Build with `Objectives.of([Objective('auc', 'maximize'), Objective('params', 'minimize')])`.
  """

  secondary: tuple[Objective, ...] = ()

  def __post_init__(self):
    super().__post_init__()
    metrics = [o.metric for o in self.all]
    if len(set(metrics)) != len(metrics):
      raise ValueError(f"Objectives: metric named twice in {metrics}")

  @classmethod
  def of(cls, objectives: Sequence[Objective]) -> Objective:
    """`objectives` as one value: the single `Objective` itself, or an `Objectives`."""
    objectives = tuple(objectives)
    if not objectives:
      raise ValueError("Objectives.of: need at least one objective")
    if len(objectives) == 1:
      return objectives[0]
    return cls(objectives[0].metric, objectives[0].direction, objectives[1:])

  @property
  def all(self) -> tuple[Objective, ...]:
    """Every objective, the primary one first."""
    return (Objective(self.metric, self.direction),) + tuple(self.secondary)

  def to_dict(self) -> dict:
    """JSON-able description (the primary's fields plus `secondary`)."""
    return {**super().to_dict(), "secondary": [o.to_dict() for o in self.secondary]}


def all_objectives(objective: Objective) -> tuple[Objective, ...]:
  """The objectives of a single `Objective` or of an `Objectives`."""
  return objective.all if isinstance(objective, Objectives) else (objective,)


def directions_of(objective: Objective) -> dict[str, str]:
  """metric -> direction of every objective (what `Study.open(directions=...)` takes)."""
  return {o.metric: o.direction for o in all_objectives(objective)}


@dataclasses.dataclass(frozen=True)
class NSGA2(AlgorithmSpec):
  """Optuna's `NSGAIISampler`: generations of `population_size`, crossover and mutation."""

  name: ClassVar[str] = "nsga2"
  multi_objective: ClassVar[bool] = True
  seed: int = 0
  population_size: int = 16

  def __post_init__(self):
    if isinstance(self.population_size, bool) or not isinstance(self.population_size, int) \
        or self.population_size < 2:
      raise ValueError(f"NSGA2.population_size: must be an integer >= 2, got "
                       f"{self.population_size!r}")

  def build(self, space: Space, objective: Objective) -> Searcher:
    """A fresh searcher over `space` for `objective` (one `Objective` or `Objectives`)."""
    return _MultiObjectiveSearcher(self, space, objective)

  def make_sampler(self, seed: int):
    """The Optuna sampler for one ask."""
    import optuna  # pylint: disable=g-import-not-at-top
    return optuna.samplers.NSGAIISampler(population_size=self.population_size, seed=seed,
                                         constraints_func=_constraints)


@dataclasses.dataclass(frozen=True)
class MOTPE(AlgorithmSpec):
  """Optuna's `TPESampler` with several directions (MOTPE, Ozaki et al. 2020)."""

  name: ClassVar[str] = "motpe"
  multi_objective: ClassVar[bool] = True
  seed: int = 0
  n_startup_trials: int = 10
  multivariate: bool = True
  constant_liar: bool = True

  def build(self, space: Space, objective: Objective) -> Searcher:
    """A fresh searcher over `space` for `objective` (one `Objective` or `Objectives`)."""
    return _MultiObjectiveSearcher(self, space, objective)

  def make_sampler(self, seed: int):
    """The Optuna sampler for one ask."""
    import optuna  # pylint: disable=g-import-not-at-top
    return optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=self.n_startup_trials, multivariate=self.multivariate,
        group=self.multivariate, constant_liar=self.constant_liar, constraints_func=_constraints)


def _rebuilt_multi_objective_study(optuna, space: Space, objectives: Sequence[Objective], sampler,
                                   results: Sequence[TrialResult],
                                   pending: Sequence[Suggestion], generation_of=None):
  """A fresh in-memory multi-objective Optuna study holding `results` and `pending`.

  Args:
    optuna: the imported module (inside `optuna_search.quiet_optuna()`).
    space: the search space.
    objectives: the objectives, in the study's order.
    sampler: the sampler the study asks with.
    results: told results (DONE -> COMPLETE, REJECTED -> infeasible, else FAIL).
    pending: asked-but-not-told suggestions, as RUNNING.
    generation_of: trial_id -> NSGA-II generation to write on each trial (or None).
  """
  from optuna.samplers._base import _CONSTRAINTS_KEY  # pylint: disable=g-import-not-at-top
  study = optuna.create_study(directions=[o.direction for o in objectives], sampler=sampler)
  key = getattr(sampler, "_get_generation_key", lambda: None)()
  state_of = optuna.trial.TrialState
  done = [r for r in results if r.status == TrialStatus.DONE]
  worst = []
  for o in objectives:
    values = [o.value(r.metrics) for r in done]
    worst.append((min(values) if o.direction == "maximize" else max(values)) if values else 0.0)

  def attrs(trial_id, extra):
    if key is not None and generation_of is not None:
      extra = {**extra, key: generation_of(trial_id)}
    return extra

  for r in results:
    config = r.suggestion.config
    trial: dict[str, Any] = dict(params=space.optuna_params(config),
                                 distributions=space.optuna_distributions(config))
    if r.status == TrialStatus.DONE:
      trial.update(values=[o.value(r.metrics) for o in objectives], state=state_of.COMPLETE,
                   system_attrs=attrs(r.trial_id, {_CONSTRAINTS_KEY: (0.0,)}))
    elif r.status == TrialStatus.REJECTED:  # infeasible: the samplers learn to avoid it
      trial.update(values=list(worst), state=state_of.COMPLETE,
                   system_attrs=attrs(r.trial_id, {_CONSTRAINTS_KEY: (1.0,)}))
    else:
      trial.update(state=state_of.FAIL, system_attrs=attrs(r.trial_id, {}))
    study.add_trial(optuna.trial.create_trial(**trial))
  for s in pending:
    study.add_trial(optuna.trial.create_trial(
        params=space.optuna_params(s.config), distributions=space.optuna_distributions(s.config),
        state=state_of.RUNNING, system_attrs=attrs(s.trial_id, {})))
  return study


class _MultiObjectiveSearcher(Searcher):
  """Asks an Optuna multi-objective sampler (NSGA-II or MOTPE) through a rebuilt study."""

  spec: NSGA2 | MOTPE

  def __init__(self, spec: NSGA2 | MOTPE, space: Space, objective: Objective):
    super().__init__(spec, space, objective)
    self.objectives = all_objectives(objective)
    self._generation_runs: list[list[int]] = []  # [[first trial id, generation], ...]

  def generation(self, trial_id: int) -> int:
    """The NSGA-II generation recorded for `trial_id` (0 before any was recorded)."""
    i = bisect.bisect_right([first for first, _ in self._generation_runs], trial_id) - 1
    return self._generation_runs[i][1] if i >= 0 else 0

  def _record_generation(self, trial_id: int, generation: int) -> None:
    if not self._generation_runs or self._generation_runs[-1][1] != generation:
      self._generation_runs.append([trial_id, int(generation)])

  def _result(self, suggestion: Suggestion, metrics: Mapping[str, float],
              status: TrialStatus) -> TrialResult:
    result = super()._result(suggestion, metrics, status)
    if result.status != TrialStatus.DONE:
      return result
    for o in self.objectives[1:]:
      if o.metric not in result.metrics:
        raise ValueError(f"tell: trial {suggestion.trial_id}: metrics {sorted(result.metrics)} "
                         f"lack the objective metric {o.metric!r}")
      if math.isnan(result.metrics[o.metric]):
        return TrialResult(suggestion, result.metrics, TrialStatus.FAILED, math.inf)
    return result

  def _propose(self, n):
    out = []
    with optuna_search.quiet_optuna() as optuna:
      sampler = self.spec.make_sampler(int(self._rng.integers(2**31 - 1)))
      study = _rebuilt_multi_objective_study(optuna, self.space, self.objectives, sampler,
                                             self._history, list(self._pending.values()),
                                             self.generation)
      optuna_search.hold_fixed(study, self.space, self.ask_fixed)
      for _ in range(n):
        config = optuna_search.ask_config(optuna, study, self.space, self._rng,
                                          self.sampling_space)
        suggestion = self._new_suggestion(config)
        if hasattr(sampler, "get_trial_generation"):  # NSGA-II: keep the trial's generation
          trial = study.get_trials(deepcopy=False)[-1]
          self._record_generation(suggestion.trial_id,
                                  sampler.get_trial_generation(study, trial))
        out.append(suggestion)
    return out

  def _extra_core(self) -> dict:
    return {"generations": [list(run) for run in self._generation_runs]}

  def _load_extra_core(self, core: Mapping[str, Any]) -> None:
    self._generation_runs = [[int(a), int(b)] for a, b in core.get("generations", [])]
