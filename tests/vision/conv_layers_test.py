"""Pure layers: shapes, pooling by hand, initialiser statistics."""

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
