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
  * Security (issue #25): a `LocalCluster` started here listens on 127.0.0.1 only,
    speaks TLS with a certificate generated for this study (`Security.temporary()`:
    the scheduler, the workers and every client must present it, so a foreign
    `distributed.Client` on the same host is refused), and serves no HTTP at all
    (Dask's scheduler starts an HTTP server on port 8787 even with
    `dashboard_address=None`, and each worker one on a random port; both are
    stopped). `shared_address(directory)` writes the certificate (mode 0600) and
    returns the address another study passes to use this cluster. An existing
    cluster's `study.dask_address` is `tls://HOST:PORT?ca=CA.pem&cert=CERT.pem&key=KEY.pem`
    (`parse_address`), or `tls://HOST:PORT` with Dask's own `distributed.comm.tls`
    configuration; a plain `tcp://` address is accepted with a warning.
  * A worker that dies mid-task: the scheduler reschedules its task on another
    worker by itself (up to its `allowed-failures`); when it gives up
    (`KilledWorker`) or the future is lost, the job is submitted again, up to
    `max_attempts` submissions, calling `on_retry` first (the driver journals a
    re-queue of the job's trials); then its trials fail.
  * `map`: results come back in job order (tasks still run in parallel): the driver
    tells the study in the local executor's order. `submit` / `wait_any` (the
    asynchronous schedule, `dispatch.py`): the first task to finish comes back
    first; a task whose worker was lost comes back as lost (`JobOutcome.lost`) and
    the dispatcher re-queues its trials. `slots` is the cluster's worker threads;
    each task reports the seconds it ran, summed in `busy_seconds`.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from typing import Any

import distributed
from absl import logging

from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.task import CTRTask
from sfjax.cohorts.trial_result import CohortTrialResult
from sfjax.ctr_search.executor import (
  CohortJob,
  GroupRunners,
  JobOutcome,
  RetryHook,
  describe,
  failed_results,
  timed_run_job,
)

# Per worker process: (task, cohort width, measure_latency) -> its runners.
_WORKER_RUNNERS: dict[tuple[CTRTask, Any, bool], GroupRunners] = {}

# The query keys of a `tls://` `study.dask_address` -> the client's `Security` fields.
_TLS_KEYS = {"ca": "tls_ca_file", "cert": "tls_client_cert", "key": "tls_client_key"}
_PEM_FILES = {"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem"}


def parse_address(spec: str) -> tuple[str, distributed.Security | None]:
  """`study.dask_address` -> the scheduler's address and the client's security.

  Args:
    spec: `tcp://HOST:PORT` or `HOST:PORT` (no security), `tls://HOST:PORT?ca=CA&cert=CERT&key=KEY`
      (PEM files: the CA that signed the cluster's certificates, this client's
      certificate and key), or `tls://HOST:PORT` (Dask's `distributed.comm.tls` config).

  Raises:
    ValueError: one line naming `study.dask_address`: an unknown scheme or query key, a
      missing or unreadable file, TLS settings on a `tcp://` address, or a `tls://`
      address with no certificate anywhere.
  """
  base, _, query = spec.partition("?")
  if "://" not in base and base:
    base = "tcp://" + base  # Dask's default scheme for a bare HOST:PORT
  scheme = base.split("://", 1)[0] if "://" in base else ""
  if scheme not in ("tcp", "tls"):
    raise ValueError(f"study.dask_address: expected tcp://HOST:PORT or tls://HOST:PORT"
                     f"?ca=...&cert=...&key=..., got {spec!r}")
  try:
    fields = dict(urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
  except ValueError:
    raise ValueError(f"study.dask_address: malformed query {query!r}") from None
  unknown = sorted(set(fields) - set(_TLS_KEYS))
  if unknown:
    raise ValueError(f"study.dask_address: unknown setting(s) {unknown}; known: {list(_TLS_KEYS)}")
  if scheme == "tcp":
    if fields:
      raise ValueError("study.dask_address: TLS files given for a tcp:// address; use tls://")
    logging.warning("study.dask_address %s: plain TCP, unauthenticated: anyone who can reach "
                    "it can run code on the workers; prefer tls://", base)
    return base, None
  if not fields:
    security = distributed.Security()  # Dask's distributed.comm.tls.* configuration
    client = security.get_tls_config_for_role("client")
    if not (client["ca_file"] and client["cert"]):
      raise ValueError(f"study.dask_address: {base} needs ?ca=CA.pem&cert=CERT.pem&key=KEY.pem "
                       "(or Dask's distributed.comm.tls configuration)")
    return base, security
  if set(fields) != set(_TLS_KEYS):
    raise ValueError(f"study.dask_address: missing {sorted(set(_TLS_KEYS) - set(fields))} "
                     "(a tls:// address needs ca, cert and key)")
  for name, path in fields.items():
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
      raise ValueError(f"study.dask_address: {name}={path}: no such readable file")
  return base, distributed.Security(require_encryption=True,
                                    **{_TLS_KEYS[k]: v for k, v in fields.items()})


def _write_private(path: str, text: str) -> None:
  """Writes `text` to a new file `path` readable by its owner only (mode 0600)."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  with os.fdopen(fd, "w") as f:
    f.write(text)


class _NoHTTPServer(distributed.diagnostics.plugin.WorkerPlugin):
  """Stops a worker's HTTP server (Prometheus metrics, health) as it joins: no open port
  but its TLS one. Registered with the scheduler, so a restarted worker gets it too."""

  name = "sfjax-no-http-server"

  def setup(self, worker) -> None:
    """Called in the worker's event loop when it joins."""
    _stop_http_server(worker)


def _stop_scheduler_http_server(dask_scheduler) -> None:
  """`Client.run_on_scheduler` function (runs in the scheduler's event loop)."""
  _stop_http_server(dask_scheduler)


def _stop_http_server(server) -> None:
  """Stops the HTTP server of a Dask scheduler or worker (its close() stops it again: no-op)."""
  http_server = getattr(server, "http_server", None)
  if http_server is not None:
    http_server.stop()


def _worker_environment() -> dict[str, str]:
  """Environment of `LocalCluster` workers: the driver's JAX device set-up, explicitly."""
  env = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
         "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  if "JAX_PLATFORMS" in os.environ:
    env["JAX_PLATFORMS"] = os.environ["JAX_PLATFORMS"]
  return env


# What a task raises when its worker is lost (the job can run again elsewhere).
_LOST = (distributed.KilledWorker, distributed.client.FutureCancelledError,
         distributed.comm.CommClosedError)


def _remote_run(task: CTRTask, cohort_width: int | str, measure_latency: bool,
               job: CohortJob) -> tuple[list[CohortTrialResult], float]:
  """Runs `job` in a worker (the Dask task): its results (exceptions as FAILED results)
  and the seconds the worker spent on it (its runner's set-up included)."""
  start = time.perf_counter()
  key = (task, cohort_width, bool(measure_latency))
  if key not in _WORKER_RUNNERS:
    _WORKER_RUNNERS[key] = GroupRunners(CohortRunner(task, cohort_width=cohort_width,
                                                     measure_latency=measure_latency))
  results, _ = timed_run_job(_WORKER_RUNNERS[key], job)
  return results, time.perf_counter() - start


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
    if max_attempts < 1:
      raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    if not address and num_workers < 1:
      raise ValueError(f"study.dask_workers: need at least one worker, got {num_workers}")
    self.task, self.cohort_width = task, cohort_width
    self.measure_latency = bool(measure_latency)
    self.max_attempts = max_attempts
    self.retries = 0  # jobs submitted again after a lost worker, over this executor's life
    self.busy_seconds = 0.0  # seconds the workers spent running this executor's jobs
    self.cluster = None
    self._futures: dict[int, Any] = {}  # ticket -> future of a submitted job (`submit`)
    self._next_ticket = 0
    if address:
      scheduler_address, self.security = parse_address(address)
      try:
        self.client = distributed.Client(scheduler_address, timeout="30s",
                                         security=self.security)
      except OSError as e:
        raise ConnectionError(f"study.dask_address: cannot reach a Dask scheduler at "
                              f"{scheduler_address!r}: {e}") from None
    else:
      self.security = distributed.Security.temporary()  # this study's certificate
      scheduler_kwargs: dict[str, Any] = {"dashboard": False, "dashboard_address": "127.0.0.1:0"}
      if allowed_failures is not None:
        scheduler_kwargs["allowed_failures"] = allowed_failures
      self.cluster = distributed.LocalCluster(
          n_workers=num_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
          protocol="tls://", security=self.security, dashboard_address=None,
          env=_worker_environment(), scheduler_kwargs=scheduler_kwargs)
      self.client = distributed.Client(self.cluster, security=self.security)
      self.client.run_on_scheduler(_stop_scheduler_http_server)
      self.client.register_plugin(_NoHTTPServer())

  @property
  def slots(self) -> int:
    """Jobs the cluster runs at once: its workers' threads (at least 1)."""
    workers = self.client.scheduler_info().get("workers", {}).values()
    return max(1, sum(int(w.get("nthreads", 1)) for w in workers))

  @property
  def address(self) -> str:
    """The scheduler's address (pass it as `study.dask_address` to share the cluster)."""
    scheduler = self.client.scheduler
    if scheduler is None or scheduler.address is None:
      raise RuntimeError("the Dask client has no scheduler address (is it closed?)")
    return scheduler.address

  def shared_address(self, directory: str) -> str:
    """Writes this study's certificate into `directory` (files of mode 0600); returns the
    `study.dask_address` with which another study (or `distributed.Client`) joins it.

    Raises:
      ValueError: this executor joined an existing cluster (its certificate is not ours).
    """
    if self.cluster is None or self.security is None:
      raise ValueError("shared_address: only for a cluster this executor started")
    os.makedirs(directory, exist_ok=True)
    client = self.security.get_tls_config_for_role("client")  # PEM texts (in memory)
    pem = {"ca": client["ca_file"], "cert": client["cert"], "key": client["key"]}
    paths = {}
    for name, text in pem.items():
      paths[name] = os.path.join(os.path.abspath(directory), _PEM_FILES[name])
      _write_private(paths[name], text)
    return f"{self.address}?{urllib.parse.urlencode(paths, safe='/')}"

  def _submit(self, job: CohortJob):
    return self.client.submit(_remote_run, self.task, self.cohort_width, self.measure_latency,
                              job, pure=False)

  def _results(self, future) -> tuple[list[CohortTrialResult], float]:
    """A finished task's results and run seconds (added to `busy_seconds`). Raises what
    the task raised."""
    results, seconds = future.result()
    self.busy_seconds += seconds
    return results, seconds

  def submit(self, job: CohortJob) -> int:
    """Submits `job` as one task; returns its ticket for `wait_any`."""
    ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
    self._futures[ticket] = (job, self._submit(job))
    return ticket

  def wait_any(self) -> tuple[int, JobOutcome]:
    """Waits for a submitted job to finish; its ticket and outcome (the oldest ticket
    among those finished). A lost worker gives `JobOutcome(None, 0, reason)` (never
    submitted again here: the dispatcher re-queues it); another exception, FAILED results.

    Raises:
      RuntimeError: nothing was submitted.
    """
    if not self._futures:
      raise RuntimeError("wait_any: no job submitted")
    distributed.wait([f for _, f in self._futures.values()], return_when="FIRST_COMPLETED")
    ticket = min(t for t, (_, f) in self._futures.items() if f.done())
    job, future = self._futures.pop(ticket)
    try:
      return ticket, JobOutcome(*self._results(future))
    except _LOST as e:
      return ticket, JobOutcome(None, 0.0, f"worker lost: {type(e).__name__}: {e}")
    except Exception as e:  # pylint: disable=broad-except  (e.g. unpicklable results)
      return ticket, JobOutcome(failed_results(job, f"{type(e).__name__}: {e}"), 0.0)

  def map(self, jobs: Iterable[CohortJob], on_retry: RetryHook | None = None
          ) -> Iterator[list[CohortTrialResult]]:
    """Submits every job at once; yields their results in job order.

    Args:
      jobs: the jobs.
      on_retry: called with `(job, reason)` before a job is submitted again.
    """
    jobs = list(jobs)
    futures = [self._submit(job) for job in jobs]
    try:
      for i, job in enumerate(jobs):
        attempt = 1
        while True:
          try:
            results, _ = self._results(futures[i])
            break
          except _LOST as e:
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
    """Cancels submitted jobs still running; closes the client, and the `LocalCluster` if
    this executor started it."""
    if self._futures:
      self.client.cancel([f for _, f in self._futures.values()])
      self._futures.clear()
    self.client.close()
    if self.cluster is not None:
      self.cluster.close()

  def __enter__(self) -> DaskExecutor:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
