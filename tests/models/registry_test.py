"""Properties every registered model must have, checked through the registry."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs.ctr import get_config
from sfjax.models import registry

B, F, D = 4, 3, 4
TINY = dict(mlp_dims=(5, 3), cross_layers=2, cross_rank=0, bottom_mlp_dims=(3,),
            attention_layers=2, attention_heads=2, attention_dim=2, cin_dims=(3, 2))
CASES = [(name, nd) for name in registry.MODEL_NAMES for nd in (2, 0)]


@functools.cache
def _model(name, num_dense, seed=0):
  """Tiny model with random params drawn on the host.

  Built abstractly (`nnx.eval_shape`) and filled with numpy normals: eager
  initialisers would compile one XLA program per parameter shape, which is most
  of this file's run time on 2 cores. Real initialisers are exercised by the
  per-model test files.
  """
  model = nnx.eval_shape(lambda: registry.build_model(
      name, num_fields=F, embed_dim=D, num_dense=num_dense, rngs=nnx.Rngs(0), **TINY))
  rng = np.random.default_rng(seed)
  state = jax.tree.map(lambda a: (0.5 * rng.standard_normal(a.shape)).astype(a.dtype),
                       nnx.state(model))
  nnx.update(model, state)
  return model


def _inputs(name, num_dense, dtype=np.float32):
  """Host numpy inputs (no eager device compiles); jit converts them."""
  rng = np.random.default_rng(1)
  emb = rng.standard_normal((B, F, registry.embedding_width(name, D))).astype(dtype)
  return emb, rng.standard_normal((B, num_dense)).astype(dtype)


def _build_with(name, **overrides):
  return registry.build_model(name, num_fields=F, embed_dim=D, num_dense=2, rngs=nnx.Rngs(0),
                              **{**TINY, **overrides})


@pytest.mark.parametrize("name,num_dense", CASES)
def test_split_merge_forward_under_jit_and_vmap(name, num_dense):
  graphdef, params = nnx.split(_model(name, num_dense))
  # Only nnx.Param state: nothing for __call__ to mutate under jit/vmap.
  assert not jax.tree.leaves(nnx.state(_model(name, num_dense), nnx.Not(nnx.Param)))
  emb, dense = _inputs(name, num_dense)
  traces = []

  @jax.jit
  def forward(p):
    traces.append(1)
    return nnx.merge(graphdef, p)(emb, dense)

  out = forward(params)
  chex.assert_shape(out, (B,))
  chex.assert_type(out, jnp.float32)
  chex.assert_tree_all_finite(out)
  shifted = forward(jax.tree.map(lambda a: np.asarray(a) + 0.1, params))  # same shapes: no retrace
  assert not np.allclose(shifted, out)
  assert len(traces) == 1

  if num_dense == 0:
    return  # the trial-axis check below does not depend on Nd; keep the suite fast
  # Trials axis (AutoML): vmap over stacked params equals separate forwards.
  per_seed = [nnx.state(_model(name, num_dense, seed)) for seed in range(3)]
  stacked = jax.tree.map(lambda *a: np.stack(a), *per_seed)  # host-side: no eager compiles
  vmapped = jax.jit(jax.vmap(lambda p: nnx.merge(graphdef, p)(emb, dense)))(stacked)
  chex.assert_shape(vmapped, (3, B))
  for i, p in enumerate(per_seed):
    chex.assert_trees_all_close(vmapped[i], forward(p), rtol=1e-5, atol=1e-5)
  assert len(traces) == 1


@pytest.mark.parametrize("name,num_dense", CASES)
def test_gradients_match_finite_differences_and_reach_every_input(name, num_dense):
  graphdef, params = nnx.split(_model(name, num_dense))
  with jax.enable_x64(True):
    params = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    emb, dense = _inputs(name, num_dense, np.float64)
    weights = jnp.linspace(0.5, 1.5, B, dtype=jnp.float64)
    args = (params, emb, dense)
    rng = np.random.default_rng(0)
    direction = jax.tree.map(lambda a: rng.standard_normal(a.shape), args)  # host numpy

    def loss(p, e, x):
      logits = nnx.merge(graphdef, p)(e, x)
      assert logits.dtype == jnp.float64
      return jnp.sum(weights * logits)

    @jax.jit
    def grads_and_directional(args, direction, eps=1e-6):
      grads = jax.grad(loss, argnums=(0, 1, 2))(*args)
      def step(sign):
        return jax.tree.map(lambda a, d: a + sign * eps * d, args, direction)

      finite_diff = (loss(*step(1.0)) - loss(*step(-1.0))) / (2 * eps)
      analytic = sum(jnp.vdot(g, d) for g, d in zip(jax.tree.leaves(grads),
                                                    jax.tree.leaves(direction), strict=True))
      return grads, finite_diff, analytic

    grads, finite_diff, analytic = grads_and_directional(args, direction)
    np.testing.assert_allclose(analytic, finite_diff, rtol=1e-6, atol=1e-8)
    # Each parameter leaf also matches on its own (a wrong leaf cannot hide in the sum).
    param_directions, treedef = jax.tree.flatten(direction[0])
    for i, leaf_direction in enumerate(param_directions):
      leaves = [leaf_direction if j == i else np.zeros_like(d)
                for j, d in enumerate(param_directions)]
      only = (jax.tree.unflatten(treedef, leaves), np.zeros_like(emb), np.zeros_like(dense))
      _, fd, an = grads_and_directional(args, only)
      np.testing.assert_allclose(an, fd, rtol=1e-6, atol=1e-8)

  _, grad_emb, grad_dense = grads
  chex.assert_tree_all_finite(grads)
  # Every (field, column) of the rows and every dense feature influences the logit.
  assert np.all(np.abs(grad_emb).sum(axis=0) > 0), np.abs(grad_emb).sum(axis=0)
  assert np.all(np.abs(grad_dense).sum(axis=0) > 0)


def test_embedding_width_convention():
  widths = {name: registry.embedding_width(name, 16) for name in registry.MODEL_NAMES}
  assert widths == {"lr": 1, "fm": 17, "deepfm": 17, "wide_deep": 17, "dcnv2": 16, "dlrm": 16,
                    "autoint": 16, "xdeepfm": 17}


def test_wrong_embedding_width_is_rejected_with_model_name():
  model = _model("deepfm", 2)
  emb = jnp.zeros((B, F, D))  # missing the first-order column
  with pytest.raises(ValueError, match=r"deepfm: emb must be \[B, 3, 5\]"):
    model(emb, jnp.zeros((B, 2)))
  with pytest.raises(ValueError, match=r"deepfm: dense must be \[4, 2\]"):
    model(jnp.zeros((B, F, D + 1)), jnp.zeros((B, 3)))


def test_unknown_model_name_names_the_key_and_known_models():
  with pytest.raises(ValueError, match=r"model\.name: unknown model 'deepffm'.*lr, fm, deepfm"):
    registry.build_model("deepffm", num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"model\.name"):
    registry.embedding_width("nope", D)


def test_unknown_hparam_is_rejected_and_unused_ones_ignored():
  with pytest.raises(ValueError, match=r"model\.mlp_dimz"):
    registry.build_model("lr", num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0),
                         mlp_dimz=(3,))
  lr = registry.build_model("lr", num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0),
                            mlp_dims=(3,), cin_dims=(2,))
  assert sum(a.size for a in jax.tree.leaves(nnx.state(lr))) == 1  # the bias only


def test_bad_hparam_value_names_the_config_key():
  with pytest.raises(ValueError, match=r"dcnv2: model\.cross_rank must be an int >= 0"):
    _build_with("dcnv2", cross_rank=-1)
  with pytest.raises(ValueError, match=r"xdeepfm: model\.cin_dims must name at least one"):
    _build_with("xdeepfm", cin_dims=())
  with pytest.raises(ValueError, match=r"deepfm: model\.mlp_dims must be a sequence"):
    _build_with("deepfm", mlp_dims=(4, 0))


def test_every_config_model_key_is_a_known_hparam():
  model_cfg = get_config().model
  keys = set(model_cfg.keys()) - {"name", "embed_dim"}
  assert keys <= set(registry.HPARAM_KEYS), keys - set(registry.HPARAM_KEYS)


@pytest.mark.parametrize("name", registry.MODEL_NAMES)
def test_build_from_config_for_every_name(name):
  cfg = get_config("smoke").model
  cfg.name, cfg.mlp_dims = name, [6]  # a list, as a CLI override gives
  # Abstract build: shapes only, no initialiser compiles.
  model = nnx.eval_shape(lambda: registry.build_model_from_config(
      cfg, num_fields=F, num_dense=2, rngs=nnx.Rngs(0)))
  assert isinstance(model, registry.model_class(name))
  graphdef, params = nnx.split(model)
  width = registry.embedding_width(name, cfg.embed_dim)
  out = jax.eval_shape(lambda p, e, x: nnx.merge(graphdef, p)(e, x), params,
                       jax.ShapeDtypeStruct((B, F, width), jnp.float32),
                       jax.ShapeDtypeStruct((B, 2), jnp.float32))
  assert out.shape == (B,) and out.dtype == jnp.float32


def test_build_from_config_requires_name_and_embed_dim():
  with pytest.raises(ValueError, match=r"model\.embed_dim"):
    registry.build_model_from_config({"name": "fm"}, num_fields=F, num_dense=0,
                                     rngs=nnx.Rngs(0))
