"""The local executor, lone-trial runners, failures as results, and the executor factory
(sfjax/ctr_search/executor.py; the Dask executor is in executor_dask_test)."""

import pytest

from experiments.configs import search_ctr
from sfjax.automl.algorithms import TrialStatus
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.ctr_search import executor, search_config


@pytest.fixture(scope="module")
def runner():
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale = 4096, 2048, 0.0001
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 1024, 1024
  return CohortRunner(search_config.make_task(c), cohort_width=1)


def _job(arch, n, trial_ids=None):
  _, hparams = split_config({"model.name": arch.model_name})
  return executor.CohortJob(arch, [hparams] * n, list(range(n)), [0] * n, [2] * n, [None] * n,
                            trial_ids or list(range(n)))


def test_lone_trials_skip_width_measurement(runner):
  auto = CohortRunner(runner.task, cohort_width="auto", data=runner.data, measure_latency=True)
  runners = executor.GroupRunners(auto)
  single = runners.for_group(1)
  assert single.cohort_width == 1 and single.data is runner.data
  assert single.costs is auto.costs and single.costs.measure_latency  # one cost model
  assert runners.for_group(1) is single and runners.for_group(2) is auto
  fixed = executor.GroupRunners(runner)
  assert fixed.for_group(1) is runner


def test_local_executor_runs_jobs_in_order_and_fails_bad_ones(runner):
  lr = split_config({"model.name": "lr"})[0]
  bad = _job(lr, 2)._replace(start_steps=[5, 0])  # past its end step
  with executor.make_executor("local", runner) as local:
    twins = _job(lr, 2)._replace(seeds=[7, 7])  # same seed and hyperparameters: same trial
    out = list(local.map([_job(lr, 1), bad, twins]))
  assert [len(r) for r in out] == [1, 2, 2]
  assert out[0][0].status == TrialStatus.DONE and out[0][0].metrics["steps"] == 2
  assert [r.status for r in out[1]] == [TrialStatus.FAILED] * 2
  assert out[1][0].error == "ValueError: trial 0: step range [5, 2) is invalid"
  assert out[2][0].metrics == {**out[2][1].metrics, "seconds": out[2][0].metrics["seconds"]}
  # Each result names the program call that ran it; a job that raised ran none.
  assert [r.chunk.trials for r in out[0] + out[2]] == [(0,), (0,), (1,)]
  assert out[1][0].chunk is None


def test_unknown_executor_names_the_field(runner):
  with pytest.raises(ValueError, match="study.executor: unknown executor 'ray'"):
    executor.make_executor("ray", runner)


def test_local_executor_runs_submitted_jobs_oldest_first_and_times_them(runner):
  lr = split_config({"model.name": "lr"})[0]
  local = executor.make_executor("local", runner)
  assert local.slots == 1 and local.busy_seconds == 0.0
  with pytest.raises(RuntimeError, match="no job submitted"):
    local.wait_any()
  first, second = local.submit(_job(lr, 1)), local.submit(_job(lr, 2))
  done = [local.wait_any(), local.wait_any()]
  assert [ticket for ticket, _ in done] == [first, second]
  (_, one), (_, two) = done
  assert one.lost is None and two.lost is None and [len(one.results), len(two.results)] == [1, 2]
  assert all(r.status == TrialStatus.DONE for r in one.results + two.results)
  # The executor's busy time is the sum of its jobs' run times (each timed where it ran).
  assert one.seconds > 0 and two.seconds > 0
  assert local.busy_seconds == pytest.approx(one.seconds + two.seconds)
  (mapped,) = list(local.map([_job(lr, 1)]))
  assert mapped[0].metrics["auc"] == one.results[0].metrics["auc"]  # same trial, same result
  assert local.busy_seconds > one.seconds + two.seconds  # map's jobs count too
