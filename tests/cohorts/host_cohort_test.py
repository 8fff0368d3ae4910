"""W trials through one host table (issue #26 item 2): a cohort equals its one-lane runs, a
one-lane run equals the device-table trial program, and the shared table moves fewer bytes
per trial than separate runs."""

import copy
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import CohortRunner, cohort_call, host_cohort
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import task as trial_data
from sfjax.embedding import device_table
from sfjax.embedding.host_table import HostTable
from sfjax.embedding.initializers import init_rows

STEPS = 6
SEEDS = (3, 4, 5)
# One lane each: the embedding learning rate and initial scale differ per trial.
HPARAMS = {"embedding.learning_rate": np.asarray([0.05, 0.2, 0.02], np.float32),
           "embedding.init_stddev": np.asarray([0.01, 0.05, 0.1], np.float32),
           "optimizer.learning_rate": np.asarray([1e-2, 3e-3, 3e-2], np.float32)}
ARCH, _ = arch_lib.split_config({"model.name": "wide_deep", "model.embed_dim": 4,
                                 "model.mlp.depth": 1, "model.mlp.width": 8,
                                 "embedding.optimizer": "adagrad"})


@pytest.fixture(scope="module")
def data():
  """A ~34k-row synthetic Criteo task behind a 400-row cache (84x smaller): batch 32, at most
  320 unique rows a step (~280 here), ~900 distinct rows over the steps."""
  d = ctr_config.get_config().data
  d.synthetic.num_train, d.synthetic.num_eval, d.synthetic.cardinality_scale = 4096, 512, 1e-3
  task = trial_data.CTRTask(d, batch_size=32, eval_rows=256, eval_batch_size=128,
                            unique_capacity=320, embedding_backend="cache", cache_rows=400,
                            cache_lookahead=1)
  data = trial_data.TrialData(task)
  assert data.full_rows >= 10 * task.cache_rows
  return data


def _lanes(hparams, lanes):
  return {k: v[lanes] for k, v in hparams.items()}


@pytest.fixture(scope="module")
def cohort(data):
  return host_cohort.run_host_cohort(data, ARCH, HPARAMS, SEEDS, STEPS)


@pytest.fixture(scope="module")
def solo(data):
  return [host_cohort.run_host_cohort(data, ARCH, _lanes(HPARAMS, [w]), [SEEDS[w]], STEPS)
          for w in range(len(SEEDS))]


def _lane_table(run, lane, ids):
  values, slots = run.host_table.gather(ids)
  e, s = ARCH.embedding_width, slots.shape[1] // run.output.losses.shape[0]
  return values[:, lane * e:(lane + 1) * e], slots[:, lane * s:(lane + 1) * s]


@pytest.mark.slow  # ~4 s each on 2 cores (one compile per swap shape and width)
def test_cohort_equals_its_one_lane_runs(cohort, solo):
  out = cohort.output
  assert cohort.stats["evictions"] > 0  # rows went back to the host table and came again
  assert out.alive.all() and out.applied.all() and (out.steps == STEPS).all()
  ids = cohort.host_table.written_ids()
  for w, one in enumerate(solo):
    np.testing.assert_array_equal(one.host_table.written_ids(), ids)
    np.testing.assert_allclose(out.losses[w], one.output.losses[0], rtol=1e-5, atol=1e-6)
    for got, want in zip(_lane_table(cohort, w, ids), _lane_table(one, 0, ids), strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.auc[w], one.output.auc[0], atol=1e-6)
  assert len({round(float(a), 6) for a in out.auc}) == 3  # the lanes are different trials


@pytest.mark.slow  # ~4 s each on 2 cores (one compile per swap shape and width)
def test_one_lane_equals_the_device_table_trial(data, solo):
  """A one-lane cache run is the trial program over a device table holding the same rows."""
  hparams = cohort_call.stacked_hparams(_lanes(HPARAMS, [0]), 1)
  ids = np.arange(data.full_rows)
  values, slots = host_cohort.lane_rows(SEEDS[:1], hparams["embedding.init_stddev"], ids,
                                        ARCH.embedding_width,
                                        host_cohort._slot_rows(ARCH, data.spec))
  state = host_cohort._lane_inits(ARCH, data.spec)(hparams, np.asarray(SEEDS[:1], np.int32))
  state = jax.device_get(state._replace(table=device_table.TableState(
      jnp.asarray(values[None]), jnp.asarray(slots[None]))))
  ref = cohort_call.call_cohort(data, None, ARCH, hparams, SEEDS[:1], 0, STEPS, init_states=state)
  np.testing.assert_allclose(solo[0].output.losses[0], ref.losses[0], rtol=1e-5, atol=1e-6)
  written = solo[0].host_table.written_ids()
  got_values, got_slots = _lane_table(solo[0], 0, written)
  np.testing.assert_allclose(got_values, np.asarray(ref.states.table.values[0])[written],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got_slots, np.asarray(ref.states.table.opt_slots[0])[written],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(solo[0].output.auc, ref.auc, atol=1e-6)


@pytest.mark.slow  # ~4 s each on 2 cores (one compile per swap shape and width)
def test_shared_table_moves_fewer_bytes_per_trial(cohort, solo):
  lanes = len(SEEDS)
  shared = {k: cohort.stats[k] / lanes for k in ("h2d_bytes", "d2h_bytes", "put_bytes")}
  separate = {k: float(np.mean([one.stats[k] for one in solo])) for k in shared}
  # The same rows move (each W lanes wide), so row bytes per trial are equal; the batches,
  # slot indices and padding move once for all lanes.
  assert shared["h2d_bytes"] == separate["h2d_bytes"] > 0
  assert shared["d2h_bytes"] == separate["d2h_bytes"] > 0
  assert shared["put_bytes"] < 0.8 * separate["put_bytes"]
  assert cohort.stats["steps"] == STEPS == solo[0].stats["steps"]  # one plan per step for all


def test_first_touch_writes_each_row_once():
  table = HostTable.create_ram(10, 2 * 3, 2, seed=0, init_stddev=0.0, initial_slot_row=[0.5, 0.5])
  touch = host_cohort.FirstTouch(table, [7, 8], [0.1, 0.2], 3, np.asarray([0.5], np.float32))
  touch.ensure(np.asarray([[2, 5], [-1, 2]]))
  values, slots = table.gather(np.asarray([2, 5]))
  np.testing.assert_array_equal(values[:, :3], init_rows(7, 0, np.asarray([2, 5]), 3, 0.1))
  np.testing.assert_array_equal(values[:, 3:], init_rows(8, 0, np.asarray([2, 5]), 3, 0.2))
  np.testing.assert_array_equal(slots, 0.5)
  table.scatter(np.asarray([2]), np.ones((1, 6), np.float32), np.zeros((1, 2), np.float32))
  touch.ensure(np.asarray([2, 3]))  # row 2 was named before: kept
  np.testing.assert_array_equal(table.gather(np.asarray([2]))[0], 1.0)
  np.testing.assert_array_equal(table.written_ids(), [2, 3, 5])


def test_unsupported_calls_fail_naming_the_setting(data):
  with pytest.raises(ValueError, match="embedding_backend='cache': trials cannot resume"):
    host_cohort.call_host_cohort(data, ARCH, {}, [1], 2, 4)
  with pytest.raises(ValueError, match="share one step range"):
    host_cohort.call_host_cohort(data, ARCH, {}, [1, 2], 0, [2, 4])


def test_too_small_cache_names_the_field(data):
  small = trial_data.TrialData(dataclasses.replace(data.task, cache_rows=100), data.dataset)
  with pytest.raises(ValueError, match="task.cache_rows: a cache of 100 rows is too small"):
    host_cohort.make_planner(small)


def test_task_checks_its_backend(data):
  with pytest.raises(ValueError, match="embedding_backend must be one of"):
    trial_data.CTRTask(data.task.data, embedding_backend="host")
  with pytest.raises(ValueError, match="set compact_rows=False"):
    trial_data.CTRTask(data.task.data, embedding_backend="cache", compact_rows=True, max_steps=4)


@pytest.mark.slow  # ~4 s each on 2 cores (one compile per swap shape and width)
def test_runner_routes_a_cache_task_through_the_host_table(data, cohort):
  runner = CohortRunner(data.task, cohort_width=4, data=data)
  hparams = [{k: float(v[w]) for k, v in HPARAMS.items()} for w in range(len(SEEDS))]
  results = runner.run(ARCH, hparams, list(SEEDS), [0] * 3, STEPS, [None] * 3,
                       merge_optimizers=True)
  assert [r.chunk.lanes for r in results] == [4] * 3 and not results[0].chunk.masked
  np.testing.assert_allclose([r.metrics["auc"] for r in results], cohort.output.auc, atol=1e-6)


@pytest.mark.slow  # ~4 s on 2 cores (compiles)
def test_a_diverging_lane_fails_alone(data):
  """Lanes 0 and 2 are one trial twice; lane 1 diverges (a huge row learning rate) and is
  frozen at its last finite state while its mates train on, exactly alike."""
  arch, _ = arch_lib.split_config({"model.name": "lr", "embedding.optimizer": "sgd"})
  hparams = {"embedding.learning_rate": np.asarray([0.1, 1e38, 0.1], np.float32)}
  run = host_cohort.run_host_cohort(data, arch, hparams, [1, 2, 1], 3)
  out = run.output
  assert out.alive.tolist() == [True, False, True] and out.steps[[0, 2]].tolist() == [3, 3]
  assert out.steps[1] < 3 and not out.applied[1, -1]
  np.testing.assert_array_equal(out.losses[0], out.losses[2])
  ids = run.host_table.written_ids()
  values, _ = run.host_table.gather(ids)  # [N, 3]: one column per lane (E = 1, no slots)
  np.testing.assert_array_equal(values[:, 0], values[:, 2])
  assert np.isfinite(values[:, 1]).all()  # its last finite rows
  assert np.isfinite(out.auc[[0, 2]]).all() and np.isnan(out.auc[1])


@pytest.mark.slow  # ~3 s on 2 cores
def test_a_second_cohort_reruns_exactly_without_recompiling(data, cohort):
  step = host_cohort.cohort_cache_step(ARCH, data.spec, len(SEEDS), data.task.compiler_options)
  compiled = step._cache_size()
  again = host_cohort.run_host_cohort(data, ARCH, HPARAMS, SEEDS, STEPS)
  assert step._cache_size() == compiled  # one program per swap shape, compiled once
  np.testing.assert_array_equal(again.output.losses, cohort.output.losses)
  np.testing.assert_array_equal(again.output.auc, cohort.output.auc)


@pytest.mark.slow  # ~3 s on 2 cores
def test_the_step_computes_its_dots_as_the_tasks_xla_cpu_dots_says(data, cohort, monkeypatch):
  monkeypatch.setattr(trial_data.jax, "default_backend", lambda: "cpu")
  runs = {}
  for choice in ("eigen", "xla"):
    task_data = copy.copy(data)  # the same data, another task setting
    task_data.task = dataclasses.replace(data.task, xla_cpu_dots=choice)
    runs[choice] = host_cohort.run_host_cohort(task_data, ARCH, HPARAMS, SEEDS, STEPS).output
    options = task_data.task.compiler_options
    step = host_cohort.cohort_cache_step(ARCH, data.spec, len(SEEDS), options)
    assert step._cache_size() > 0, choice  # the task's options compiled the step that ran
  np.testing.assert_allclose(runs["eigen"].losses, runs["xla"].losses, rtol=1e-5)
  np.testing.assert_allclose(runs["xla"].losses, cohort.output.losses, rtol=1e-5)
