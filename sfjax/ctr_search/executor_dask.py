"""Cohorts as Dask distributed tasks (`--config.study.executor=dask`), across processes or machines.

Each `CohortJob` is one task: `_remote_run(task, cohort_width, measure_latency,
job)`, a pure function of its arguments returning the trials' results (metrics,
status, the host state for promotions and the chunk that ran each trial, so the
driver reports the programs the workers ran). No RPC of our own: Dask ships the
arguments and results (pickled), places the tasks, and notices dead workers.

  * Worker set-up: each worker process builds its own `CohortRunner` (and its
    `TrialData`) once per (task, width, latency) and keeps it, so compiled
    programs are reused across its tasks. A `LocalCluster` started here gives
    its workers the driver's `JAX_PLATFORMS` and `XLA_FLAGS` explicitly (the same
    device set-up as the local executor, so results match it exactly) and turns
    off JAX's GPU memory preallocation (several workers may share a GPU). On a
    cluster of machines start one `dask worker --nworkers 1 --nthreads 1` per
    accelerator (e.g. with `CUDA_VISIBLE_DEVICES` set) and pass the scheduler's
    address as `study.dask_address`.
  * A worker that dies mid-task: the scheduler reschedules its task on another
    worker by itself (up to its `allowed-failures`); when it gives up
    (`KilledWorker`) or the future is lost, the job is submitted again, up to
    `max_attempts` submissions, calling `on_retry` first (the driver journals a
    re-queue of the job's trials); then its trials fail.
  * Results come back in job order (tasks still run in parallel): the driver
    tells the study in the local executor's order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from absl import logging

from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.task import CTRTask
from sfjax.cohorts.trial_result import CohortTrialResult
from sfjax.ctr_search.executor import (
  CohortJob,
  GroupRunners,
  RetryHook,
  describe,
  failed_results,
  run_job,
)

# Per worker process: (task, cohort width, measure_latency) -> its runners.
_WORKER_RUNNERS: dict[tuple[CTRTask, Any, bool], GroupRunners] = {}


def _worker_environment() -> dict[str, str]:
  """Environment of `LocalCluster` workers: the driver's JAX device set-up, explicitly."""
  env = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
         "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  if "JAX_PLATFORMS" in os.environ:
    env["JAX_PLATFORMS"] = os.environ["JAX_PLATFORMS"]
  return env


def _remote_run(task: CTRTask, cohort_width: int | str, measure_latency: bool,
               job: CohortJob) -> list[CohortTrialResult]:
  """Runs `job` in a worker (the Dask task): its results, exceptions as FAILED results."""
  key = (task, cohort_width, bool(measure_latency))
  if key not in _WORKER_RUNNERS:
    _WORKER_RUNNERS[key] = GroupRunners(CohortRunner(task, cohort_width=cohort_width,
                                                     measure_latency=measure_latency))
  return run_job(_WORKER_RUNNERS[key], job)


class DaskExecutor:
  """Runs jobs as tasks on a Dask cluster: an existing scheduler or a new `LocalCluster`.

  Args:
    task, cohort_width, measure_latency: what the workers' runners are built from.
    address: scheduler address ('' = start a `LocalCluster` of `num_workers`
      processes with one thread each, closed by `close()`).
    num_workers: workers of that `LocalCluster`.
    max_attempts: submissions of one job before its trials fail (>= 1).
    allowed_failures: the `LocalCluster` scheduler's worker deaths per task before
      it gives up with `KilledWorker` (None: Dask's configured default, 3).
  """

  name = "dask"

  def __init__(self, task: CTRTask, cohort_width: int | str, measure_latency: bool, *,
               address: str = "", num_workers: int = 2, max_attempts: int = 3,
               allowed_failures: int | None = None):
    import distributed  # pylint: disable=g-import-not-at-top
    if max_attempts < 1:
      raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if not address and num_workers < 1:
      raise ValueError(f"study.dask_workers: need at least one worker, got {num_workers}")
    self.task, self.cohort_width = task, cohort_width
    self.measure_latency = bool(measure_latency)
    self.max_attempts = max_attempts
    self.retries = 0  # jobs submitted again after a lost worker, over this executor's life
    self.cluster = None
    if address:
      try:
        self.client = distributed.Client(address, timeout="30s")
      except OSError as e:
        raise ConnectionError(f"study.dask_address: cannot reach a Dask scheduler at "
                              f"{address!r}: {e}") from None
    else:
      scheduler_kwargs = {} if allowed_failures is None else {"allowed_failures": allowed_failures}
      self.cluster = distributed.LocalCluster(
          n_workers=num_workers, threads_per_worker=1, processes=True, dashboard_address=None,
          env=_worker_environment(), scheduler_kwargs=scheduler_kwargs)
      self.client = distributed.Client(self.cluster)

  @property
  def address(self) -> str:
    """The scheduler's address (pass it as `study.dask_address` to share the cluster)."""
    scheduler = self.client.scheduler
    if scheduler is None or scheduler.address is None:
      raise RuntimeError("the Dask client has no scheduler address (is it closed?)")
    return scheduler.address

  def _submit(self, job: CohortJob):
    return self.client.submit(_remote_run, self.task, self.cohort_width, self.measure_latency,
                              job, pure=False)

  def map(self, jobs: Iterable[CohortJob], on_retry: RetryHook | None = None
          ) -> Iterator[list[CohortTrialResult]]:
    """Submits every job at once; yields their results in job order.

    Args:
      jobs: the jobs.
      on_retry: called with `(job, reason)` before a job is submitted again.
    """
    import distributed  # pylint: disable=g-import-not-at-top
    jobs = list(jobs)
    futures = [self._submit(job) for job in jobs]
    try:
      for i, job in enumerate(jobs):
        attempt = 1
        while True:
          try:
            results = futures[i].result()
            break
          except (distributed.KilledWorker, distributed.client.FutureCancelledError,
                  distributed.comm.CommClosedError) as e:
            reason = f"worker lost: {type(e).__name__}: {e}"
            if attempt >= self.max_attempts:
              results = failed_results(job, f"{reason} (after {attempt} submissions)")
              break
            logging.warning("cohort %s: %s; submitting it again", describe(job), reason)
            if on_retry is not None:
              on_retry(job, reason)
            attempt += 1
            self.retries += 1
            futures[i] = self._submit(job)
          except Exception as e:  # pylint: disable=broad-except  (e.g. unpicklable results)
            results = failed_results(job, f"{type(e).__name__}: {e}")
            break
        futures[i] = None  # drop the reference: the cluster frees the result
        yield results
    finally:
      leftover = [f for f in futures if f is not None]
      if leftover:
        self.client.cancel(leftover)

  def close(self) -> None:
    """Closes the client, and the `LocalCluster` if this executor started it."""
    self.client.close()
    if self.cluster is not None:
      self.cluster.close()

  def __enter__(self) -> DaskExecutor:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
