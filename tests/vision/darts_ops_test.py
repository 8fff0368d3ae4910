"""DARTS ops and the mixed op against hand computation on a 3x3 one-channel image."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.vision import darts_ops

X = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0], [2.0, 0.0, -3.0]], np.float32)


def _neighbourhoods(image, fill):
  padded = np.pad(image, 1, constant_values=fill)
  return [[padded[i:i + 3, j:j + 3] for j in range(3)] for i in range(3)]


def _by_hand():
  relu = np.maximum(X, 0)
  hood = _neighbourhoods(relu, 0.0)
  conv = np.array([[h.sum() for h in row] for row in hood])
  maxp = np.array([[h.max() for h in row] for row in _neighbourhoods(X, -np.inf)])
  valid = _neighbourhoods(np.ones_like(X), 0.0)
  avgp = np.array([[h.sum() / v.sum() for h, v in zip(r, rv, strict=True)]
                   for r, rv in zip(_neighbourhoods(X, 0.0), valid, strict=True)])
  return {"conv_3x3": conv, "sep_conv_3x3": 2.0 * conv, "max_pool_3x3": maxp,
          "avg_pool_3x3": avgp, "skip": X, "zero": np.zeros_like(X)}


def _params():
  return {"conv_3x3": {"w": jnp.ones((3, 3, 1, 1))},
          "sep_conv_3x3": {"dw": jnp.ones((3, 3, 1, 1)), "pw": jnp.full((1, 1, 1, 1), 2.0)},
          "max_pool_3x3": {}, "avg_pool_3x3": {}, "skip": {}, "zero": {}}


def test_each_op_by_hand():
  x = jnp.asarray(X)[None, :, :, None]
  expected = _by_hand()
  for name in darts_ops.OPS:
    out = darts_ops.apply_op(name, _params()[name], x)
    chex.assert_shape(out, (1, 3, 3, 1))
    np.testing.assert_allclose(out[0, :, :, 0], expected[name], rtol=1e-6, err_msg=name)


def test_mixed_op_is_the_softmax_weighted_sum():
  alpha = jnp.array([0.3, -1.0, 2.0, 0.0, 0.5, -0.7])
  w = np.exp(alpha) / np.exp(alpha).sum()
  expected = sum(w[k] * _by_hand()[name] for k, name in enumerate(darts_ops.OPS))
  out = jax.jit(darts_ops.mixed_op)(_params(), alpha, jnp.asarray(X)[None, :, :, None])
  np.testing.assert_allclose(out[0, :, :, 0], expected, rtol=1e-5)


def test_init_shapes_and_unknown_op():
  params = darts_ops.init_mixed_op(jax.random.key(0), 4)
  chex.assert_shape(params["sep_conv_3x3"]["dw"], (3, 3, 1, 4))
  assert params["skip"] == {}
  with pytest.raises(ValueError, match="unknown DARTS op"):
    darts_ops.init_op(jax.random.key(0), "dil_conv_5x5", 4)
