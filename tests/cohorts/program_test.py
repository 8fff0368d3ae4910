"""One trial's program: the trainer's step in a scan, frozen once diverged, rewritable hparams."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import task as trial_data
from sfjax.data import feature_pooling
from sfjax.train import step as step_lib

STEPS = 4


@pytest.fixture(scope="module")
def data():
  d = ctr_config.get_config().data
  d.synthetic.num_train, d.synthetic.num_eval, d.synthetic.cardinality_scale = 1024, 512, 1e-4
  task = trial_data.CTRTask(d, batch_size=32, eval_rows=256, eval_batch_size=128)
  return trial_data.TrialData(task)


ARCH, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                 "model.mlp.depth": 1, "model.mlp.width": 8})


def _hparams(**overrides):
  """Every dynamic hyperparameter as a float32 scalar (as one trial of a cohort sees them)."""
  values = arch_lib.resolve_hparams({"embedding.learning_rate": 0.05, "optimizer.learning_rate": 1e-2,
                                     "embedding.l2": 1e-4, "optimizer.weight_decay": 1e-3,
                                     **overrides})
  return {k: jnp.float32(v) for k, v in values.items()}


@pytest.fixture(scope="module")
def graphdef(data):
  return trial_program.abstract_graphdef(ARCH, data.spec)


@pytest.fixture(scope="module")
def resumed_trial(data, graphdef):
  """The jitted resuming trial, shared by the tests: it must compile once for all of them."""
  trial = trial_program._make_trial_fn(ARCH, data.spec, graphdef, resume=True)
  return jax.jit(chex.assert_max_traces(trial, n=1))


def _step(batches, i):
  return jax.tree.map(lambda x: x[i], batches)


@pytest.fixture(scope="module")
def reference_step(graphdef):
  """The trainer's step (`step.make_train_step`) with the trial's optimizers, jitted once with
  traced hyperparameters (no `skip_non_finite`: exactly what the trainer runs)."""

  def step(hparams, state, batch):
    tx, row_opt = trial_program.trial_optimizers(ARCH, hparams)
    return step_lib.make_train_step(graphdef, tx, row_opt,
                                    l2=hparams["embedding.l2"])(state, batch)

  return jax.jit(chex.assert_max_traces(step, n=1))


def _reference(reference_step, hparams, state, batches, num_steps):
  """`num_steps` calls of the trainer's step: (state, losses)."""
  losses = []
  for i in range(num_steps):
    state, metrics = reference_step(hparams, state, _step(batches, i))
    losses.append(metrics["loss"])
  return state, jnp.stack(losses)


def test_scan_equals_calls_of_the_trainer_step(data, graphdef, reference_step):
  hparams = _hparams()
  batches = data.train_steps(0, STEPS)
  trial = jax.jit(trial_program._make_trial_fn(ARCH, data.spec, graphdef, resume=False))
  out = trial(hparams, jnp.int32(5), None, batches, data.eval_batches)
  init = trial_program.init_trial_state(ARCH, data.spec, hparams, jax.random.key(5))
  want_state, want_losses = _reference(reference_step, hparams, init, batches, STEPS)
  assert bool(out.alive) and np.all(np.asarray(out.applied))
  assert int(out.state.step) == STEPS
  chex.assert_trees_all_close(out.losses, want_losses, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(out.state, want_state, rtol=1e-5, atol=1e-6)
  # Trained for real: the touched rows moved.
  assert not np.allclose(np.asarray(out.state.table.values), np.asarray(init.table.values))


def test_resumed_scan_equals_calls_of_the_trainer_step(data, resumed_trial, reference_step):
  hparams = _hparams(**{"optimizer.learning_rate": 3e-3})
  init = trial_program.init_trial_state(ARCH, data.spec, hparams, jax.random.key(1))
  batches = data.train_steps(0, STEPS)
  out = resumed_trial(hparams, jnp.int32(0), init, batches, data.eval_batches)
  want_state, want_losses = _reference(reference_step, hparams, init, batches, STEPS)
  chex.assert_trees_all_close(out.losses, want_losses, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(out.state, want_state, rtol=1e-5, atol=1e-6)


def test_diverging_learning_rate_freezes_the_last_finite_state(data, resumed_trial,
                                                               reference_step):
  hparams = _hparams(**{"embedding.learning_rate": 1e30})
  init = trial_program.init_trial_state(ARCH, data.spec, hparams, jax.random.key(2))
  batches = data.train_steps(0, STEPS)
  out = resumed_trial(hparams, jnp.int32(0), init, batches, data.eval_batches)
  applied = np.asarray(out.applied)
  kept = int(applied.sum())
  assert not bool(out.alive) and kept < STEPS
  np.testing.assert_array_equal(applied, np.arange(STEPS) < kept)  # a prefix, then nothing
  assert int(out.state.step) == kept
  chex.assert_tree_all_finite(out.state)
  want_state, _ = _reference(reference_step, hparams, init, batches, kept)
  chex.assert_trees_all_close(out.state, want_state, rtol=1e-5, atol=1e-6)


def test_no_step_after_a_non_finite_one_even_if_finite(data, graphdef, resumed_trial,
                                                        reference_step):
  hparams = _hparams()
  init = trial_program.init_trial_state(ARCH, data.spec, hparams, jax.random.key(3))
  batches = data.train_steps(0, STEPS)
  labels = np.asarray(batches.labels).copy()
  labels[1, 0] = np.nan  # step 2's loss is NaN; steps 3 and 4 are ordinary
  batches = batches._replace(labels=jnp.asarray(labels))
  out = resumed_trial(hparams, jnp.int32(0), init, batches, data.eval_batches)
  np.testing.assert_array_equal(np.asarray(out.applied), [True, False, False, False])
  assert not bool(out.alive) and int(out.state.step) == 1
  after_one, _ = _reference(reference_step, hparams, init, batches, 1)
  chex.assert_trees_all_close(out.state, after_one, rtol=1e-5, atol=1e-6)
  # Step 3 from that state would have been finite (and applied) in a live trial.
  tx, row_opt = trial_program.trial_optimizers(ARCH, hparams)
  guarded = step_lib.make_train_step(graphdef, tx, row_opt, l2=hparams["embedding.l2"],
                                     skip_non_finite=True)
  _, metrics = jax.jit(guarded)(after_one, _step(batches, 2))
  assert bool(metrics["applied"]) and np.isfinite(float(metrics["loss"]))
  # Eval logits are those of the frozen state.
  chex.assert_trees_all_close(out.logits,
                              trial_program.stacked_eval_logits(graphdef, after_one, data.eval_batches),
                              rtol=1e-5, atol=1e-6)


def test_with_dense_hparams_rewrites_the_injected_values(data):
  state = trial_program.init_trial_state(ARCH, data.spec, _hparams(), jax.random.key(0))
  new = trial_program._with_dense_hparams(
      state, {"optimizer.learning_rate": 0.25, "optimizer.weight_decay": 0.5, "embedding.learning_rate": 9.0})
  injected = new.opt_state.hyperparams
  assert float(injected["learning_rate"]) == 0.25 and float(injected["weight_decay"]) == 0.5
  assert injected["learning_rate"].dtype == jnp.float32
  assert float(state.opt_state.hyperparams["learning_rate"]) == pytest.approx(1e-2)  # unchanged
  assert float(state.opt_state.hyperparams["weight_decay"]) == pytest.approx(1e-3)
  chex.assert_trees_all_equal((new.step, new.params, new.table, new.opt_state.inner_state),
                              (state.step, state.params, state.table, state.opt_state.inner_state))


def test_resume_runs_with_the_new_dense_learning_rate(data, resumed_trial, reference_step):
  init = trial_program.init_trial_state(ARCH, data.spec, _hparams(), jax.random.key(4))
  faster = _hparams(**{"optimizer.learning_rate": 0.1})
  batches = data.train_steps(0, STEPS)
  out = resumed_trial(faster, jnp.int32(0), init, batches, data.eval_batches)
  assert float(out.state.opt_state.hyperparams["learning_rate"]) == pytest.approx(0.1)
  rewritten = trial_program._with_dense_hparams(init, faster)
  want, _ = _reference(reference_step, faster, rewritten, batches, STEPS)
  chex.assert_trees_all_close(out.state.params, want.params, rtol=1e-5, atol=1e-6)


def test_eval_logits_equals_the_trainer_eval_per_batch(data, graphdef):
  state = trial_program.init_trial_state(ARCH, data.spec, _hparams(), jax.random.key(6))
  got = jax.jit(trial_program.stacked_eval_logits, static_argnums=0)(graphdef, state, data.eval_batches)
  chex.assert_shape(got, (2, 128))
  trainer_eval = step_lib.make_eval_step(graphdef)  # the trainer's jitted `step.eval_logits`
  for i in range(2):
    want = trainer_eval(state.params, state.table.values, _step(data.eval_batches, i))
    chex.assert_trees_all_close(got[i], want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # ~20 s: four compilations
def test_traced_bag_poolings_equal_the_trainer_with_those_poolings(layout_data):
  """Issue #22: a bag's pooling as a per-trial code (`features.<bag>.pooling`) trains as the
  trainer's step does on a layout whose bags pool that way: trials of three poolings of the
  mean bag `bag1` and the sqrtn bag `long0`, vmapped as one cohort, each equal to its own
  static-pooling reference."""
  spec = layout_data.spec
  choices = [("sum", "sqrtn"), ("sqrtn", "mean"), ("mean", "sum")]
  batches = layout_data.train_steps(0, STEPS)
  graphdef = trial_program.program_graphdef(ARCH, spec)
  cohort = jax.jit(trial_program.make_cohort_fn(ARCH, spec, graphdef, resume=True))
  stacked = {k: jnp.stack([v] * 3) for k, v in _hparams().items()}
  stacked["features.bag1.pooling"] = jnp.asarray([arch_lib.dynamic_value(
      "features.bag1.pooling", b) for b, _ in choices], jnp.float32)
  stacked["features.long0.pooling"] = jnp.asarray([arch_lib.dynamic_value(
      "features.long0.pooling", c) for _, c in choices], jnp.float32)
  init = trial_program.init_trial_state(ARCH, spec, _hparams(), jax.random.key(3))
  inits = jax.tree.map(lambda x: jnp.stack([x] * 3), init)
  out = cohort(stacked, jnp.zeros(3, jnp.int32), inits, batches, layout_data.eval_batches)
  for i, (bag1, long0) in enumerate(choices):
    static = feature_pooling.with_poolings(spec, {"bag1": bag1, "long0": long0})
    ref_graph = trial_program.abstract_graphdef(ARCH, static)
    tx, row_opt = trial_program.trial_optimizers(ARCH, _hparams())
    step = jax.jit(step_lib.make_train_step(ref_graph, tx, row_opt, l2=_hparams()["embedding.l2"]))
    state, losses = init, []
    for t in range(STEPS):
      state, metrics = step(state, _step(batches, t))
      losses.append(metrics["loss"])
    got = jax.tree.map(lambda x, i=i: x[i], out.state)
    chex.assert_trees_all_close(out.losses[i], jnp.stack(losses), rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(got, state, rtol=1e-4, atol=1e-6)
    logits = trial_program.stacked_eval_logits(ref_graph, state, layout_data.eval_batches)
    chex.assert_trees_all_close(out.logits[i], logits, rtol=1e-4, atol=1e-5)
  assert not np.allclose(out.losses[0], out.losses[1])  # the poolings differ for real
