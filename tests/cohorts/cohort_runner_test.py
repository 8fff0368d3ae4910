"""Vmapped cohorts: equal to one-by-one runs, NaN isolation, resume, sharding, no recompiles,
the plan that ran ('auto' width, padding) and the runner's cost model."""

import dataclasses

import chex
import jax
import numpy as np
import pytest

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import chunk_plan, cohort_call
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import task as trial_data
from sfjax.cohorts.costs import TrialCosts
from tests.cohorts.conftest import CallRecorder

STEPS = 12  # the shared `data` fixture's steps per budget unit (conftest.py)


@pytest.fixture(scope="module")
def arch():
  return arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4, "model.mlp.depth": 1,
                                "model.mlp.width": 16})[0]


@pytest.fixture(scope="module")
def runner4(data):
  return cohort.CohortRunner(data.task, cohort_width=4, data=data)


@pytest.fixture(scope="module")
def runner1(data):
  return cohort.CohortRunner(data.task, cohort_width=1, data=data)


HPARAMS = [
    {"embedding.learning_rate": 0.01, "optimizer.learning_rate": 1e-3},
    {"embedding.learning_rate": 0.03, "optimizer.learning_rate": 3e-3, "embedding.l2": 1e-4},
    {"embedding.learning_rate": 0.005, "optimizer.weight_decay": 1e-3, "embedding.init_stddev": 0.05},
    {"embedding.learning_rate": 0.02, "optimizer.learning_rate": 1e-2},
]
SEEDS = [0, 1, 2, 3]


def _fresh(runner, arch, hparams=HPARAMS, seeds=SEEDS, end=STEPS):
  n = len(hparams)
  return runner.run(arch, hparams, seeds, [0] * n, end, [None] * n)


def _assert_results_close(a, b, exact=False, keys=("auc", "logloss", "train_loss")):
  for x, y in zip(a, b, strict=True):
    assert x.status == y.status == "done"
    assert x.metrics["steps"] == y.metrics["steps"]
    for key in keys:
      assert x.metrics[key] == y.metrics[key] if exact else abs(x.metrics[key] - y.metrics[key]) < 1e-5
    if exact:
      chex.assert_trees_all_equal(x.state, y.state)
    else:
      chex.assert_trees_all_close(x.state, y.state, atol=1e-5, rtol=1e-4)


def test_cohort_equals_trials_run_one_by_one(data, arch, runner4, runner1):
  together = _fresh(runner4, arch)
  alone = _fresh(runner1, arch)
  _assert_results_close(together, alone)
  aucs = [r.metrics["auc"] for r in together]
  assert all(0.3 < a < 1.0 for a in aucs) and len(set(aucs)) == 4  # distinct trials really trained
  assert together[0].metrics["params"] == arch_lib.count_params(arch, data.spec)
  assert together[0].state.table.values.shape == (data.num_rows, arch.embedding_width)


def test_non_finite_trial_is_masked_and_mates_are_untouched(arch, runner4):
  bad = dict(HPARAMS[2], **{"embedding.learning_rate": 1e30})
  with_bad = _fresh(runner4, arch, HPARAMS[:2] + [bad] + HPARAMS[3:])
  reference = _fresh(runner4, arch)
  failed = with_bad[2]
  assert failed.status == "failed" and failed.state is None and "non-finite" in failed.error
  assert np.isnan(failed.metrics["auc"]) and failed.metrics["steps"] < STEPS
  _assert_results_close([with_bad[i] for i in (0, 1, 3)], [reference[i] for i in (0, 1, 3)], exact=True)


def test_resume_continues_exactly(arch, runner4):
  straight = _fresh(runner4, arch, end=2 * STEPS)
  first = _fresh(runner4, arch)
  kept = jax.tree.map(np.copy, first[0].state)
  # A changed dense learning rate on resume must reach the optax state (PBT's explore).
  second = runner4.run(arch, HPARAMS, SEEDS, [STEPS] * 4, [2 * STEPS] * 4, [r.state for r in first])
  _assert_results_close(second, straight, keys=("auc", "logloss"))  # train_loss: this run's steps
  assert all(r.metrics["steps"] == 2 * STEPS for r in second)
  changed = [dict(h, **{"optimizer.learning_rate": 0.5}) for h in HPARAMS]
  moved = runner4.run(arch, changed, SEEDS, [STEPS] * 4, 2 * STEPS, [r.state for r in first])
  assert float(moved[0].state.opt_state.hyperparams["learning_rate"]) == 0.5
  assert moved[0].metrics["auc"] != second[0].metrics["auc"]
  chex.assert_trees_all_equal(first[0].state, kept)  # resuming (donation) left the caller's state intact


def test_repeated_runs_do_not_recompile(arch, runner4):
  # Warm-up: one fresh and one resumed run compile the two programs (fresh init, resume
  # from host states); the test must not depend on other tests having compiled them.
  before = cohort_call._num_traces()
  first = _fresh(runner4, arch)
  runner4.run(arch, HPARAMS, SEEDS, [STEPS] * 4, 2 * STEPS, [r.state for r in first])
  traces = cohort_call._num_traces()
  assert traces >= before  # the counter only grows
  _fresh(runner4, arch, seeds=[7, 8, 9, 10])
  _fresh(runner4, arch, hparams=HPARAMS[:3], seeds=[4, 5, 6])  # partial chunk padded to width 4
  later = runner4.run(arch, HPARAMS, SEEDS, [STEPS] * 4, 2 * STEPS, [r.state for r in first])
  runner4.run(arch, HPARAMS, SEEDS, [2 * STEPS] * 4, 3 * STEPS, [r.state for r in later])  # new start
  assert cohort_call._num_traces() == traces


def test_trial_axis_sharded_over_eight_devices(data, arch, runner4):
  hparams = HPARAMS + [dict(h, **{"embedding.learning_rate": 0.04}) for h in HPARAMS]
  sharded = cohort.CohortRunner(data.task, cohort_width=8, mesh=cohort_call.trial_mesh(8),
                                data=data)
  out = sharded.run_stacked(arch, cohort_call.stack_hparams(hparams), np.arange(8), 0, STEPS)
  values = out.states.table.values  # [8, V, E]
  assert len(values.sharding.device_set) == 8
  assert all(s.data.shape[0] == 1 for s in values.addressable_shards)  # one trial per device
  reference = _fresh(runner4, arch)  # the first four trials, unsharded, width 4
  np.testing.assert_allclose(out.auc[:4], [r.metrics["auc"] for r in reference], atol=1e-5)
  for i, r in enumerate(reference):
    chex.assert_trees_all_close(jax.tree.map(lambda x, i=i: np.asarray(x[i]), out.states), r.state,
                                atol=1e-5, rtol=1e-4)


def test_auto_width_picks_the_best_measured(data, arch):
  runner = cohort.CohortRunner(data.task, cohort_width="auto", width_candidates=(1, 4), data=data)
  width = runner.width_for(arch)
  rates = runner.measure_widths(arch, (1, 4))  # cached: no second measurement
  assert set(rates) == {1, 4} and all(r > 0 for r in rates.values())
  assert width == max(rates, key=rates.get)


def test_bad_arguments_are_named(arch, runner4, data):
  with pytest.raises(ValueError, match="seeds"):
    runner4.run(arch, HPARAMS, SEEDS[:3], [0] * 4, STEPS, [None] * 4)
  with pytest.raises(ValueError, match="start_steps=5"):
    runner4.run(arch, HPARAMS[:1], [0], [5], STEPS, [None])
  with pytest.raises(ValueError, match="embedding.learning_rate"):
    runner4.run(arch, [{"embedding.learning_rate": -1.0}], [0], [0], STEPS, [None])
  with pytest.raises(ValueError, match="cohort_width"):
    cohort.CohortRunner(data.task, cohort_width=0, data=data)
  with pytest.raises(ValueError, match="CTRTask.batch_size"):
    trial_data.CTRTask(data.task.data, batch_size=0)


def test_trials_report_their_architectures_cost_metrics(data, arch):
  runner = cohort.CohortRunner(data.task, cohort_width=1, data=data, measure_latency=True)
  assert isinstance(runner.costs, TrialCosts) and runner.costs.measure_latency
  costs = runner.costs.cost_metrics(arch)
  result = runner.run(arch, HPARAMS[:1], SEEDS[:1], [0], 2, [None])[0]
  assert result.metrics["latency_ms"] == costs["latency_ms"] > 0
  assert result.metrics["flops"] == costs["flops"] and result.metrics["params"] == costs["params"]


def test_runners_can_share_one_cost_model(data, arch):
  costs = TrialCosts(data.spec, data)
  a = cohort.CohortRunner(data.task, cohort_width=1, data=data, costs=costs)
  b = cohort.CohortRunner(data.task, cohort_width=4, data=data, costs=costs, measure_latency=True)
  assert a.costs is b.costs is costs and costs.measure_latency  # switched on for both
  other_spec = dataclasses.replace(data.spec, num_dense=data.spec.num_dense + 1)
  with pytest.raises(ValueError, match="costs was built for a different data set spec"):
    cohort.CohortRunner(data.task, data=data, costs=TrialCosts(other_spec, data))


def test_auto_width_results_name_the_chunks_that_ran(data, arch):
  # One candidate width: 'auto' measures it (timing decides nothing) and picks 4 for a
  # group of 7 trials: a chunk of 4 and one of 3 padded to 4 lanes.
  runner = CallRecorder(data.task, cohort_width="auto", width_candidates=(4,), data=data)
  hparams, seeds = HPARAMS + HPARAMS[:3], list(range(10, 17))
  results = _fresh(runner, arch, hparams, seeds)
  assert all(r.status == "done" for r in results)
  ran = list(dict.fromkeys(r.chunk for r in results))
  assert [(c.trials, c.width, c.lanes) for c in ran] == [((0, 1, 2, 3), 4, 4), ((4, 5, 6), 4, 4)]
  # What ran, counted apart from the plan: two calls of 4 lanes, the padding lane
  # repeating the chunk's first trial.
  assert runner.calls == [(4, STEPS, seeds[:4]), (4, STEPS, seeds[4:] + seeds[4:5])]
  assert [(c.lanes, c.num_steps, [seeds[i] for i in c.lane_trials]) for c in ran] == runner.calls
  summary = chunk_plan.program_summary(ran)
  assert summary["mean_cohort_width"] == len(results) / len(runner.calls) == 3.5
  assert summary["lane_utilization"] == len(results) * STEPS / sum(
      lanes * steps for lanes, steps, _ in runner.calls) == 7 / 8
  # The plan the runner reports beforehand is the one it ran.
  assert runner.plan([arch] * 7, [0] * 7, [STEPS] * 7, [False] * 7) == tuple(ran)


def test_compact_rows_train_the_same_trial_as_the_full_table(data, arch):
  tasks = [trial_data.CTRTask(data.task.data, batch_size=128, eval_rows=1500,
                              steps_per_budget_unit=STEPS, eval_batch_size=512, max_steps=STEPS,
                              compact_rows=compact) for compact in (False, True)]
  full, compact = [trial_data.TrialData(t, data.dataset) for t in tasks]
  hparams = HPARAMS[1]
  init = jax.device_get(trial_program.init_trial_state(
      arch, data.spec, arch_lib.resolve_hparams(hparams), jax.random.key(5)))
  ids = compact.row_ids
  compact_init = init._replace(table=jax.tree.map(lambda x: x[ids], init.table))
  a = cohort.CohortRunner(full.task, cohort_width=1, data=full).run(
      arch, [hparams], [5], [0], STEPS, [init])[0]
  b = cohort.CohortRunner(compact.task, cohort_width=1, data=compact).run(
      arch, [hparams], [5], [0], STEPS, [compact_init])[0]
  for key in ("auc", "logloss", "train_loss", "test_auc", "steps"):
    assert abs(a.metrics[key] - b.metrics[key]) < 1e-5, key
  assert b.state.table.values.shape[0] == compact.num_rows < full.num_rows
  chex.assert_trees_all_close(b.state.table, jax.tree.map(lambda x: x[ids], a.state.table),
                              atol=1e-6)
  chex.assert_trees_all_close(b.state.params, a.state.params, atol=1e-6)
  untouched = np.setdiff1d(np.arange(full.num_rows), ids)
  np.testing.assert_array_equal(a.state.table.values[untouched], init.table.values[untouched])


@pytest.mark.slow  # ~15 s: three compilations
def test_layout_trials_of_one_bucket_equal_their_solo_runs(layout_data):
  """Bags and sequences (issue #22): fm trials of two embedding dims share one padded
  program (the superset's layout rules see the pooled fields, the model sits behind
  `PooledInput`) and each equals its own run at width 1."""
  configs = [{"model.name": "fm", "model.embed_dim": 4}, {"model.name": "fm", "model.embed_dim": 8}]
  archs = [arch_lib.split_config(c)[0] for c in configs]
  hparams = [{"embedding.learning_rate": 0.1}, {"embedding.learning_rate": 0.05}]
  together = CallRecorder(layout_data.task, cohort_width=2, data=layout_data)
  solo = CallRecorder(layout_data.task, cohort_width=1, data=layout_data)
  got = together.run(archs, hparams, [0, 1], [0] * 2, 6, [None] * 2)
  want = solo.run(archs, hparams, [0, 1], [0] * 2, 6, [None] * 2)
  assert [c[0] for c in together.calls] == [2] and got[0].chunk.masked
  assert [c[0] for c in solo.calls] == [1, 1]
  _assert_results_close(got, want)
  assert got[0].metrics["params"] < got[1].metrics["params"]


@pytest.mark.slow  # ~15 s: three compilations
def test_din_trials_share_a_program_and_equal_their_solo_runs(layout_data):
  """DIN as a cohort family (issue #22): trials attending over the layout's history,
  differing in their rates, run as one vmapped program; each equals its own run."""
  config = {"model.name": "din", "model.embed_dim": 4, "model.mlp.depth": 1,
            "model.mlp.width": 16, "model.din_attention.depth": 1,
            "model.din_attention.width": 8}
  arch = arch_lib.split_config(config)[0]
  assert dict(arch.model_hparams)["din_attention_dims"] == (8,)
  hparams = [{"embedding.learning_rate": 0.1}, {"embedding.learning_rate": 0.02}]
  together = CallRecorder(layout_data.task, cohort_width=2, data=layout_data)
  solo = CallRecorder(layout_data.task, cohort_width=1, data=layout_data)
  got = together.run([arch] * 2, hparams, [0, 1], [0] * 2, 6, [None] * 2)
  want = solo.run([arch] * 2, hparams, [0, 1], [0] * 2, 6, [None] * 2)
  assert [c[0] for c in together.calls] == [2] and [c[0] for c in solo.calls] == [1, 1]
  _assert_results_close(got, want)
  assert got[0].metrics["auc"] != got[1].metrics["auc"]
