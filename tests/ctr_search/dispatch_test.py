"""The asynchronous schedule (sfjax/ctr_search/dispatch.py): which algorithms take it, the
queue's re-queue of a lost job, the same trials as rounds for a result-independent algorithm,
and the workers' busy record. (On a Dask cluster: executor_dask_test.)"""

import json

import pytest

from experiments.configs import search_ctr
from search_spaces.ctr import SEARCH_SPACE as SPACE
from sfjax.automl.algorithms import ALGORITHMS, TrialStatus
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.ctr_search import dispatch, executor, search_config, search_loop, search_report
from sfjax.ctr_search.search_config import SearchConfigError

TIMING = ("seconds", "latency_ms")  # wall-clock measures: the only metrics allowed to differ


def tiny_config(**study):
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale = 4096, 2048, 0.0001
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 1024, 1024
  c.task.steps_per_budget_unit = 2
  c.space.families = "lr,fm"
  c.study.algorithm, c.study.num_trials, c.study.ask_batch = "random", 5, 2
  c.study.cohort_width, c.study.max_budget, c.study.leaderboard_size = "1", 2.0, 0
  for key, value in study.items():
    setattr(c.study, key, value)
  return c


@pytest.fixture(scope="module")
def runner():
  return CohortRunner(search_config.make_task(tiny_config()), cohort_width=1)


class LosingExecutor(executor._LocalExecutor):
  """The local executor, whose first `losses` finished jobs come back as lost workers (an
  injected fault: the jobs really ran; their results are dropped as a dead worker's are)."""

  def __init__(self, runner, losses):
    super().__init__(runner)
    self.losses, self.submitted = losses, []

  def submit(self, job):
    self.submitted.append(job.trial_ids)
    return super().submit(job)

  def wait_any(self):
    ticket, outcome = super().wait_any()
    if self.losses:
      self.losses -= 1
      return ticket, executor.JobOutcome(None, 0.0, "worker lost: injected")
    return ticket, outcome


def _job(runner, trial_ids):
  arch, hparams = split_config({"model.name": "lr"})
  n = len(trial_ids)
  return executor.CohortJob(arch, [hparams] * n, list(trial_ids), [0] * n, [2] * n, [None] * n,
                            list(trial_ids))


@pytest.mark.parametrize("name,executor_name,expected", [
    ("asha", "dask", "async"), ("tpe", "dask", "async"), ("random", "dask", "async"),
    ("asha", "local", "rounds"),  # one slot: the local executor keeps its exact results
    ("successive_halving", "dask", "rounds"), ("gp", "dask", "rounds"),
    ("nsga2", "dask", "rounds"), ("pbt", "local", "rounds")])
def test_auto_takes_async_only_for_asynchronous_algorithms_on_workers(name, executor_name,
                                                                      expected):
  algorithm = ALGORITHMS[name]()
  assert dispatch.choose_schedule("auto", executor_name, algorithm) == expected
  assert dispatch.choose_schedule("rounds", executor_name, algorithm) == "rounds"


def test_bad_dispatch_settings_name_the_field():
  with pytest.raises(SearchConfigError, match="study.dispatch='async': gp asks in synchronous"):
    dispatch.choose_schedule("async", "dask", ALGORITHMS["gp"]())
  with pytest.raises(SearchConfigError, match="study.dispatch: unknown schedule 'eager'"):
    dispatch.choose_schedule("eager", "dask", ALGORITHMS["asha"]())
  assert dispatch.choose_schedule("async", "local", ALGORITHMS["asha"]()) == "async"
  assert set(dispatch.ASYNC_ALGORITHMS) < set(ALGORITHMS)  # every name is a real algorithm


def test_a_lost_job_goes_back_to_the_front_of_the_queue_then_fails(runner):
  asks = [[(_job(runner, [0]), "a"), (_job(runner, [1, 2]), "b")], [(_job(runner, [3]), "c")]]
  outstanding, told, retried = [], [], []

  def ask_jobs(n):
    outstanding.append(n)
    return asks.pop(0) if asks else []

  lossy = LosingExecutor(runner, losses=1)
  requeued = dispatch.run_async(lossy, ask_jobs, lambda job, m, r: told.append((m, r)),
                                max_attempts=2, on_retry=lambda job, why: retried.append(why))
  # Job 'a' was lost once and ran again before 'b' (first in line); the next ask came when
  # the queue was empty, with nothing outstanding (one slot).
  assert lossy.submitted == [[0], [0], [1, 2], [3]] and requeued == 1
  assert retried == ["worker lost: injected"] and outstanding == [0, 0, 0]
  assert [m for m, _ in told] == ["a", "b", "c"]
  assert all(r.status == TrialStatus.DONE for _, results in told for r in results)
  # Lost at every submission: after max_attempts its trials fail, naming the loss.
  told.clear()
  asks = [[(_job(runner, [5]), "d")]]
  requeued = dispatch.run_async(LosingExecutor(runner, losses=2), ask_jobs,
                                lambda job, m, r: told.append((m, r)), max_attempts=2)
  ((members, results),) = told
  assert members == "d" and requeued == 1 and results[0].status == TrialStatus.FAILED
  assert results[0].error == "worker lost: injected (after 2 submissions)"


@pytest.mark.slow  # two searches of 5 trials (~15 s)
def test_async_random_search_runs_the_rounds_trials(tmp_path, runner):
  rounds = search_loop.run_search(tiny_config(dispatch="rounds"), str(tmp_path / "rounds"),
                                  SPACE, runner=runner)
  queued = search_loop.run_search(tiny_config(dispatch="async"), str(tmp_path / "async"), SPACE,
                                  runner=runner)
  trials = {}
  for name in ("rounds", "async"):
    with open(tmp_path / name / "trials.jsonl") as f:
      trials[name] = [(t["trial_id"], t["config"], t["status"],
                       {k: v for k, v in t["metrics"].items() if k not in TIMING})
                      for t in map(json.loads, f)]
  # Random proposals do not depend on results, and each ask is a round's ask: same trials.
  assert len(trials["rounds"]) == 5 and trials["rounds"] == trials["async"]
  for key in ("best_trial_id", "num_trials_done", "mean_cohort_width"):
    assert rounds[key] == queued[key]
  with open(tmp_path / "async" / dispatch.DISPATCH_FILE) as f:
    record = json.load(f)
  assert record["schedule"] == "async" and record["executor"] == "local"
  assert record["slots"] == 1 and record["trials"] == 5 and record["requeued_jobs"] == 0
  assert 0 < record["busy_seconds"] <= record["wall_seconds"]
  assert record["worker_busy_fraction"] == pytest.approx(
      record["busy_seconds"] / record["wall_seconds"])


def test_dispatch_record_and_its_line():
  record = dispatch.dispatch_record("async", "dask", 4, 32, 120.0, 408.0, requeued_jobs=1)
  assert record.worker_busy_fraction == pytest.approx(0.85)
  assert record.trials_per_hour == pytest.approx(960.0)
  assert search_report.dispatch_line(record) == (
      "[dispatch] async on dask: 4 workers 85% busy | 32 trials in 2m00s (960 trials/hour)"
      " | 1 jobs re-queued after a lost worker\n")
  idle = dispatch.dispatch_record("rounds", "local", 1, 0, 0.0, 0.0)
  assert idle.worker_busy_fraction is None and idle.trials_per_hour is None
  assert "1 workers - busy" in search_report.dispatch_line(idle)
