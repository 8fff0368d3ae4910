"""A study mirrored to an Optuna storage, so `optuna-dashboard <storage>` shows it live.

  mirror = OptunaMirror.open('study.log', 'my-search', space, objective, owner=workdir)
  mirror.update(study.trials())   # after each ask and each round of tells (idempotent)

`storage` is a journal file (a path ending `.log` or `.jsonl`: Optuna's `JournalStorage`
over a `JournalFileBackend`) or an SQLAlchemy SQLite URL (`sqlite:///path.db`: Optuna's
`RDBStorage`); `optuna-dashboard study.log` or `optuna-dashboard sqlite:///path.db`
serves it. Each of our trials becomes one Optuna trial:

  params, distributions   the active searched keys (`Space.optuna_params` / `_distributions`)
  values                  the objectives' metrics, in order (study directions = ours; the
                          metric names are set, so the dashboard labels its axes)
  intermediate values     single objective, multi-fidelity: the objective at each budget of
                          the config's promotion chain (this trial and the trials it was
                          promoted from), at step `step_of_budget(budget)` (the driver
                          passes training steps; default: the rung), as `trial.report` would;
                          and the values a trial reported inside its run (metrics
                          `<objective>/<step>`, `reported_metrics`: a pruned search's eval
                          points, `sfjax.cohorts.pruning`)
  state                   done -> COMPLETE, pruned -> PRUNED, failed -> FAIL, rejected by a
                          quota -> FAIL (user attr `sfjax_status` says which), running -> RUNNING
  user attrs              `sfjax_trial_id` (our id: the mirror's key), `sfjax_status`,
                          `budget`, `rung`, `parent_trial_id`, `reason` and every metric
                          (auc, test_auc, params, flops, latency_ms, seconds, ...)

A trial is written when first seen (RUNNING if asked and not told yet) and finished
in place when told; a final one is never written again. Reopening the storage (a
resumed search) reads the mirrored trials' `sfjax_trial_id`s first, so nothing is
duplicated. The Optuna study records its owner (study user attr `sfjax_owner`, the
search's workdir): one study name mirrors one study, and a second owner is an error.
Optuna is imported on first use.
"""

from __future__ import annotations

import datetime
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sfjax.automl.algorithms.base import Objective, TrialStatus
from sfjax.automl.algorithms.multi_objective import all_objectives
from sfjax.automl.space import Space
from sfjax.automl.study.trial_record import TrialRecord

TRIAL_ID_ATTR = "sfjax_trial_id"
STATUS_ATTR = "sfjax_status"
OWNER_ATTR = "sfjax_owner"
_JOURNAL_SUFFIXES = (".log", ".jsonl")
_REPORT_SEP = "/"  # metric '<name>/<step>': a value reported at that step of the run
_RDB_PREFIX = "sqlite:///"
_STATE_NAMES = {TrialStatus.DONE: "COMPLETE", TrialStatus.PRUNED: "PRUNED",
                TrialStatus.FAILED: "FAIL", TrialStatus.REJECTED: "FAIL",
                TrialStatus.RUNNING: "RUNNING"}


def storage_kind(storage: str, field: str = "study.optuna_storage") -> str:
  """'journal' or 'sqlite' for a storage spec; raises ValueError naming `field` otherwise."""
  if isinstance(storage, str) and storage.startswith(_RDB_PREFIX) and len(storage) > len(
      _RDB_PREFIX):
    return "sqlite"
  if isinstance(storage, str) and storage.endswith(_JOURNAL_SUFFIXES) and "://" not in storage:
    return "journal"
  raise ValueError(f"{field}: expected a journal file path ending {' or '.join(_JOURNAL_SUFFIXES)}"
                   f" or an SQLite URL '{_RDB_PREFIX}path.db', got {storage!r}")


def open_storage(storage: str, field: str = "study.optuna_storage"):
  """The Optuna storage object of `storage` (see `storage_kind`)."""
  import optuna  # pylint: disable=g-import-not-at-top
  if storage_kind(storage, field) == "sqlite":
    return optuna.storages.RDBStorage(storage)
  from optuna.storages.journal import JournalFileBackend  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(storage)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  return optuna.storages.JournalStorage(JournalFileBackend(path))


def reported_metrics(metric: str, values: Mapping[int, float]) -> dict[str, float]:
  """A trial's reports inside its run (step -> value of `metric`) as metrics
  `'<metric>/<step>'`, so the study journal keeps them with its other metrics."""
  return {f"{metric}{_REPORT_SEP}{int(step)}": float(v) for step, v in values.items()}


def reported_values(metrics: Mapping[str, float], metric: str) -> dict[int, float]:
  """The reports of `metric` among a trial's metrics (`reported_metrics`), by step."""
  prefix = metric + _REPORT_SEP
  return dict(sorted((int(k[len(prefix):]), float(v)) for k, v in metrics.items()
                     if k.startswith(prefix) and k[len(prefix):].isdigit()))


def _time(seconds: float | None) -> datetime.datetime | None:
  return None if seconds is None else datetime.datetime.fromtimestamp(seconds)


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
  return {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}


class OptunaMirror:
  """Writes a study's trials to an Optuna study (see the module docstring). Use `open`.

  Attributes:
    storage: the Optuna storage object; study_name; study_id: its id in the storage.
  """

  def __init__(self, storage, study_name: str, study_id: int, space: Space,
               objective: Objective, step_of_budget: Callable[[float], int] | None):
    self.storage, self.study_name, self.study_id = storage, study_name, study_id
    self._space, self._objectives = space, all_objectives(objective)
    self._step_of_budget = step_of_budget
    self._mirrored: dict[int, tuple[int, bool]] = {}  # our id -> (Optuna trial id, final)
    for t in storage.get_all_trials(study_id, deepcopy=False):
      if TRIAL_ID_ATTR in t.user_attrs:
        self._mirrored[int(t.user_attrs[TRIAL_ID_ATTR])] = (
            storage.get_trial_id_from_study_id_trial_number(study_id, t.number),
            t.state.is_finished())

  @classmethod
  def open(cls, storage: str, study_name: str, space: Space, objective: Objective, *,
           owner: str, step_of_budget: Callable[[float], int] | None = None) -> OptunaMirror:
    """Creates (or reopens) Optuna study `study_name` in `storage` for one study.

    Args:
      storage: a journal file path (.log / .jsonl) or an SQLite URL (`sqlite:///x.db`).
      study_name: the Optuna study's name.
      space: the search space (parameters' distributions).
      objective: the study's objective(s): directions and metric names.
      owner: what the Optuna study mirrors (the search's workdir).
      step_of_budget: budget -> step of an intermediate value (default: the rung).

    Raises:
      ValueError: a bad storage (naming `study.optuna_storage`), or study `study_name`
        exists with other directions or another owner (naming `study.optuna_study_name`).
    """
    import optuna  # pylint: disable=g-import-not-at-top
    if not isinstance(study_name, str) or not study_name:
      raise ValueError(f"study.optuna_study_name: expected a non-empty name, got {study_name!r}")
    backend = open_storage(storage)
    directions = [o.direction for o in all_objectives(objective)]
    names = [o.metric for o in all_objectives(objective)]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(storage=backend, study_name=study_name,
                                    directions=directions, load_if_exists=True)
        if [d.name.lower() for d in study.directions] != directions:
          raise ValueError(
              f"study.optuna_study_name: study {study_name!r} in {storage} has directions "
              f"{[d.name.lower() for d in study.directions]}, this search {directions}; "
              "use another name")
        recorded = study.user_attrs.get(OWNER_ATTR)
        if recorded is not None and recorded != owner:
          raise ValueError(f"study.optuna_study_name: study {study_name!r} in {storage} mirrors "
                           f"{recorded}, not {owner}; use another name")
        if recorded is None:
          study.set_user_attr(OWNER_ATTR, owner)
        if study.metric_names != names:
          study.set_metric_names(names)
    finally:
      optuna.logging.set_verbosity(verbosity)
    study_id = backend.get_study_id_from_name(study_name)
    return cls(backend, study_name, study_id, space, objective, step_of_budget)

  def update(self, trials: Sequence[TrialRecord]) -> int:
    """Mirrors the trials not yet mirrored, and finishes those told since; returns how many
    Optuna trials were created or finished."""
    by_id = {t.trial_id: t for t in trials}
    written = 0
    for t in sorted(trials, key=lambda t: t.trial_id):
      known = self._mirrored.get(t.trial_id)
      final = t.status != TrialStatus.RUNNING
      if known is not None and (known[1] or not final):
        continue
      if known is None:
        self._create(t, by_id)
      else:
        self._finish(known[0], t, by_id)
      self._mirrored[t.trial_id] = (self._mirrored[t.trial_id][0], final)
      written += 1
    return written

  def close(self) -> None:
    """Releases the storage's connections (an SQLite engine)."""
    engine = getattr(self.storage, "engine", None)
    if engine is not None:
      engine.dispose()

  # ---- one trial ------------------------------------------------------------
  def _values(self, t: TrialRecord) -> list[float] | None:
    """The objectives' values of a DONE trial (None when one is missing or not finite)."""
    values = [float(t.metrics.get(o.metric, math.nan)) for o in self._objectives]
    return values if all(math.isfinite(v) for v in values) else None

  def _state(self, t: TrialRecord):
    """(Optuna TrialState, values) of `t`; a DONE trial without its objectives fails."""
    import optuna  # pylint: disable=g-import-not-at-top
    values = self._values(t) if t.status == TrialStatus.DONE else None
    name = "FAIL" if t.status == TrialStatus.DONE and values is None else _STATE_NAMES[t.status]
    return optuna.trial.TrialState[name], values

  def _intermediate(self, t: TrialRecord, by_id: Mapping[int, TrialRecord]) -> dict[int, float]:
    """step -> objective: `t`'s reports inside its run, and the DONE values along its
    promotion chain at their budgets' steps (single objective only)."""
    if len(self._objectives) != 1:
      return {}
    metric = self._objectives[0].metric
    out: dict[int, float] = {s: v for s, v in reported_values(t.metrics, metric).items()
                             if math.isfinite(v)}
    node: TrialRecord | None = t
    while node is not None and node.suggestion.budget is not None:
      s, budget = node.suggestion, node.suggestion.budget
      value = float(node.metrics.get(metric, math.nan))
      if math.isfinite(value) and node.status == TrialStatus.DONE:
        step = (self._step_of_budget(budget) if self._step_of_budget is not None
                else int(s.rung or 0))
        out.setdefault(int(step), value)
      parent = by_id.get(s.parent_trial_id) if s.parent_trial_id is not None else None
      node = parent if parent is not None and parent.config == node.config else None
    return dict(sorted(out.items()))

  def _user_attrs(self, t: TrialRecord) -> dict[str, Any]:
    s = t.suggestion
    attrs: dict[str, Any] = {**_finite(t.metrics), TRIAL_ID_ATTR: t.trial_id,
                             STATUS_ATTR: t.status.value, "attempts": t.attempts}
    for key, value in (("budget", s.budget), ("rung", s.rung), ("bracket", s.bracket),
                       ("parent_trial_id", s.parent_trial_id), ("reason", t.reason)):
      if value is not None:
        attrs[key] = value
    return attrs

  def _create(self, t: TrialRecord, by_id: Mapping[int, TrialRecord]) -> None:
    import optuna  # pylint: disable=g-import-not-at-top
    state, values = self._state(t)
    try:
      params = self._space.optuna_params(t.config)
      distributions = self._space.optuna_distributions(t.config)
    except ValueError:  # a config the space no longer validates: mirrored without params
      params, distributions = {}, {}
    template = optuna.trial.FrozenTrial(
        number=0, state=state, value=None, values=values, datetime_start=_time(t.started_at),
        datetime_complete=_time(t.finished_at) if state.is_finished() else None,
        params=params, distributions=distributions, user_attrs=self._user_attrs(t),
        system_attrs={}, intermediate_values=self._intermediate(t, by_id), trial_id=0)
    trial_id = self.storage.create_new_trial(self.study_id, template_trial=template)
    self._mirrored[t.trial_id] = (trial_id, state.is_finished())

  def _finish(self, trial_id: int, t: TrialRecord, by_id: Mapping[int, TrialRecord]) -> None:
    state, values = self._state(t)
    for step, value in self._intermediate(t, by_id).items():
      self.storage.set_trial_intermediate_value(trial_id, step, value)
    for key, value in self._user_attrs(t).items():
      self.storage.set_trial_user_attr(trial_id, key, value)
    self.storage.set_trial_state_values(trial_id, state, values)
