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
"""

from __future__ import annotations

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


RetryHook = Callable[[CohortJob, str], None]


class _LocalExecutor:
  """Runs every job in this process, one after the other."""

  name = "local"

  def __init__(self, runner: CohortRunner):
    self.runners = GroupRunners(runner)

  def map(self, jobs: Iterable[CohortJob], on_retry: RetryHook | None = None
          ) -> Iterator[list[CohortTrialResult]]:
    """Results of each job, in job order (`on_retry` is never called here)."""
    del on_retry
    for job in jobs:
      yield run_job(self.runners, job)

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
