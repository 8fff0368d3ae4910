"""Structure-search training through the shared step: parameter groups, a frozen group, the
optimizer switch, windows equal one run, evaluation mode and split metrics."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import task as task_lib
from sfjax.core import feature_layout as fl
from sfjax.core import metrics as metrics_lib
from sfjax.data import types
from sfjax.embedding import row_optimizers
from sfjax.models import registry
from sfjax.structure import gate_training as st


@pytest.fixture(scope="module")
def data():
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale, d.synthetic.num_eval = 1e-4, 2048
  task = task_lib.CTRTask(d, batch_size=64, eval_rows=1000, eval_batch_size=512)
  return task_lib.TrialData(task)


def _gated(data, **kw):
  return registry.build_model("gated_fm", num_fields=data.spec.num_fields, embed_dim=2,
                              num_dense=data.spec.num_dense, rngs=nnx.Rngs(0),
                              pairs=((0, 1), (2, 3), (1, 4)), **kw)


def _key_data(tree):
  """`tree` with PRNG keys as their integer data (chex compares numbers)."""
  def is_key(x):
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)

  return jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, tree)


def _first_batch(data):
  return jax.tree.map(lambda x: x[0:1], data.train_steps(0, 1))


def test_a_frozen_group_stays_and_the_others_move(data):
  model = _gated(data, gate_init=0.5)
  tx = st.group_optimizer({"net": optax.sgd(0.1), "gates": None}, default="net")
  state = st.init_state(model, tx, row_optimizers.sgd(0.1), data.num_rows, seed=0,
                        init_stddev=0.1)
  before = np.asarray(state.table.values)  # the runner donates the state
  new, losses = st.make_runner(nnx.graphdef(model), tx, row_optimizers.sgd(0.1))(
      state, _first_batch(data))
  assert int(new.step) == 1 and losses.shape == (1,) and np.isfinite(losses[0])
  chex.assert_trees_all_equal(new.params["gates"][...], jnp.full(3, 0.5))
  assert float(new.params["bias"][...]) != 0.0
  # The BN moments (not parameters) were written back from the forward.
  assert not np.allclose(np.asarray(new.params["pair_norm"]["mean"][...]), 0.0)
  batch = jax.tree.map(lambda x: x[0], _first_batch(data))
  touched = np.asarray(batch.rows)[np.asarray(batch.rows) < data.num_rows]
  changed = np.flatnonzero(np.any(np.asarray(new.table.values) != before, axis=1))
  np.testing.assert_array_equal(changed, np.sort(touched))  # only the batch's rows, all of them


def test_groups_take_their_own_optimizer(data):
  model = _gated(data, pair_norm=False)
  params = nnx.state(model, nnx.Param)
  tx = st.group_optimizer({"net": optax.sgd(0.0), "gates": optax.sgd(1.0)}, default="net")
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  chex.assert_trees_all_equal(updates["gates"][...], -jnp.ones(3))
  chex.assert_trees_all_equal(updates["bias"][...], jnp.zeros(()))
  with pytest.raises(ValueError, match="default group 'other' is not one of"):
    st.group_optimizer({"net": optax.sgd(0.1)}, default="other")


def test_groups_behind_a_feature_layout_are_the_inner_models():
  """With a layout (issue #22) the model sits in `PooledInput`: `['inner']['gates']` is in
  group 'gates', and the table width is the inner model's."""
  layout = fl.FeatureLayout((fl.TableSpec("a", 5), fl.TableSpec("b", 4)),
                            (fl.FeatureSpec("a", "a"), fl.FeatureSpec("tags", "b", "multi_hot", 3)))
  spec = types.DatasetSpec((types.FieldSpec("a", 5), types.FieldSpec("tags", 4)), 0, layout)
  inner = registry.build_model("gated_fm", num_fields=2, embed_dim=2, num_dense=0,
                               rngs=nnx.Rngs(0), pairs=((0, 1),), pair_norm=False)
  model = st.with_layout(inner, spec)
  assert st.unwrap(model) is inner and st.with_layout(inner, types.DatasetSpec((), 0)) is inner
  params = nnx.state(model, nnx.Param)
  tx = st.group_optimizer({"net": optax.sgd(0.0), "gates": optax.sgd(1.0)}, default="net")
  updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
  chex.assert_trees_all_equal(updates["inner"]["gates"][...], -jnp.ones(1))
  chex.assert_trees_all_equal(updates["inner"]["bias"][...], jnp.zeros(()))
  state = st.init_state(model, tx, row_optimizers.sgd(0.1), 9, seed=0, init_stddev=0.1)
  assert state.table.values.shape == (9, inner.embedding_width(2))


def test_keep_group_states_carries_one_group_over():
  params = {"net": jnp.ones(2), "gates": jnp.ones(3)}
  adam = st.group_optimizer({"net": optax.adam(0.1), "gates": None}, default="net")
  state = adam.init(params)
  _, state = adam.update(jax.tree.map(jnp.ones_like, params), state, params)
  switched = st.group_optimizer({"net": optax.adam(0.1), "gates": optax.sgd(0.1)}, default="net")
  fresh = switched.init(params)
  kept = st.keep_group_states(fresh, state, ("net",))
  chex.assert_trees_all_equal(kept.inner_states["net"], state.inner_states["net"])
  chex.assert_trees_all_equal(kept.inner_states["gates"], fresh.inner_states["gates"])
  assert int(kept.inner_states["net"].inner_state[0].count) == 1  # Adam's step 1 carried over


def _group_model(data):
  """AutoGroup's model (an MLP over sampled groups) with its optimizers: (model, tx, rows')."""
  model = registry.build_model("group_interactions", num_fields=data.spec.num_fields,
                               embed_dim=2, num_dense=data.spec.num_dense, rngs=nnx.Rngs(0),
                               max_order=2, num_groups=2, mlp_dims=(4,))
  tx = st.group_optimizer({"net": optax.adam(0.01), "structure": optax.adam(0.05)},
                          default="net")
  return model, tx, row_optimizers.adam(0.01)


def test_windows_equal_one_run_and_no_recompile(data):
  # AutoGroup's model draws its Gumbel noise from its own counter: windows must not replay it.
  model, tx, adam = _group_model(data)
  runner = st.make_runner(nnx.graphdef(model), tx, adam)

  def fresh():
    return st.init_state(model, tx, adam, data.num_rows, seed=0, init_stddev=0.1)

  one, losses_one = st.train(fresh(), data, runner, 0, 12, window=12)
  split, losses_split = st.train(fresh(), data, runner, 0, 12, window=4)
  chex.assert_trees_all_close(_key_data(one), _key_data(split), atol=1e-6)
  np.testing.assert_allclose(losses_one, losses_split, rtol=1e-6)
  assert losses_one.shape == (12,)
  assert int(one.params["rngs"]["gumbel"]["count"][...]) == 12  # one draw per order and step
  assert runner._cache_size() == 2  # window lengths 12 and 4, nothing else


def test_the_runner_compiles_with_the_options_it_is_given(data):
  model, tx, adam = _group_model(data)
  losses = {}
  for options in ((("xla_cpu_experimental_ynn_fusion_type", ""),), ()):
    runner = st.make_runner(nnx.graphdef(model), tx, adam, options)
    state = st.init_state(model, tx, adam, data.num_rows, seed=0, init_stddev=0.1)
    if options:
      text = runner.lower(state, data.train_steps(0, 4)).compile().as_text()
      assert "dot(" in text and "__ynn_fusion" not in text  # Eigen: XLA's own dot thunks
    losses[options] = st.train(state, data, runner, 0, 4)[1]
  np.testing.assert_allclose(*losses.values(), rtol=1e-5)  # float rounding only


def test_eval_graph_reads_running_moments_and_split_metrics(data):
  model = _gated(data, bn_momentum=0.5)
  graphdef, params = nnx.split(model)
  eval_graphdef = st.eval_graphdef(graphdef, params)
  assert eval_graphdef != graphdef
  assert nnx.merge(eval_graphdef, params).pair_norm.use_running_average
  assert not nnx.merge(graphdef, params).pair_norm.use_running_average
  tx = st.group_optimizer({"net": optax.sgd(0.1), "gates": None}, default="net")
  state = st.init_state(model, tx, row_optimizers.sgd(0.1), data.num_rows, seed=0,
                        init_stddev=0.1)
  logits = st.host_eval_logits(eval_graphdef, state, data)
  assert logits.shape == data.eval_labels.shape
  # Running moments (0, 1) at init: the eval forward is the plain gated FM.
  plain = registry.build_model("gated_fm", num_fields=data.spec.num_fields, embed_dim=2,
                               num_dense=data.spec.num_dense, rngs=nnx.Rngs(0),
                               pairs=((0, 1), (2, 3), (1, 4)), pair_norm=False)
  plain_graphdef, plain_params = nnx.split(plain)
  plain_state = state._replace(params=plain_params)
  np.testing.assert_allclose(logits, st.host_eval_logits(plain_graphdef, plain_state, data),
                             rtol=1e-4, atol=1e-4)
  out = st.split_metrics(data, logits)
  real = np.flatnonzero(data.eval_mask > 0)
  first, second = real[:500], real[500:]
  np.testing.assert_allclose(out["valid_auc"], metrics_lib.auc(data.eval_labels[first],
                                                               logits[first]))
  np.testing.assert_allclose(out["test_auc"], metrics_lib.auc(data.eval_labels[second],
                                                              logits[second]))


def test_checks_name_the_field():
  with pytest.raises(ValueError, match="AutoX.embed_dim must be an integer >= 1"):
    st.check_int("AutoX", "embed_dim", 0, 1)
  with pytest.raises(ValueError, match="AutoX.lr must be a finite number > 0"):
    st.check_float("AutoX", "lr", float("nan"), 0.0, False)
