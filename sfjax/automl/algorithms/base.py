"""The ask/tell interface every search algorithm implements, and its value types.

A search algorithm is a frozen, JSON-describable spec (`AlgorithmSpec`, e.g.
`RandomSearch(seed=0)`) whose `build(space, objective)` returns a stateful
`Searcher`. A searcher proposes **batches** (`ask(n)`, so cohorts of vmapped trials
fill) and learns from results (`tell`). Multi-fidelity suggestions carry a `budget`
and `rung`; promotions carry `parent_trial_id` / `resume_from` so the runner
continues from the parent's saved state up to the new budget.

State is `{'core': small JSON, 'history': told results, 'pending': asked but not
told}`. Everything else a searcher knows (a population, rung tables, an Optuna
study) is rebuilt from history and pending, so a study journal can store the
history once, as events, plus the small core after each event.

Architecture-aware asking: `ask(n, fixed={'model.name': 'deepfm', ...})` proposes
new configs from `space.fixing(fixed)` (every fixed key that is active holds its
value), so a cohort of vmapped trials can be filled with one shape bucket. Each
algorithm says in its docstring how it honours `fixed`; promotions and other
resumed suggestions (`resume_from` set) keep their configs. Asking with `fixed`
changes no state beyond what the same free ask would (grid search also records
the grid points it handed out of order).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any, ClassVar, cast

import numpy as np

from sfjax.automl.space import Config, Fixed, Space

_DIRECTIONS = ("maximize", "minimize")


class TrialStatus(enum.StrEnum):
  """Life cycle of a trial. Only RUNNING is not final."""

  RUNNING = "running"
  DONE = "done"
  FAILED = "failed"
  PRUNED = "pruned"  # stopped early by the search (e.g. not promoted and cut short)
  REJECTED = "rejected"  # refused by a quota filter before training


# The final states of a trial that ran (a REJECTED config never trained): the trials that
# count towards a study's `num_trials`.
ENDED_STATUSES = frozenset({TrialStatus.DONE, TrialStatus.FAILED, TrialStatus.PRUNED})


@dataclasses.dataclass(frozen=True)
class Objective:
  """The metric a search optimises and its direction ('maximize' or 'minimize')."""

  metric: str
  direction: str = "maximize"

  def __post_init__(self):
    if self.direction not in _DIRECTIONS:
      raise ValueError(f"Objective({self.metric!r}): direction {self.direction!r} is not one "
                       f"of {_DIRECTIONS}")

  def value(self, metrics: Mapping[str, float]) -> float:
    """The objective metric, as a float.

    Raises:
      KeyError: naming the metric when `metrics` lacks it.
    """
    if self.metric not in metrics:
      raise KeyError(f"metrics {sorted(metrics)} lack the objective metric {self.metric!r}")
    return float(metrics[self.metric])

  def loss(self, value: float) -> float:
    """Lower-is-better form of a value (negated when maximising); NaN -> +inf."""
    if math.isnan(value):
      return math.inf
    return -value if self.direction == "maximize" else value

  def to_dict(self) -> dict:
    """JSON-able description."""
    return {"metric": self.metric, "direction": self.direction}


@dataclasses.dataclass(frozen=True)
class Suggestion:
  """One unit of work for the runner.

  Attributes:
    trial_id: unique within a study; results are told under it.
    config: the configuration to train.
    budget: multi-fidelity only: train up TO this budget (steps, epochs, ...).
    rung: multi-fidelity only: index of `budget` in the algorithm's rung budgets.
    bracket: Hyperband / successive halving only: the bracket this trial runs in.
    parent_trial_id: the trial this one derives from (a promotion's source, an
      evolutionary child's parent), else None.
    resume_from: trial whose saved state to continue from (promotions), else None:
      train from scratch.
  """

  trial_id: int
  config: Config
  budget: float | None = None
  rung: int | None = None
  bracket: int | None = None
  parent_trial_id: int | None = None
  resume_from: int | None = None

  def to_dict(self) -> dict:
    """JSON-able form; `Suggestion.from_dict` inverts it."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["config"] = self.config.to_dict()
    return d

  @classmethod
  def from_dict(cls, data: Mapping[str, Any]) -> Suggestion:
    """Inverse of `to_dict`."""
    return cls(**{**data, "config": Config(data["config"])})


@dataclasses.dataclass(frozen=True)
class TrialResult:
  """A told trial: its suggestion, metrics, final status and objective loss.

  `loss` is the objective in lower-is-better form; +inf unless status is DONE.
  """

  suggestion: Suggestion
  metrics: Mapping[str, float]
  status: TrialStatus
  loss: float

  @property
  def trial_id(self) -> int:
    """The told trial's id."""
    return self.suggestion.trial_id

  def to_dict(self) -> dict:
    """JSON-able form (the loss is recomputed from metrics on load)."""
    return {"suggestion": self.suggestion.to_dict(), "metrics": dict(self.metrics),
            "status": self.status.value}


class AlgorithmSpec(abc.ABC):
  """Static, hashable description of a search algorithm (a frozen dataclass).

  Class attributes tell a runner how to run the suggestions (its hooks, instead
  of checks of the name):
    name: the registry key (`sfjax.automl.algorithms.ALGORITHMS`) and config value.
    multi_fidelity: suggestions carry budgets and promotions resume a parent's
      saved state (successive halving, Hyperband, ASHA): keep trial states.
    population_based: one batch of suggestions is one population trained
      together, exploiting and exploring as it goes (PBT): run it as a whole.
  """

  name: ClassVar[str]
  # Declared for type checkers: every concrete spec is a dataclass (`to_dict` reads its fields).
  __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
  multi_fidelity: ClassVar[bool] = False
  population_based: ClassVar[bool] = False

  @abc.abstractmethod
  def build(self, space: Space, objective: Objective) -> Searcher:
    """A fresh searcher over `space` for `objective`."""

  def to_dict(self) -> dict:
    """JSON-able description, `{'name': ..., field: value, ...}`."""
    return {"name": self.name, **dataclasses.asdict(self)}


class Searcher(abc.ABC):
  """Stateful ask/tell search. Subclasses implement `_propose` and, if they keep
  extra core state, `_extra_core` / `_load_extra_core`.

  Args:
    spec: the algorithm spec (its `seed` field seeds the searcher's generator).
    space: the search space.
    objective: what to optimise.
  """

  def __init__(self, spec: AlgorithmSpec, space: Space, objective: Objective):
    self.spec = spec
    self.space = space
    self.objective = objective
    self._rng = np.random.default_rng(getattr(spec, "seed", 0))
    self._next_trial_id = 0
    self._history: list[TrialResult] = []
    self._pending: dict[int, Suggestion] = {}
    self._ask_fixed: dict[str, Any] = {}
    self._ask_space: Space | None = None

  # ---- the interface ---------------------------------------------------
  def ask(self, n: int, fixed: Mapping[str, Any] | None = None) -> list[Suggestion]:
    """Up to `n` new suggestions (fewer when the algorithm waits for results or is
    finished; an empty list with pending trials means 'tell me results first').

    Args:
      n: the most suggestions wanted.
      fixed: key -> value every NEW config holds wherever that key is active (a
        shape bucket: the configs of a cohort then share one compiled program).
        Promotions / resumed suggestions (`resume_from` set) come as they are.
        None or {} asks freely, exactly as without it.

    Raises:
      ValueError: n < 0, or (a `SpaceError`) naming a fixed key that is not a
        parameter of the space or whose value is outside its domain.
    """
    if n < 0:
      raise ValueError(f"ask(n): n must be >= 0, got {n}")
    fixed = dict(fixed or {})
    space = self.space.fixing(fixed) if fixed else None
    if space is not None:  # plain scalars (numpy ones converted); fixing made each key Fixed
      fixed = {k: cast(Fixed, space[k]).value for k in fixed}
    self._ask_fixed, self._ask_space = fixed, space
    try:
      suggestions = self._propose(n) if n else []
    finally:
      self._ask_fixed, self._ask_space = {}, None
    for s in suggestions:
      if s.resume_from is None and not s.config.agrees(fixed):  # a bug of the algorithm
        raise RuntimeError(f"{self.spec.name}: trial {s.trial_id}'s config {s.config} "
                           f"breaks the fixed keys {fixed}")
      self._pending[s.trial_id] = s
    return suggestions

  def tell(self, trial_id: int, metrics: Mapping[str, float],
           status: TrialStatus | str = TrialStatus.DONE) -> TrialResult:
    """Records the outcome of a pending trial and returns it as a `TrialResult`.

    A DONE trial whose objective is NaN is recorded as FAILED.

    Raises:
      KeyError: unknown trial, or one already told.
      ValueError: status RUNNING, or a DONE trial without the objective metric.
    """
    status = TrialStatus(status)
    if trial_id not in self._pending:
      told = any(r.trial_id == trial_id for r in self._history)
      raise KeyError(f"tell: trial {trial_id} was {'already told' if told else 'never asked'}")
    if status == TrialStatus.RUNNING:
      raise ValueError(f"tell: trial {trial_id}: status must be final, got {status.value!r}")
    result = self._result(self._pending[trial_id], metrics, status)
    del self._pending[trial_id]
    self._history.append(result)
    return result

  def _result(self, suggestion: Suggestion, metrics: Mapping[str, float],
              status: TrialStatus) -> TrialResult:
    metrics = {k: float(v) for k, v in metrics.items()}
    loss = math.inf
    if status == TrialStatus.DONE:
      try:
        value = self.objective.value(metrics)
      except KeyError as e:
        raise ValueError(f"tell: trial {suggestion.trial_id}: {e.args[0]}") from None
      if math.isnan(value):
        status = TrialStatus.FAILED
      else:
        loss = self.objective.loss(value)
    return TrialResult(suggestion, metrics, status, loss)

  @property
  def finished(self) -> bool:
    """True when the algorithm will never propose anything again."""
    return False

  @property
  def history(self) -> tuple[TrialResult, ...]:
    """Told results, in the order told."""
    return tuple(self._history)

  @property
  def pending(self) -> tuple[Suggestion, ...]:
    """Asked but not yet told, in the order asked."""
    return tuple(self._pending.values())

  # ---- state -----------------------------------------------------------
  def core_state(self) -> dict:
    """The small part of the state: generator, trial counter, algorithm extras."""
    return {"next_trial_id": self._next_trial_id, "rng": self._rng.bit_generator.state,
            **self._extra_core()}

  def state_dict(self) -> dict:
    """The whole state as JSON-able data."""
    return {"core": self.core_state(), "history": [r.to_dict() for r in self._history],
            "pending": [s.to_dict() for s in self._pending.values()]}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    """Restores `state_dict()` output (or a study journal's reconstruction of it)."""
    core = state["core"]
    self._next_trial_id = int(core["next_trial_id"])
    self._rng = np.random.default_rng()
    self._rng.bit_generator.state = core["rng"]
    self._history = []
    for r in state["history"]:
      self._history.append(self._result(Suggestion.from_dict(r["suggestion"]), r["metrics"],
                                        TrialStatus(r["status"])))
    self._pending = {}
    for d in state["pending"]:
      s = Suggestion.from_dict(d)
      self._pending[s.trial_id] = s
    self._load_extra_core(core)

  def _extra_core(self) -> dict:
    return {}

  def _load_extra_core(self, core: Mapping[str, Any]) -> None:
    del core

  # ---- for subclasses --------------------------------------------------
  @abc.abstractmethod
  def _propose(self, n: int) -> list[Suggestion]:
    """Up to `n` suggestions (n >= 1); trial ids come from `_new_suggestion`.

    New configs come from `sampling_space` and agree with `ask_fixed`.
    """

  @property
  def sampling_space(self) -> Space:
    """The space new configs come from: `space.fixing(fixed)` during a fixed ask,
    else `space`."""
    return self._ask_space if self._ask_space is not None else self.space

  @property
  def ask_fixed(self) -> dict[str, Any]:
    """The fixed keys of the ask in progress (empty for a free ask)."""
    return dict(self._ask_fixed)

  def _new_suggestion(self, config: Config, **fields) -> Suggestion:
    suggestion = Suggestion(self._next_trial_id, config, **fields)
    self._next_trial_id += 1
    return suggestion

  def _done(self) -> list[TrialResult]:
    """Told results with a finite objective, in the order told."""
    return [r for r in self._history if r.status == TrialStatus.DONE]
