"""Tests for the model a block spec describes (sfjax/models/composed.py) and its registration."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sfjax import models
from sfjax.models import block_spec, generator

RNG = np.random.default_rng(0)
F, ND, B = 3, 2, 4
EMB = RNG.normal(size=(B, F, 3)).astype(np.float32)  # dims [2, 1, 1] + first-order column
DENSE = RNG.normal(size=(B, ND)).astype(np.float32)


def _vectors():
  v = EMB[..., :2].copy()
  v[:, 1:, 1] = 0.0  # fields 1, 2 have dim 1
  return v


def _fm(v):
  return sum(np.sum(v[:, i] * v[:, j], axis=-1) for i in range(F) for j in range(i + 1, F))


def test_stacked_blocks_feed_the_tower_by_hand():
  spec = {"embedding": {"dims": [2, 1, 1]}, "dense": {"linear": False},
          "interactions": [{"type": "first_order"}, {"type": "fm"}], "combine": "stacked",
          "tower": {"dims": []}}
  model = generator.build_from_spec(spec, F, ND, nnx.Rngs(0))
  model.tower.out.kernel[...] = jnp.array([[0.5], [-2.0]])
  model.tower.out.bias[...] = jnp.array([0.25])
  want = 0.5 * EMB[..., 2].sum(axis=1) - 2.0 * _fm(_vectors()) + 0.25
  chex.assert_trees_all_close(model(EMB, DENSE), want, rtol=1e-5)


def test_parallel_mixed_dims_with_bias_and_dense_linear_by_hand():
  spec = {"embedding": {"dims": [2, 1, 1]}, "bias": True,
          "interactions": [{"type": "fm", "pairs": [[0, 1], [1, 2]]}]}
  model = generator.build_from_spec(spec, F, ND, nnx.Rngs(0))
  assert generator.spec_embedding_width(spec) == 2
  model.bias[...] = jnp.array(0.5)
  v = _vectors()
  want = (0.5 + DENSE @ np.asarray(model.dense_linear.kernel[...])
          + np.sum(v[:, 0] * v[:, 1], -1) + np.sum(v[:, 1] * v[:, 2], -1))
  chex.assert_trees_all_close(model(EMB[..., :2], DENSE), want, rtol=1e-5)


def test_registered_as_composed_and_jitted_over_split_state():
  spec = generator.named_model_spec("dlrm", 2, mlp_dims=(4,), bottom_mlp_dims=(3,))
  text = generator.spec_to_json(spec)
  assert "composed" in models.ALL_MODEL_NAMES and "composed" not in models.MODEL_NAMES
  assert models.embedding_width("composed", 2) == 2 and "blocks" in models.HPARAM_KEYS
  model = models.build_model_from_config({"name": "composed", "embed_dim": 2, "blocks": text,
                                          "mlp_dims": (9,)}, num_fields=F, num_dense=ND,
                                         rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  forward = jax.jit(lambda s, e, d: nnx.merge(graphdef, s)(e, d))
  chex.assert_shape(forward(state, EMB[..., :2], DENSE), (B,))
  chex.assert_trees_all_close(forward(state, EMB[..., :2], DENSE), model(EMB[..., :2], DENSE),
                              rtol=1e-5)


def test_bad_sizes_and_specs_name_the_problem():
  text = generator.spec_to_json(generator.named_model_spec("fm", 4))
  with pytest.raises(ValueError, match="row width 5"):
    models.build_model("composed", num_fields=F, embed_dim=4, num_dense=ND, rngs=nnx.Rngs(0),
                       blocks=text)
  with pytest.raises(block_spec.SpecError, match="model.blocks: empty"):
    models.build_model("composed", num_fields=F, embed_dim=4, num_dense=ND, rngs=nnx.Rngs(0))
  empty_tower = {"embedding": {"dims": [2]}, "tower": {"dims": [3], "inputs": ["dense"]}}
  with pytest.raises(ValueError, match="tower's inputs"):
    generator.build_from_spec(empty_tower, F, 0, nnx.Rngs(0))
  model = generator.build_from_spec({"embedding": {"dims": [2]}}, F, ND, nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"composed: emb must be \[B, 3, 2\]"):
    model(EMB, DENSE)


def test_trainer_config_check_accepts_a_matching_composed_model():
  from sfjax.train import config_check, defaults  # pylint: disable=g-import-not-at-top
  config = defaults.ctr_defaults()
  config.model.name = "composed"
  config.model.blocks = generator.spec_to_json(generator.named_model_spec("deepfm", 16))
  config.model.embed_dim = 17
  config_check.validate(config)
  config.model.embed_dim = 16
  with pytest.raises(config_check.ConfigError, match="model.embed_dim=17"):
    config_check.validate(config)
  config.model.blocks = '{"embedding": {"dims": [4]}, "interactions": [{"type": "cros"}]}'
  with pytest.raises(config_check.ConfigError,
                     match=r"config field model.blocks: interactions\[0\].type: unknown"):
    config_check.validate(config)
  config.model.name = "deepfm"  # other models ignore model.blocks
  config_check.validate(config)


def test_gates_scale_each_parallel_block_and_zero_stops_its_gradients():
  spec = {"embedding": {"dims": [2, 1, 1]}, "bias": True, "gated": True, "dense": {"linear": False},
          "interactions": [{"type": "first_order"}, {"type": "fm"}]}
  model = generator.build_from_spec(spec, F, ND, nnx.Rngs(0))
  assert generator.build_from_spec({**spec, "gated": False}, F, ND, nnx.Rngs(0)).gates is None
  np.testing.assert_array_equal(model.gates[...], [1.0, 1.0])
  first_order, fm = EMB[..., 2].sum(axis=1), _fm(_vectors())
  chex.assert_trees_all_close(model(EMB, DENSE), first_order + fm, rtol=1e-5)
  model.gates[...] = jnp.array([1.0, 0.0])
  chex.assert_trees_all_close(model(EMB, DENSE), first_order, rtol=1e-5)
  grad = jax.grad(lambda e: jnp.sum(model(e, DENSE)))(jnp.asarray(EMB))
  assert not np.asarray(grad[..., :2]).any()  # the fm's vectors get no gradient at gate 0
  np.testing.assert_array_equal(grad[..., 2], np.ones((B, F)))


def test_column_gates_zero_a_column_and_its_gradient():
  # Issue #26: a shape bucket's superset zeroes the columns past a trial's own dims.
  spec = {"embedding": {"dims": [2, 1, 1]}, "gated_columns": True, "dense": {"linear": False},
          "interactions": [{"type": "first_order"}, {"type": "fm"}]}
  model = generator.build_from_spec(spec, F, ND, nnx.Rngs(0))
  assert generator.build_from_spec({**spec, "gated_columns": False}, F, ND,
                                   nnx.Rngs(0)).column_gates is None
  np.testing.assert_array_equal(model.column_gates[...], np.ones((F, 3)))
  first_order = EMB[..., 2].sum(axis=1)
  chex.assert_trees_all_close(model(EMB, DENSE), first_order + _fm(_vectors()), rtol=1e-5)
  model.column_gates[...] = jnp.array([[1.0, 0.0, 1.0]] * F)  # field 0 reads dim 1 only
  v = _vectors()
  v[:, 0, 1] = 0.0
  chex.assert_trees_all_close(model(EMB, DENSE), first_order + _fm(v), rtol=1e-5)
  grad = jax.grad(lambda e: jnp.sum(model(e, DENSE)))(jnp.asarray(EMB))
  assert not np.asarray(grad[:, :, 1]).any() and np.asarray(grad[:, :, 0]).any()
