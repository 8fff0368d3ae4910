"""Tests for sfjax.models.layers."""

import chex
import jax
import numpy as np
import pytest
from flax import nnx

from sfjax.models.layers import MLP, DenseLinear


def _np_mlp(mlp, x):
  for layer in mlp.hidden:
    x = np.maximum(x @ np.asarray(layer.kernel[...]) + np.asarray(layer.bias[...]), 0.0)
  if mlp.out is not None:
    x = x @ np.asarray(mlp.out.kernel[...]) + np.asarray(mlp.out.bias[...])
  return x


def test_mlp_matches_numpy_relu_stack_with_linear_output():
  mlp = MLP(6, (5, 3), 1, rngs=nnx.Rngs(0))
  assert mlp.out_features == 1
  assert [layer.kernel[...].shape for layer in mlp.hidden] == [(6, 5), (5, 3)]
  np.testing.assert_allclose(np.asarray(mlp.out.bias[...]), 0.0)  # logit bias starts at 0
  x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
  out = jax.jit(lambda m, x: m(x))(mlp, x)
  chex.assert_shape(out, (4, 1))
  np.testing.assert_allclose(out, _np_mlp(mlp, x), rtol=1e-5, atol=1e-6)


def test_mlp_without_output_layer_ends_in_relu():
  mlp = MLP(3, (4,), None, rngs=nnx.Rngs(1))
  assert mlp.out is None and mlp.out_features == 4
  x = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
  out = np.asarray(mlp(x))
  assert out.shape == (8, 4) and np.all(out >= 0) and np.any(out > 0)
  np.testing.assert_allclose(out, _np_mlp(mlp, x), rtol=1e-5, atol=1e-6)


def test_mlp_without_hidden_layers_is_one_linear():
  mlp = MLP(3, (), 2, rngs=nnx.Rngs(0))
  assert len(mlp.hidden) == 0 and mlp.out_features == 2


def test_dense_linear_is_a_dot_and_zero_without_dense_features():
  lin = DenseLinear(2, rngs=nnx.Rngs(0))
  lin.kernel[...] = np.array([2.0, -1.0], np.float32)
  np.testing.assert_allclose(lin(np.array([[1.0, 3.0], [0.5, 0.0]], np.float32)), [-1.0, 1.0])
  empty = DenseLinear(0, rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(empty(np.zeros((3, 0), np.float32)), np.zeros(3))


def test_mlp_on_parts_equals_mlp_on_their_concatenation():
  mlp = MLP(7, (5, 3), 1, rngs=nnx.Rngs(2))
  rng = np.random.default_rng(2)
  a, b = (rng.standard_normal((4, n)).astype(np.float32) for n in (4, 3))
  out = jax.jit(lambda m, a, b: m.call_on_parts([a, b]))(mlp, a, b)
  np.testing.assert_allclose(out, _np_mlp(mlp, np.concatenate([a, b], 1)), rtol=1e-5, atol=1e-6)


def test_mlp_on_parts_checks_the_widths_and_needs_a_hidden_layer():
  mlp = MLP(7, (5,), 1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="6 columns in all, the first layer takes 7"):
    mlp.call_on_parts([np.zeros((2, 4), np.float32), np.zeros((2, 2), np.float32)])
  with pytest.raises(ValueError, match="no hidden layer"):
    MLP(3, (), 1, rngs=nnx.Rngs(0)).call_on_parts([np.zeros((2, 3), np.float32)])
