"""A durable study: trials, their results and the search state, resumable after a crash.

`Study.open(path, space, algorithm, objective)` creates `path/journal.jsonl` or
replays it. Events (`ask`, `requeue`, `tell`) each carry the searcher's small core
state; the searcher's history and pending trials are rebuilt from the events
themselves, so the journal grows linearly. On reopen:

- trials told before the crash keep their results and are never rerun;
- trials asked but never told (running when the process died, or whose `tell`
  line was torn) are re-queued under their own trial ids and handed out first by
  the next `ask`, so each appears exactly once in the final results;
- the searcher continues from the core state of the last complete event, so with
  sequential trials a killed-and-resumed study proposes exactly what an
  uninterrupted one would have.

Reopening with a different space, algorithm, objective or Pareto directions is an
error (quota filters may change between runs: they only judge new hand-outs).

`ask(n, fixed)` asks the algorithm for configs inside a bucket (`Searcher.ask`);
the `ask` event records `fixed` (for audit only: replay rebuilds the searcher from
its core state, so journals written before `fixed` existed replay as ever).

The journal's header and the replay of its events are `events`; a trial's record
is `trial_record`; which trials win (best, Pareto fronts) is `selection`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sfjax.automl.algorithms.base import (
  ENDED_STATUSES,
  AlgorithmSpec,
  Objective,
  Suggestion,
  TrialStatus,
)
from sfjax.automl.space import Space
from sfjax.automl.study import events, selection, trial_record
from sfjax.automl.study.journal import Journal
from sfjax.automl.study.quota import QuotaFilter, check_quotas
from sfjax.automl.study.trial_record import StudyError, TrialRecord
from sfjax.core.atomic import atomic_write

_JOURNAL = "journal.jsonl"


class Study:
  """Use `Study.open`. Not thread-safe; one process per study (enforced by a lock)."""

  def __init__(self, path, journal, searcher, objective, directions, quotas, max_rejections):
    self.path = path
    self.objective = objective
    self.directions = dict(directions) if directions else None
    self.quotas = tuple(quotas)
    self.max_rejections = max_rejections
    self._journal = journal
    self._searcher = searcher
    self._trials: dict[int, TrialRecord] = {}
    self._queue: list[int] = []  # running in the journal, not yet handed out again

  @classmethod
  def open(cls, path: str, space: Space, algorithm: AlgorithmSpec, objective: Objective,
           directions: Mapping[str, str] | None = None, quotas: Sequence[QuotaFilter] = (),
           max_rejections: int = 1000) -> Study:
    """Creates the study in directory `path`, or resumes it.

    Args:
      path: directory for `journal.jsonl` (and exports).
      space: the search space.
      algorithm: the algorithm spec, e.g. `TPE(seed=0)`.
      objective: the metric to optimise and its direction.
      directions: metric -> 'maximize' / 'minimize' for `pareto_front`.
      quotas: filters judged before a fresh config is handed out; rejected configs
        are recorded with status 'rejected' and the reason.
      max_rejections: quota rejections within one `ask` before it raises.

    Raises:
      StudyError: the journal was written with a different space, algorithm,
        objective or directions (the message says which).
      JournalError: a corrupt journal (names file and line).
      JournalLockedError: the study is open elsewhere.
    """
    for metric, direction in (directions or {}).items():
      if direction not in ("maximize", "minimize"):
        raise StudyError(f"directions[{metric!r}] = {direction!r}; expected 'maximize' or "
                         "'minimize'")
    journal_path = os.path.join(path, _JOURNAL)
    journal, records = Journal.open(journal_path)
    try:
      header = json.loads(json.dumps(events.header(
          {"space": space.to_dict(), "algorithm": algorithm.to_dict(),
           "objective": objective.to_dict(),
           "directions": dict(directions) if directions else None})))
      if records:
        events.check_header(journal_path, records[0], header)
      else:
        journal.append({**header, "time": time.time()})
      study = cls(path, journal, algorithm.build(space, objective), objective, directions,
                  quotas, max_rejections)
      replayed = events.replay(journal_path, records[1:])
      if replayed.searcher_state is not None:
        study._searcher.load_state_dict(replayed.searcher_state)
      study._trials, study._queue = replayed.trials, replayed.pending
    except BaseException:
      journal.close()
      raise
    return study

  def _running(self, trial_id: int) -> TrialRecord:
    return trial_record.running(self._trials, trial_id)

  # ---- ask / tell ------------------------------------------------------
  def ask(self, n: int, fixed: Mapping[str, Any] | None = None) -> list[Suggestion]:
    """Up to `n` trials to run: re-queued ones first, then new ones from the algorithm.

    Fresh configs failing a quota filter are recorded as rejected and replaced. An
    empty list means the algorithm is finished or waits for running trials.

    Args:
      n: the most trials wanted.
      fixed: key -> value every new config holds where that key is active (see
        `Searcher.ask`); only re-queued trials that agree with it are handed out
        (the others wait for a later ask). Quota filters judge fixed asks too.

    Raises:
      ValueError: naming a fixed key outside the space or its domain.
      StudyError: more than `max_rejections` quota rejections in this ask.
    """
    out, rejected = [], 0
    fixed = dict(fixed or {})
    if fixed:
      space = self._searcher.space.fixing(fixed)  # checks the keys before anything is journaled
      fixed = {k: space[k].value for k in fixed}
    requeued = [i for i in self._queue if self._trials[i].config.agrees(fixed)][:n]
    self._queue = [i for i in self._queue if i not in requeued]
    if requeued:
      now = time.time()
      self._journal.append({"event": "requeue", "time": now, "trial_ids": requeued})
      for trial_id in requeued:
        self._trials[trial_id] = trial_record.handed_out_again(self._trials[trial_id], now)
      out += [s for s in (self._trials[i].suggestion for i in requeued) if self._admit(s)]
    while len(out) < n:
      batch = self._searcher.ask(n - len(out), fixed)
      if not batch:
        break
      now = time.time()
      event = {"event": "ask", "time": now, "core": self._searcher.core_state(),
               "suggestions": [s.to_dict() for s in batch]}
      if fixed:
        event["fixed"] = fixed
      self._journal.append(event)
      for s in batch:
        self._trials[s.trial_id] = trial_record.asked(s, now)
        if self._admit(s):
          out.append(s)
        else:
          rejected += 1
          if rejected > self.max_rejections:
            raise StudyError(f"quota filters rejected {rejected} suggestions in one ask; last: "
                             f"{self._trials[s.trial_id].reason}")
    return out

  def _admit(self, suggestion: Suggestion) -> bool:
    """Checks quotas for a fresh config; a rejected one is told and recorded."""
    if suggestion.resume_from is not None or not self.quotas:
      return True
    measured, reason = check_quotas(self.quotas, suggestion.config)
    if reason is None:
      return True
    self.tell(suggestion.trial_id, measured, TrialStatus.REJECTED, reason=reason)
    return False

  def tell(self, trial_id: int, metrics: Mapping[str, float],
           status: TrialStatus | str = TrialStatus.DONE, elapsed_s: float | None = None,
           reason: str | None = None) -> TrialRecord:
    """Records a running trial's result durably and tells the algorithm.

    Args:
      trial_id: a trial handed out by `ask`.
      metrics: metric name -> number (must include the objective when DONE).
      status: 'done', 'failed', 'pruned' or 'rejected'.
      elapsed_s: training time; default: since the trial was handed out.
      reason: why it failed / was pruned or rejected.

    Raises:
      StudyError: the trial is unknown, finished, or re-queued and not handed out.
    """
    if trial_id in self._queue:
      raise StudyError(f"trial {trial_id} is re-queued; ask() hands it out again first")
    t = self._running(trial_id)
    result = self._searcher.tell(trial_id, metrics, status)
    if result.status != TrialStatus(status) and reason is None:
      reason = f"objective {self.objective.metric!r} is NaN"
    now = time.time()
    record = {"event": "tell", "time": now, "trial_id": trial_id, "status": result.status.value,
              "metrics": dict(result.metrics), "reason": reason,
              "elapsed_s": now - t.started_at if elapsed_s is None else float(elapsed_s),
              "core": self._searcher.core_state()}
    self._journal.append(record)
    self._trials[trial_id] = trial_record.finished(t, record)
    return self._trials[trial_id]

  # ---- results ---------------------------------------------------------
  @property
  def finished(self) -> bool:
    """No trial running or queued, and the algorithm has nothing more to propose."""
    return self._searcher.finished and not self.running() and not self._queue

  def running(self) -> list[int]:
    """Ids of trials handed out (or re-queued) and not yet told."""
    return [i for i, t in self._trials.items() if t.status == TrialStatus.RUNNING]

  def trials(self) -> list[TrialRecord]:
    """Every trial, by id."""
    return [self._trials[i] for i in sorted(self._trials)]

  def trial(self, trial_id: int) -> TrialRecord:
    """One trial's record."""
    if trial_id not in self._trials:
      raise KeyError(f"no trial {trial_id} in {self.path}")
    return self._trials[trial_id]

  def best(self) -> TrialRecord | None:
    """Best DONE trial by the objective; with budgets, among those at the largest
    budget reached (low-fidelity results do not compete with full ones)."""
    return selection.best_trial(self.trials(), self.objective)

  def pareto_front(self, directions: Mapping[str, str] | None = None,
                   budget: float | None | str = "largest") -> list[TrialRecord]:
    """Non-dominated DONE trials over `directions` (default: the study's), by id.

    Args:
      directions: metric -> 'maximize' / 'minimize'.
      budget: the budget whose trials compete: 'largest' (default: the largest
        budget reached, as `best()`; low-fidelity results never compete with full
        ones), a budget value, or 'all' (every budget mixed).

    Trials lacking one of the metrics are left out.
    """
    return selection.front(self.trials(),
                           directions if directions is not None else self.directions, budget)

  def pareto_fronts(self, directions: Mapping[str, str] | None = None
                    ) -> list[tuple[float | None, list[TrialRecord]]]:
    """`(budget, front)` for every budget with a DONE trial, smallest budget first
    (one `(None, front)` entry for a study without budgets)."""
    return selection.fronts(self.trials(),
                            directions if directions is not None else self.directions)

  def record_retry(self, trial_ids: Sequence[int]) -> None:
    """Journals that running trials are handed out again (e.g. their worker died).

    Their `attempts` grow by one and `started_at` restarts; they stay running
    until told. The journal's `requeue` event, as after a driver crash.

    Raises:
      StudyError: a trial is not running.
    """
    trial_ids = [int(i) for i in trial_ids]
    for trial_id in trial_ids:
      self._running(trial_id)
    now = time.time()
    self._journal.append({"event": "requeue", "time": now, "trial_ids": trial_ids})
    for trial_id in trial_ids:
      self._trials[trial_id] = trial_record.handed_out_again(self._trials[trial_id], now)

  def export(self, directory: str | None = None) -> None:
    """Writes `trials.jsonl` (one line per trial) and `best.json` atomically.

    `best.json` holds the objective, the best trial, the Pareto directions,
    `pareto_front` (trial ids of the front at the largest budget reached) and
    `pareto_fronts` (`[{'budget': b, 'trial_ids': [...]}, ...]`, one per budget,
    smallest first).
    """
    directory = directory or self.path
    os.makedirs(directory, exist_ok=True)
    lines = "".join(json.dumps(t.to_dict(), sort_keys=True, allow_nan=False) + "\n"
                    for t in self.trials())
    atomic_write(os.path.join(directory, "trials.jsonl"), lines)
    best = self.best()
    fronts = self.pareto_fronts() if self.directions else None
    summary = {"objective": self.objective.to_dict(),
               "best": best.to_dict() if best is not None else None,
               "directions": self.directions,
               # the front at the largest budget reached (as `best`), and one per budget
               "pareto_front": [t.trial_id for t in self.pareto_front()] if self.directions
                               else None,
               "pareto_fronts": [{"budget": b, "trial_ids": [t.trial_id for t in front]}
                                 for b, front in fronts] if fronts is not None else None}
    atomic_write(os.path.join(directory, "best.json"),
                      json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n")

  def optimize(self, fn: Callable[[Suggestion], Mapping[str, float]], n_trials: int,
               batch_size: int = 1) -> None:
    """Runs trials in this process until `n_trials` have finished (rejected ones do
    not count), the algorithm is finished, or it waits on nothing.

    An exception from `fn` marks that trial failed, with the exception as reason.
    """
    while True:
      final = sum(t.status in ENDED_STATUSES for t in self._trials.values())
      batch = self.ask(min(batch_size, n_trials - final)) if final < n_trials else []
      if not batch:
        return
      for s in batch:
        start = time.perf_counter()
        try:
          metrics, status, reason = fn(s), TrialStatus.DONE, None
        except Exception as e:  # pylint: disable=broad-except
          metrics, status, reason = {}, TrialStatus.FAILED, f"{type(e).__name__}: {e}"
        self.tell(s.trial_id, metrics, status, time.perf_counter() - start, reason)

  def close(self) -> None:
    """Releases the journal (the study stays readable in memory)."""
    self._journal.close()

  def __enter__(self) -> Study:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
