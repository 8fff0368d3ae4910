"""The structure-search trainer: phases update only their groups, windows equal one run."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import task as trial_data
from sfjax.core import metrics as metrics_lib
from sfjax.embedding import row_optimizers
from sfjax.structure import gate_training as st


@pytest.fixture(scope="module")
def data():
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale, d.synthetic.num_eval = 1e-4, 2048
  task = trial_data.CTRTask(d, batch_size=64, eval_rows=1000, eval_batch_size=512)
  return trial_data.TrialData(task)


def lr_forward(params, stats, emb, dense, mask, key, train):
  """First-order model with a 'scale' group and a running count of training calls in stats."""
  del mask, key
  logits = params["net"]["bias"] + params["scale"] * emb[..., -1].sum(axis=1) + dense @ params["net"]["w"]
  return logits, stats + (1 if train else 0)


def _state(data, optimizers, row_opt):
  params = {"net": {"bias": jnp.zeros(()), "w": jnp.zeros((data.spec.num_dense,))}, "scale": jnp.ones(())}
  return st.init_state(params, jnp.zeros((), jnp.int32), optimizers, row_opt, data.num_rows, 3, seed=0,
                       init_stddev=0.1)


def test_phases_update_only_their_groups(data):
  sgd = row_optimizers.sgd(0.1)
  optimizers = {"net": optax.sgd(0.1), "scale": optax.sgd(0.1)}
  state = _state(data, optimizers, sgd)
  batch = jax.tree.map(lambda x: x[0], data.train_steps(0, 1))
  step = jax.jit(st.make_train_step(lr_forward, optimizers, sgd, [st.Phase(("scale",), False)]))
  new, loss = step(state, batch, jax.random.key(0))
  assert int(new.step) == 1 and int(new.stats) == 1 and np.isfinite(float(loss))
  chex.assert_trees_all_equal(new.params["net"], state.params["net"])
  chex.assert_trees_all_equal(new.table, state.table)
  assert float(new.params["scale"]) != 1.0
  # Two phases: both groups and the rows move; the stats see two training forwards.
  step2 = jax.jit(st.make_train_step(lr_forward, optimizers, sgd,
                                     [st.Phase(("scale",), False), st.Phase(("net",), True)]))
  new2, _ = step2(_state(data, optimizers, sgd), batch, jax.random.key(0))
  assert int(new2.stats) == 2 and int(new2.step) == 1
  assert float(new2.params["net"]["bias"]) != 0.0
  touched = np.asarray(batch.rows)[np.asarray(batch.rows) < data.num_rows]
  changed = np.flatnonzero(np.any(np.asarray(new2.table.values) != np.asarray(state.table.values), axis=1))
  np.testing.assert_array_equal(changed, np.sort(touched))  # only the batch's rows, all of them


def test_the_row_gradient_is_the_logistic_gradient_by_hand(data):
  sgd = row_optimizers.sgd(1.0)
  optimizers = {"net": optax.sgd(0.0)}
  state = _state(data, optimizers, sgd)
  batch = jax.tree.map(lambda x: x[0], data.train_steps(0, 1))
  step = jax.jit(st.make_train_step(lr_forward, optimizers, sgd, [st.Phase(("net",), True)]))
  new, _ = step(state, batch, jax.random.key(0))
  values = np.asarray(state.table.values)
  rows, vids = np.asarray(batch.rows), np.asarray(batch.vids)
  logits = values[rows[vids], -1].sum(axis=1)  # bias 0, w 0, scale 1
  residual = (metrics_lib.sigmoid(logits) - np.asarray(batch.labels)) / vids.shape[0]  # d mean loss / d logit
  grad = np.zeros(values.shape[0])
  np.add.at(grad, rows[vids].reshape(-1), np.repeat(residual, vids.shape[1]))
  np.testing.assert_allclose(np.asarray(new.table.values)[:, -1], values[:, -1] - grad, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(new.table.values)[:, :-1], values[:, :-1])


def test_windows_equal_one_run_and_no_recompile(data):
  adam = row_optimizers.adam(0.01)
  optimizers = {"net": optax.adam(0.01), "scale": optax.adam(0.01)}
  runner = st.make_runner(st.make_train_step(lr_forward, optimizers, adam, [st.Phase(("net", "scale"), True)]))
  key = jax.random.key(3)
  one, losses_one = st.train(_state(data, optimizers, adam), data, runner, key, 0, 12, window=12)
  split, losses_split = st.train(_state(data, optimizers, adam), data, runner, key, 0, 12, window=4)
  chex.assert_trees_all_close(one, split, atol=1e-6)
  np.testing.assert_allclose(losses_one, losses_split, rtol=1e-6)
  assert losses_one.shape == (12,)
  assert runner._cache_size() == 2  # window lengths 12 and 4, nothing else


def test_eval_and_split_metrics(data):
  optimizers = {"net": optax.sgd(0.1)}
  state = _state(data, optimizers, row_optimizers.sgd(0.1))
  logits = st.eval_logits(lr_forward, state, data)
  assert logits.shape == data.eval_labels.shape
  out = st.split_metrics(data, logits)
  real = np.flatnonzero(data.eval_mask > 0)
  first, second = real[:500], real[500:]
  np.testing.assert_allclose(out["valid_auc"], metrics_lib.auc(data.eval_labels[first], logits[first]))
  np.testing.assert_allclose(out["test_auc"], metrics_lib.auc(data.eval_labels[second], logits[second]))


def test_mlp_by_hand():
  layers = [{"w": jnp.array([[1.0, -1.0]]), "b": jnp.array([0.0, 0.5])},
            {"w": jnp.array([[2.0], [3.0]]), "b": jnp.array([1.0])}]
  x = jnp.array([[2.0], [-1.0]])
  # relu([2, -1.5]) = [2, 0] -> 4 + 1 = 5; relu([-1, 1.5]) = [0, 1.5] -> 4.5 + 1 = 5.5
  chex.assert_trees_all_close(st.mlp_apply(layers, x), jnp.array([[5.0], [5.5]]))
  init = st.mlp_init(jax.random.key(0), (4, 3, 1))
  assert [l["w"].shape for l in init] == [(4, 3), (3, 1)]


def test_bad_wiring_is_refused(data):
  sgd = row_optimizers.sgd(0.1)
  with pytest.raises(ValueError, match="unknown parameter groups"):
    st.init_state({"net": jnp.zeros(())}, (), {"gates": optax.sgd(0.1)}, sgd, 4, 2, seed=0, init_stddev=0.1)
  with pytest.raises(ValueError, match="without an optimizer"):
    st.make_train_step(lr_forward, {"net": optax.sgd(0.1)}, sgd, [st.Phase(("scale",), False)])
  with pytest.raises(ValueError, match="AutoX.embed_dim"):
    st.check_int("AutoX", "embed_dim", 0, 1)
