"""Tests for sfjax.models.dcnv2."""

import numpy as np
import pytest
from flax import nnx

from sfjax.models.dcnv2 import CrossLayer, DCNv2

B, F, D, ND = 4, 3, 4, 2


def _rand(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_full_rank_cross_layer_formula():
  layer = CrossLayer(5, 0, rngs=nnx.Rngs(0))
  layer.bias[...] = _rand(5, seed=3)
  x0, x = _rand(B, 5, seed=1), _rand(B, 5, seed=2)
  w, b = np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])
  np.testing.assert_allclose(layer(x0, x), x0 * (x @ w + b) + x, rtol=1e-5, atol=1e-5)


def test_low_rank_cross_layer_equals_full_rank_with_the_product_matrix():
  low = CrossLayer(6, 2, rngs=nnx.Rngs(0))
  full = CrossLayer(6, 0, rngs=nnx.Rngs(1))
  full.kernel[...] = np.asarray(low.down[...]) @ np.asarray(low.up[...])
  x0, x = _rand(B, 6, seed=1), _rand(B, 6, seed=2)
  np.testing.assert_allclose(low(x0, x), full(x0, x), rtol=1e-5, atol=1e-5)
  assert low.down[...].shape == (6, 2) and low.up[...].shape == (2, 6)


def test_without_cross_layers_dcnv2_is_mlp_on_x0_plus_dense_linear():
  model = DCNv2(num_fields=F, embed_dim=D, num_dense=ND, mlp_dims=(), cross_layers=0,
                rngs=nnx.Rngs(0))
  emb, dense = _rand(B, F, D, seed=1), _rand(B, ND, seed=2)
  x0 = np.concatenate([emb.reshape(B, -1), dense], axis=1)
  kernel, bias = np.asarray(model.mlp.out.kernel[...]), np.asarray(model.mlp.out.bias[...])
  expected = (x0 @ kernel + bias)[:, 0] + dense @ np.asarray(model.dense_linear.kernel[...])
  np.testing.assert_allclose(model(emb, dense), expected, rtol=1e-5, atol=1e-5)


def test_stacked_and_parallel_structures():
  kwargs = dict(num_fields=F, embed_dim=D, num_dense=ND, mlp_dims=(5,), cross_layers=2,
                cross_rank=3)
  stacked = DCNv2(**kwargs, rngs=nnx.Rngs(0))
  parallel = DCNv2(**kwargs, cross_structure="parallel", rngs=nnx.Rngs(0))
  dim = F * D + ND
  assert stacked.head is None and stacked.mlp.hidden[0].kernel[...].shape == (dim, 5)
  assert parallel.head.kernel[...].shape == (dim + 5, 1)
  emb, dense = _rand(B, F, D, seed=1), _rand(B, ND, seed=2)
  for model in (stacked, parallel):
    out = model(emb, dense)
    assert out.shape == (B,) and np.all(np.isfinite(out))


def test_unknown_structure_is_rejected():
  with pytest.raises(ValueError, match=r"dcnv2: model\.cross_structure must be one of"):
    DCNv2(num_fields=F, embed_dim=D, num_dense=ND, cross_structure="serial", rngs=nnx.Rngs(0))
