"""How a search hands cohorts to its workers: synchronous rounds or an asynchronous queue.

`study.dispatch` (issue #26 item 1):

  rounds   today's loop (`search_loop`): ask a round, run its cohorts (one job per
           shape bucket, all at once), wait for the whole round, tell, ask again.
           With N workers and a round of one bucket, one worker is busy.
  async    the driver keeps a queue of ready cohorts across buckets and rounds
           (`run_async`); a worker takes the next cohort as soon as it is free, and
           when the queue is empty the algorithm is asked as soon as a result
           arrives (Ray Tune / Optuna's distributed ask-and-tell; ASHA and BOHB were
           designed for it, arXiv 1810.05934, 1807.01774).
  auto     (default) async on a distributed executor (`dask`) when the algorithm
           asks asynchronously, else rounds: the local executor (one slot) and the
           synchronous algorithms keep their exact results.

Algorithms that ask asynchronously (`ASYNC_ALGORITHMS`): random, qmc, grid (their
proposals do not depend on results: the same trials as in rounds), evolution
(steady state: each ask breeds from the population of results told so far), tpe
and motpe (constant liar: running trials are shown to the sampler as RUNNING),
asha (promotes whenever a worker asks), hyperband and bohb (independent brackets:
while a rung waits for its stragglers the next brackets' trials fill free workers;
a rung is promoted as soon as its last result arrives). Synchronous ones (rounds
only): successive_halving (one bracket: nothing to fill with), gp (Optuna's
GPSampler ignores running trials: it would propose the same point to every free
worker), nsga2 (generations), pbt (a population trains as one program).

An asynchronous ask is as large as a round's (`study.ask_batch`), so its proposals
still form cohorts (grouped by bucket); with the random, qmc and grid algorithms the
asks are the rounds' asks, so the trials are the same. A job whose worker is lost
goes back to the front of the queue (its trials journaled as re-queued) up to
`max_attempts` submissions, then its trials fail.

`DispatchRecord` is what the workers did: `worker_busy_fraction` = the seconds the
workers spent running jobs (compiles included) over `slots x` the wall time of the
search's trial loop, and trials/hour over that wall time (`dispatch.json` in the
workdir, `search_report.dispatch_line`).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sfjax.automl.algorithms import ENDED_STATUSES, AlgorithmSpec, Suggestion
from sfjax.automl.study import Study
from sfjax.cohorts.trial_result import CohortTrialResult
from sfjax.ctr_search import search_config
from sfjax.ctr_search.executor import CohortJob, failed_results
from sfjax.ctr_search.search_config import SearchConfigError

SCHEDULES = ("auto", "rounds", "async")
DISPATCH_FILE = "dispatch.json"
ASYNC_ALGORITHMS = frozenset({"random", "qmc", "grid", "evolution", "tpe", "motpe", "asha",
                              "hyperband", "bohb"})


def choose_schedule(dispatch: str, executor_name: str, algorithm: AlgorithmSpec) -> str:
  """'rounds' or 'async': the schedule `study.dispatch` asks for (see the module docstring).

  Raises:
    SearchConfigError: an unknown `study.dispatch`, or 'async' with an algorithm that
      asks in synchronous rounds (naming the field and the algorithm).
  """
  if dispatch not in SCHEDULES:
    raise SearchConfigError(f"study.dispatch: unknown schedule {dispatch!r}; known: "
                            f"{list(SCHEDULES)}")
  asynchronous = algorithm.name in ASYNC_ALGORITHMS and not algorithm.population_based
  if dispatch == "async" and not asynchronous:
    raise SearchConfigError(f"study.dispatch='async': {algorithm.name} asks in synchronous "
                            f"rounds; asynchronous ones: {sorted(ASYNC_ALGORITHMS)}")
  if dispatch == "auto":
    return "async" if asynchronous and executor_name != "local" else "rounds"
  return dispatch


class Queued(NamedTuple):
  """A ready cohort: its job, what the driver tells its results with, its submissions so far.

  Attributes:
    job: the `CohortJob`.
    members: the driver's own data for telling its results (e.g. the suggestions).
    attempts: how many times it was submitted before (0: never).
  """

  job: CohortJob
  members: Any
  attempts: int = 0


# ask(outstanding) -> ready cohorts [(job, members)], [] when nothing can be asked now;
# `outstanding` is the number of trials running in this dispatch (none is queued then).
AskJobs = Callable[[int], Sequence[tuple[CohortJob, Any]]]
TellJob = Callable[[CohortJob, Any, list[CohortTrialResult]], None]


def _trials_of(items) -> int:
  return sum(len(item.job.hparams) for item in items)


def run_async(executor, ask_jobs: AskJobs, tell_job: TellJob, *, max_attempts: int = 3,
              on_retry: Callable[[CohortJob, str], None] | None = None) -> int:
  """Runs cohorts on `executor` until `ask_jobs` has nothing more and none is running.

  While fewer than `executor.slots` jobs run, the next ready cohort is submitted;
  when none is ready, `ask_jobs` is asked for more (so the algorithm asks as soon as
  a worker is free, having heard every result so far). Each finished job is told
  (`tell_job(job, members, results)`) as it arrives, in the order jobs finish.

  Args:
    executor: has `slots`, `submit(job) -> ticket`, `wait_any() -> (ticket, JobOutcome)`
      (`executor.py`).
    ask_jobs: see `AskJobs`.
    tell_job: see `TellJob`.
    max_attempts: submissions of one job before its trials fail (>= 1).
    on_retry: called with `(job, reason)` before a lost job goes back to the queue.

  Returns:
    How many times a lost job went back to the queue.
  """
  if max_attempts < 1:
    raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
  ready: collections.deque[Queued] = collections.deque()
  running: dict[int, Queued] = {}
  requeued = 0
  while True:
    slots = executor.slots  # (a Dask cluster's: asked once per result; workers come and go)
    while len(running) < slots:
      if not ready:
        outstanding = _trials_of(running.values())
        ready.extend(Queued(job, members) for job, members in ask_jobs(outstanding))
        if not ready:
          break
      item = ready.popleft()
      running[executor.submit(item.job)] = item._replace(attempts=item.attempts + 1)
    if not running:
      return requeued
    ticket, outcome = executor.wait_any()
    item = running.pop(ticket)
    if outcome.results is not None:
      tell_job(item.job, item.members, outcome.results)
    elif item.attempts < max_attempts:
      if on_retry is not None:
        on_retry(item.job, outcome.lost or "worker lost")
      ready.appendleft(item)  # first in line: its trials were asked before the others
      requeued += 1
    else:
      tell_job(item.job, item.members,
               failed_results(item.job, f"{outcome.lost} (after {item.attempts} submissions)"))


class DispatchRecord(NamedTuple):
  """What the workers did during a search's trial loop (`dispatch.json`).

  Attributes:
    schedule: 'rounds' or 'async'.
    executor: 'local' or 'dask'.
    slots: jobs the executor ran at once (its workers).
    trials: trials told in the loop (done or failed).
    wall_seconds: the loop's wall time.
    busy_seconds: the seconds the workers spent running jobs.
    worker_busy_fraction: `busy_seconds / (slots * wall_seconds)`.
    trials_per_hour: `trials * 3600 / wall_seconds`.
    requeued_jobs: jobs that went back to the queue after a lost worker (async), or
      None (rounds: the executor submits them again itself).
  """

  schedule: str
  executor: str
  slots: int
  trials: int
  wall_seconds: float
  busy_seconds: float
  worker_busy_fraction: float | None
  trials_per_hour: float | None
  requeued_jobs: int | None = None


def dispatch_record(schedule: str, executor_name: str, slots: int, trials: int,
                    wall_seconds: float, busy_seconds: float,
                    requeued_jobs: int | None = None) -> DispatchRecord:
  """The `DispatchRecord` of a loop (None fractions for a loop that took no time)."""
  timed = wall_seconds > 0 and slots > 0
  return DispatchRecord(schedule, executor_name, slots, trials, wall_seconds, busy_seconds,
                        busy_seconds / (slots * wall_seconds) if timed else None,
                        trials * 3600.0 / wall_seconds if timed else None, requeued_jobs)


def num_final(study: Study) -> int:
  """Trials of `study` with a final status that ran (done, failed, pruned)."""
  return sum(t.status in ENDED_STATUSES for t in study.trials())


class Loop:
  """A search's trial loop over `study`: in rounds or asynchronously, workers measured.

  Args:
    study: the open study.
    ask: `ask(study, n) -> suggestions` (`search_round.ask_round`).
    ask_batch: trials per ask.
    num_trials: the loop ends once this many trials ran to a final status.
    executor: runs the jobs (`executor.py`); its `busy_seconds` are read before and after.
    on_asked: called after each non-empty ask (the Optuna mirror shows the trials running).
  """

  def __init__(self, study: Study, ask: Callable[[Study, int], list[Suggestion]],
               ask_batch: int, num_trials: int, executor, on_asked: Callable[[], Any]):
    self.study, self.ask, self.executor, self.on_asked = study, ask, executor, on_asked
    self.ask_batch, self.num_trials = ask_batch, num_trials
    self.requeued: int | None = None
    self._started, self._busy = time.perf_counter(), executor.busy_seconds
    self._final = num_final(study)

  def run_rounds(self, run_round: Callable[[list[Suggestion]], Any]) -> None:
    """Asks a round of up to `ask_batch` trials and runs it (`run_round`), until done."""
    while (final := num_final(self.study)) < self.num_trials:
      batch = self.ask(self.study, min(self.ask_batch, self.num_trials - final))
      if not batch:
        return
      self.on_asked()
      run_round(batch)

  def run_async(self, cohort_jobs: Callable[[list[Suggestion]], Sequence[tuple[CohortJob, Any]]],
                tell_job: TellJob) -> None:
    """`run_async` over the study: an ask of up to `ask_batch` trials (never past
    `num_trials`, counting the trials queued and running) whenever a worker is free and
    no cohort is ready; `cohort_jobs(batch)` forms its cohorts, `tell_job` tells each
    job's results. A lost job's trials are journaled as re-queued (`record_retry`)."""

    def ask_jobs(outstanding: int):
      while True:  # an ask whose every config fails to build forms no job: ask again
        n = min(self.ask_batch, self.num_trials - num_final(self.study) - outstanding)
        batch = self.ask(self.study, n) if n > 0 else []
        if not batch:
          return []
        self.on_asked()
        jobs = cohort_jobs(batch)
        if jobs:
          return jobs

    self.requeued = run_async(self.executor, ask_jobs, tell_job,
                              max_attempts=getattr(self.executor, "max_attempts", 1),
                              on_retry=lambda job, _: self.study.record_retry(job.trial_ids))

  def save(self, workdir: str, schedule: str) -> DispatchRecord:
    """The loop's `DispatchRecord` so far, also written to `workdir/dispatch.json`."""
    record = dispatch_record(schedule, self.executor.name, self.executor.slots,
                             num_final(self.study) - self._final,
                             time.perf_counter() - self._started,
                             self.executor.busy_seconds - self._busy, self.requeued)
    search_config.write_json(os.path.join(workdir, DISPATCH_FILE), record._asdict())
    return record
