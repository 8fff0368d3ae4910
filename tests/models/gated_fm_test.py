"""AutoFIS's gated FM: pairs, the gated layer by hand with and without BN, eval mode, the
train step writing the BN moments back."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from sfjax.embedding import device_table, row_optimizers
from sfjax.models import gated_fm, registry
from sfjax.train import step as step_lib
from sfjax.train.state import DeviceBatch, TrainState

# F = 3, D = 1 (+ first-order column), B = 2; gates on (0,1), (0,2), (1,2).
EMB = np.array([[[1.0, 0.1], [2.0, 0.2], [-1.0, 0.3]],
                [[3.0, 0.0], [0.0, 0.0], [1.0, -0.5]]], np.float32)  # [B, F, D+1]
PRODUCTS = np.array([[2.0, -1.0, -2.0], [0.0, 3.0, 0.0]])  # <e_i, e_j>
FIRST = np.array([0.6, -0.5])
GATES = np.array([1.0, 0.0, -2.0], np.float32)


def _model(**kw):
  model = registry.build_model("gated_fm", num_fields=3, embed_dim=1, num_dense=1,
                               rngs=nnx.Rngs(0), **kw)
  model.gates[...] = jnp.asarray(GATES)
  model.bias[...] = jnp.asarray(0.5)
  return model


def test_pairs_and_inner_products_by_hand():
  assert gated_fm.all_field_pairs(3) == ((0, 1), (0, 2), (1, 2))
  v = jnp.array([[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]])  # [B=1, F=3, D=2]
  chex.assert_trees_all_close(gated_fm._pair_inner_products(v, np.array(gated_fm.all_field_pairs(3))),
                              jnp.array([[1.0, 1.5, 1.0]]))
  assert gated_fm.check_pairs([[0, 2], (1, 2)], 3) == ((0, 2), (1, 2))
  with pytest.raises(ValueError, match=r"model.pairs: every pair must be \(i, j\) with 0 <= i < j < 3"):
    gated_fm.check_pairs([(2, 1)], 3)


def test_the_gated_layer_by_hand_without_bn():
  model = _model(pair_norm=False)
  assert model.pair_norm is None
  logits = model(jnp.asarray(EMB), jnp.ones((2, 1)))  # dense weights start at 0
  chex.assert_trees_all_close(logits, jnp.asarray(0.5 + FIRST + PRODUCTS @ GATES))


def test_the_gated_layer_by_hand_with_bn_and_its_running_moments():
  model = _model(bn_momentum=0.9)
  logits = model(jnp.asarray(EMB), jnp.zeros((2, 1)))  # train mode: batch moments
  normed = (PRODUCTS - PRODUCTS.mean(0)) / np.sqrt(PRODUCTS.var(0) + gated_fm._BN_EPS)
  chex.assert_trees_all_close(logits, jnp.asarray(0.5 + FIRST + normed @ GATES), atol=1e-5)
  mean, var = model.pair_norm.mean[...], model.pair_norm.var[...]
  chex.assert_trees_all_close(mean, jnp.asarray(0.1 * PRODUCTS.mean(0)), atol=1e-6)
  chex.assert_trees_all_close(var, jnp.asarray(0.9 + 0.1 * PRODUCTS.var(0)), atol=1e-6)
  model.eval()  # running moments, nothing updated
  logits = model(jnp.asarray(EMB), jnp.zeros((2, 1)))
  running = (PRODUCTS - np.asarray(mean)) / np.sqrt(np.asarray(var) + gated_fm._BN_EPS)
  chex.assert_trees_all_close(logits, jnp.asarray(0.5 + FIRST + running @ GATES), atol=1e-5)
  chex.assert_trees_all_equal(model.pair_norm.mean[...], mean)


def test_deep_variant_and_no_pairs():
  deep = registry.build_model("gated_fm", num_fields=3, embed_dim=2, num_dense=1,
                              rngs=nnx.Rngs(0), mlp_dims=(4,), pairs=())
  assert deep.gates.shape == (0,) and deep.pair_norm is None
  out = deep(jnp.ones((5, 3, 3)), jnp.ones((5, 1)))
  assert out.shape == (5,) and deep.mlp is not None
  with pytest.raises(ValueError, match="gated_fm: model.bn_momentum"):
    registry.build_model("gated_fm", num_fields=3, embed_dim=2, num_dense=1, rngs=nnx.Rngs(0),
                         bn_momentum=2.0)
  # A structure-search model: built by name, never a trainer's `model.name`.
  assert "gated_fm" not in registry.MODEL_NAMES and "gated_fm" not in registry.ALL_MODEL_NAMES
  assert registry.embedding_width("gated_fm", 4) == 5


def test_the_shared_step_trains_it_and_writes_the_moments_back():
  model = _model(bn_momentum=0.5)
  graphdef, params = nnx.split(model)
  tx = optax.sgd(0.1)
  row_opt = row_optimizers.sgd(0.1)
  table = device_table.TableState(jnp.asarray(EMB.reshape(6, 2)), jnp.zeros((6, 0)))
  state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(nnx.state(params, nnx.Param)),
                     table)
  batch = DeviceBatch(rows=jnp.arange(6, dtype=jnp.int32),
                      vids=jnp.arange(6, dtype=jnp.int32).reshape(2, 3),
                      dense=jnp.zeros((2, 1)), labels=jnp.array([1.0, 0.0]),
                      mask=jnp.ones(2))
  step = jax.jit(step_lib.make_train_step(graphdef, tx, row_opt, model_variables=True))
  new, metrics = step(state, batch)
  chex.assert_trees_all_close(new.params["pair_norm"]["mean"][...],
                              jnp.asarray(0.5 * PRODUCTS.mean(0)), atol=1e-6)
  assert not np.allclose(np.asarray(new.params["gates"][...]), GATES)
  assert np.isfinite(float(metrics["loss"])) and int(new.step) == 1
  with pytest.raises(ValueError, match="model_variables is not supported"):
    step_lib.make_train_step(graphdef, tx, row_opt, model_variables=True, skip_non_finite=True)
