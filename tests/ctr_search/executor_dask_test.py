"""Cohorts on a 2-worker Dask LocalCluster: a killed worker's job is re-run, and a search
gives the local executor's trials and metrics exactly (sfjax/ctr_search/executor_dask.py),
in rounds and on the asynchronous schedule (sfjax/ctr_search/dispatch.py), where a worker
killed mid-cohort sends its trials back to the queue."""

import json
import os
import signal
import threading
import time

import pytest

from experiments.configs import search_ctr
from search_spaces.ctr import SEARCH_SPACE as SPACE
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.ctr_search import dispatch, search_config, search_loop
from sfjax.ctr_search.executor import CohortJob, _LocalExecutor
from sfjax.ctr_search.executor_dask import DaskExecutor, _worker_environment

TIMING = ("seconds", "latency_ms")  # wall-clock measures: the only metrics allowed to differ


def tiny_config(families="lr,fm", **study):
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale = 4096, 2048, 0.0001
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 1024, 1024
  c.task.steps_per_budget_unit = 4
  c.space.families = families
  c.study.algorithm, c.study.num_trials, c.study.ask_batch = "random", 4, 4
  c.study.cohort_width, c.study.max_budget, c.study.leaderboard_size = "1", 2.0, 0
  for key, value in study.items():
    setattr(c.study, key, value)
  return c


@pytest.fixture(scope="module")
def task():
  return search_config.make_task(tiny_config())


@pytest.fixture(scope="module")
def cluster(task):
  # allowed_failures=0: the scheduler gives up on a task at its first dead worker, so the
  # executor's own resubmission is what re-runs it (with Dask's default it reschedules itself).
  with DaskExecutor(task, 1, False, num_workers=2, allowed_failures=0) as executor:
    yield executor


def _without_timing(metrics):
  return {k: v for k, v in metrics.items() if k not in TIMING}


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_workers_get_the_drivers_device_setup(cluster):
  env = cluster.client.run(lambda: {k: os.environ.get(k) for k in ("XLA_FLAGS", "JAX_PLATFORMS")})
  assert len(env) == 2
  expected = _worker_environment()
  for worker_env in env.values():
    assert worker_env["XLA_FLAGS"] == expected["XLA_FLAGS"]
    assert worker_env["JAX_PLATFORMS"] == expected.get("JAX_PLATFORMS")


@pytest.mark.timeout(240)
def test_killed_worker_mid_task_is_resubmitted_with_the_same_results(cluster, task):
  # The default config's architecture and step count: the search test below reuses the
  # programs compiled here (in the driver and in a worker).
  arch, hparams = split_config(SPACE.runner_config(SPACE.default_config(None)))
  job = CohortJob(arch, [hparams, {**hparams, "optimizer.learning_rate": 3e-3}], [11, 12], [0, 0], [8, 8],
                  [None, None], [0, 1])
  retried, out = [], []
  thread = threading.Thread(
      target=lambda: out.extend(cluster.map([job], lambda j, r: retried.append(r))))
  thread.start()
  deadline = time.time() + 60
  busy = []
  while not busy and time.time() < deadline:
    busy = [addr for addr, keys in cluster.client.processing().items() if keys]
    time.sleep(0.05)
  assert busy, "the job never started"
  time.sleep(1.0)  # mid-task: a cold worker imports JAX, builds the data and compiles first
  pid = cluster.client.run(os.getpid, workers=busy[:1])[busy[0]]
  os.kill(pid, signal.SIGKILL)
  thread.join(timeout=180)
  assert not thread.is_alive()
  assert len(retried) == 1 and "KilledWorker" in retried[0] and cluster.retries == 1
  local = next(_LocalExecutor(CohortRunner(task, cohort_width=1)).map([job]))
  (remote,) = out
  assert [r.status for r in remote] == [r.status for r in local] == ["done", "done"]
  assert [_without_timing(r.metrics) for r in remote] == [_without_timing(r.metrics) for r in local]


@pytest.mark.timeout(240)
def test_search_on_the_cluster_matches_the_local_executor(cluster, tmp_path):
  # Free asking (no bucket-filled rounds), so a round holds two families: two jobs at once.
  local = search_loop.run_search(tiny_config(fill_cohorts=False), str(tmp_path / "local"), SPACE)
  remote = search_loop.run_search(
      tiny_config(executor="dask", fill_cohorts=False,
                  dask_address=cluster.shared_address(str(tmp_path / "tls"))),
      str(tmp_path / "dask"), SPACE)
  assert local["num_trials_done"] == remote["num_trials_done"] == 4
  trials = {}
  for name in ("local", "dask"):
    trials[name] = [(t["trial_id"], t["config"], t["status"], _without_timing(t["metrics"]))
                    for t in _read_jsonl(tmp_path / name / "trials.jsonl")]
  assert trials["local"] == trials["dask"]
  assert {t[1]["model.name"] for t in trials["local"]} == {"lr", "fm"}  # two jobs in parallel
  assert _without_timing(local["default_metrics"]) == _without_timing(remote["default_metrics"])
  for key in ("best_trial_id", "best_config", "beats_default", "pareto_front"):
    assert local[key] == remote[key]


def _trials(workdir):
  return [(t["trial_id"], t["config"], t["status"], _without_timing(t["metrics"]))
          for t in _read_jsonl(workdir / "trials.jsonl")]


def _dispatch_record(workdir):
  with open(workdir / dispatch.DISPATCH_FILE) as f:
    return json.load(f)


@pytest.mark.timeout(300)
def test_async_search_with_filled_cohorts_matches_the_local_rounds(cluster, tmp_path):
  # The default fill, three families (three buckets) and two asks of 4: more cohorts than
  # workers, taken from the queue as workers free up. Random proposals do not depend on
  # results and each ask is a round's ask, so the trials are the local rounds' exactly.
  config = dict(families="lr,fm,deepfm", num_trials=8)
  assert tiny_config(**config).study.fill_cohorts  # the default, on
  local = search_loop.run_search(tiny_config(**config), str(tmp_path / "local"), SPACE)
  remote = search_loop.run_search(
      tiny_config(**config, executor="dask",
                  dask_address=cluster.shared_address(str(tmp_path / "tls"))),
      str(tmp_path / "dask"), SPACE)
  assert local["num_trials_done"] == remote["num_trials_done"] == 8
  assert _trials(tmp_path / "local") == _trials(tmp_path / "dask")
  assert {t[1]["model.name"] for t in _trials(tmp_path / "dask")} == {"lr", "fm", "deepfm"}
  for key in ("best_trial_id", "best_config", "beats_default", "mean_cohort_width"):
    assert local[key] == remote[key]
  record = _dispatch_record(tmp_path / "dask")
  assert record["schedule"] == "async" and record["executor"] == "dask"
  assert record["slots"] == 2 and record["trials"] == 8 and record["requeued_jobs"] == 0
  assert 0 < record["worker_busy_fraction"] <= 1.0
  assert _dispatch_record(tmp_path / "local")["schedule"] == "rounds"  # local: auto = rounds


def _asked(journal) -> bool:
  """Whether the study journaled an ask (a line being written is not read yet)."""
  try:
    return journal.exists() and any(e.get("event") == "ask" for e in _read_jsonl(journal))
  except ValueError:
    return False


@pytest.mark.timeout(300)
def test_killed_worker_mid_cohort_requeues_its_trials(cluster, tmp_path):
  # A task of its own (longer trials: a new program to build and compile in the worker), so
  # the kill lands mid-cohort; allowed_failures=0 hands the loss to the dispatcher.
  def config(**study):
    c = tiny_config(num_trials=4, **study)
    c.task.steps_per_budget_unit = 40
    return c

  workdir = tmp_path / "dask"
  out = []
  thread = threading.Thread(target=lambda: out.append(search_loop.run_search(
      config(executor="dask", dask_address=cluster.shared_address(str(tmp_path / "tls"))),
      str(workdir), SPACE)))
  thread.start()
  deadline, busy = time.time() + 120, []
  while not busy and time.time() < deadline:  # a trial cohort (asked: past the default's run)
    asked = _asked(workdir / "journal.jsonl")
    busy = [a for a, keys in cluster.client.processing().items() if keys] if asked else []
    time.sleep(0.05)
  assert busy, "no trial cohort ever started"
  time.sleep(0.5)
  pid = cluster.client.run(os.getpid, workers=busy[:1])[busy[0]]
  os.kill(pid, signal.SIGKILL)
  thread.join(timeout=240)
  assert not thread.is_alive() and out[0]["num_trials_done"] == 4 and out[0]["num_failed"] == 0
  record = _dispatch_record(workdir)
  requeues = [e for e in _read_jsonl(workdir / "journal.jsonl") if e.get("event") == "requeue"]
  assert record["schedule"] == "async" and record["requeued_jobs"] == len(requeues) >= 1
  assert all(e["trial_ids"] for e in requeues)  # the lost cohort's trials, journaled
  # Run again, the lost cohort's trials are the trials the local rounds train.
  search_loop.run_search(config(), str(tmp_path / "local"), SPACE)
  assert _trials(workdir) == _trials(tmp_path / "local")
