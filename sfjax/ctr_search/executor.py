"""Where cohorts run: in the driver's process (`local`) or as remote tasks (`dask`).

A `CohortJob` is what one `CohortRunner.run` call needs: the trials of one
architecture with their hyperparameters, seeds, step ranges and resume states.
`run_job` runs it and turns an exception into FAILED results (a trial's
failure is never fatal to the study). An executor maps jobs to results **in
job order**, so the driver tells the study in the same order whichever
executor ran them, and the algorithm's state (hence every later suggestion)
is the same (`study.executor` does not change a seeded search's trials).

The driver alone owns the study journal, the saved trial states and the
quota measures; executors only compute (`executor_dask.py`: one Dask task per
job, a pure function of task, width and job).

Besides `map` (a round's jobs), an executor takes jobs one at a time for the
asynchronous schedule (`dispatch.py`): `submit(job) -> ticket`, then
`wait_any() -> (ticket, JobOutcome)` returns the first job to finish (or whose
worker was lost: the dispatcher re-queues it). `slots` is how many jobs it runs
at once (its workers); `busy_seconds` sums the time its workers spent running
jobs, for `worker_busy_fraction`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from absl import logging

from sfjax.automl.algorithms import TrialStatus
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.trial_result import CohortTrialResult

EXECUTORS = ("local", "dask")


class CohortJob(NamedTuple):
  """The trials of one architecture or shape bucket to run together (one
  `CohortRunner.run` call).

  Attributes:
    arch: their ArchSpec, or a tuple of one ArchSpec per trial (one shape bucket).
    hparams: per trial, dynamic hyperparameters (`arch.DYNAMIC_KEYS`).
    seeds: per trial, its init seed.
    start_steps, end_steps: per trial, its global step range.
    init_states: per trial, None (fresh) or the host state to resume from.
    trial_ids: per trial, its study trial id (for retries; -1 for the default config).
    ragged: trials with different step ranges share programs (`CohortRunner.run`).
    merge_optimizers: trials with different row optimizers share programs
      (`CohortRunner.run`, `sfjax.cohorts.lane_optimizers`).
  """

  arch: ArchSpec | tuple[ArchSpec, ...]
  hparams: Sequence[dict[str, float]]
  seeds: Sequence[int]
  start_steps: Sequence[int]
  end_steps: Sequence[int]
  init_states: Sequence[Any]
  trial_ids: Sequence[int]
  ragged: bool = False
  merge_optimizers: bool = False


class GroupRunners:
  """The cohort runner, plus a width-1 runner on the same data and cost model for
  lone trials.

  With 'auto' width a group of one trial would otherwise pay for measuring every
  candidate width (compiling each) although any width runs it alone.
  """

  def __init__(self, runner: CohortRunner):
    self.main = runner
    self._single: CohortRunner | None = None

  def for_group(self, size: int) -> CohortRunner:
    """The runner for a group of `size` trials of one architecture."""
    if size > 1 or self.main.cohort_width != "auto":
      return self.main
    if self._single is None:
      self._single = CohortRunner(self.main.task, cohort_width=1, mesh=self.main.mesh,
                                  data=self.main.data, costs=self.main.costs)
    return self._single


def describe(job: CohortJob) -> str:
  """A short name of the job's architecture (the first one's, for a bucket)."""
  if isinstance(job.arch, ArchSpec):
    return job.arch.describe()
  return f"{job.arch[0].describe()} and {len(set(job.arch)) - 1} more of its bucket"


def failed_results(job: CohortJob, reason: str) -> list[CohortTrialResult]:
  """One FAILED result per trial of `job`, all with `reason` (no chunk: none ran them)."""
  return [CohortTrialResult({}, TrialStatus.FAILED, None, reason) for _ in job.hparams]


def run_job(runners: GroupRunners, job: CohortJob) -> list[CohortTrialResult]:
  """Runs `job` on the runner for its group size; an exception fails its trials.

  Each result names the chunk (program call) that ran it (`CohortTrialResult.chunk`).
  """
  try:
    return runners.for_group(len(job.hparams)).run(
        job.arch, list(job.hparams), list(job.seeds), list(job.start_steps),
        list(job.end_steps), list(job.init_states), ragged=job.ragged,
        merge_optimizers=job.merge_optimizers)
  except Exception as e:  # pylint: disable=broad-except  (a trial's failure is never fatal)
    logging.exception("cohort of %d trials (%s) failed", len(job.hparams), describe(job))
    return failed_results(job, f"{type(e).__name__}: {e}")


def timed_run_job(runners: GroupRunners, job: CohortJob
                  ) -> tuple[list[CohortTrialResult], float]:
  """`run_job` and the wall seconds it took (the worker's busy time for the job)."""
  start = time.perf_counter()
  results = run_job(runners, job)
  return results, time.perf_counter() - start


class JobOutcome(NamedTuple):
  """What came back of one submitted job (`wait_any`).

  Attributes:
    results: per trial of the job, its result (failures included); None when the
      worker running it was lost (the dispatcher re-queues the job).
    seconds: the wall time the job ran on its worker (0 when lost).
    lost: why the worker was lost (None when results came back).
  """

  results: list[CohortTrialResult] | None
  seconds: float
  lost: str | None = None


RetryHook = Callable[[CohortJob, str], None]


class _LocalExecutor:
  """Runs every job in this process, one after the other (one slot)."""

  name = "local"
  slots = 1

  def __init__(self, runner: CohortRunner):
    self.runners = GroupRunners(runner)
    self.busy_seconds = 0.0
    self._submitted: dict[int, CohortJob] = {}
    self._next_ticket = 0

  def map(self, jobs: Iterable[CohortJob], on_retry: RetryHook | None = None
          ) -> Iterator[list[CohortTrialResult]]:
    """Results of each job, in job order (`on_retry` is never called here)."""
    del on_retry
    for job in jobs:
      results, seconds = timed_run_job(self.runners, job)
      self.busy_seconds += seconds
      yield results

  def submit(self, job: CohortJob) -> int:
    """Takes `job` for a later `wait_any` (which runs it); returns its ticket."""
    ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
    self._submitted[ticket] = job
    return ticket

  def wait_any(self) -> tuple[int, JobOutcome]:
    """Runs the oldest submitted job; its ticket and outcome.

    Raises:
      RuntimeError: nothing was submitted.
    """
    if not self._submitted:
      raise RuntimeError("wait_any: no job submitted")
    ticket = min(self._submitted)
    results, seconds = timed_run_job(self.runners, self._submitted.pop(ticket))
    self.busy_seconds += seconds
    return ticket, JobOutcome(results, seconds)

  def close(self) -> None:
    """Nothing to release."""

  def __enter__(self) -> _LocalExecutor:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def make_executor(kind: str, runner: CohortRunner, *, address: str = "", num_workers: int = 2,
                  max_attempts: int = 3):
  """The executor `study.executor` names.

  Args:
    kind: 'local' or 'dask'.
    runner: the driver's runner (local: it runs the jobs; dask: its task, width
      and latency setting are what the workers' runners are built from).
    address: dask: an existing scheduler ('' = start a `LocalCluster`).
    num_workers: dask `LocalCluster` worker processes (one thread each).
    max_attempts: dask: submissions of one job before its trials fail.

  Raises:
    ValueError: an unknown kind (naming `study.executor`).
  """
  if kind == "local":
    return _LocalExecutor(runner)
  if kind == "dask":
    from sfjax.ctr_search import executor_dask  # pylint: disable=g-import-not-at-top
    return executor_dask.DaskExecutor(runner.task, runner.cohort_width,
                                      runner.costs.measure_latency,
                                      address=address, num_workers=num_workers,
                                      max_attempts=max_attempts)
  raise ValueError(f"study.executor: unknown executor {kind!r}; known: {list(EXECUTORS)}")
