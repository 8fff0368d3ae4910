"""Pure layers: shapes, pooling and batch norm by hand, initialiser statistics."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from sfjax.vision import conv_layers as layers


def test_conv_pool_shapes_and_values():
  x = jnp.arange(16.0).reshape(1, 4, 4, 1)
  chex.assert_shape(layers.conv2d(x, jnp.ones((3, 3, 1, 2))), (1, 4, 4, 2))
  np.testing.assert_allclose(layers.max_pool(x, 2, 2)[0, :, :, 0], [[5, 7], [13, 15]])
  np.testing.assert_allclose(layers.avg_pool(x, 3)[0, 0, 0, 0], (0 + 1 + 4 + 5) / 4)
  dw = layers.conv2d(jnp.ones((1, 3, 3, 2)), jnp.ones((3, 3, 1, 2)), groups=2)
  np.testing.assert_allclose(dw[0, 1, 1], [9.0, 9.0])


def test_initialisers():
  p = layers.dense_init(jax.random.key(0), 400, 300)
  chex.assert_shape(p["w"], (400, 300))
  assert abs(float(p["w"].std()) - np.sqrt(2 / 400)) < 0.005
  assert layers.num_params(layers.conv_init(jax.random.key(0), 2, 3)) == 9 * 2 * 3 + 3


def test_batch_norm_by_hand():
  params, stats = layers.batch_norm_init(2)
  x = jnp.array([[1.0, 10.0], [3.0, 10.0], [5.0, 16.0], [7.0, 16.0]]).reshape(2, 2, 1, 2)
  y, moved = layers.batch_norm(params, stats, x, train=True)
  # channel 0: mean 4, biased var 5, unbiased 20/3; channel 1: mean 13, var 9, unbiased 12.
  np.testing.assert_allclose(y[..., 0].ravel(), (np.array([1, 3, 5, 7]) - 4) / np.sqrt(5 + 1e-5),
                             rtol=1e-5)
  np.testing.assert_allclose(moved["mean"], [0.4, 1.3], rtol=1e-6)
  np.testing.assert_allclose(moved["var"], [0.9 + 2 / 3, 0.9 + 1.2], rtol=1e-6)
  params = {"scale": jnp.array([2.0, 1.0]), "bias": jnp.array([0.0, -1.0])}
  y, same = layers.batch_norm(params, moved, x, train=False)  # eval: the running statistics
  chex.assert_trees_all_equal(same, moved)
  np.testing.assert_allclose(y[0, 0, 0], [2 * (1 - 0.4) / np.sqrt(1.5666667 + 1e-5),
                                          (10 - 1.3) / np.sqrt(2.1 + 1e-5) - 1], rtol=1e-5)
  grads = jax.grad(lambda s: layers.batch_norm(params, s, x, train=True)[1]["mean"].sum())(stats)
  np.testing.assert_allclose(grads["mean"], 0.9)  # only through the old value: batch part stopped
