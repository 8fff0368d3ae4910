"""Fake quantization by hand: the grid, full precision, the straight-through gradient."""

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.vision import fake_quant


def test_quantize_by_hand():
  w = jnp.array([-1.0, -0.4, 0.1, 0.26, 0.7])
  # 2 bits: levels = 1, scale = 1.0 -> round(w) clipped to [-1, 1].
  np.testing.assert_allclose(fake_quant.quantize(w, 2), [-1.0, 0.0, 0.0, 0.0, 1.0])
  # 3 bits: levels = 3, scale = 1/3 -> round(3 w) / 3.
  np.testing.assert_allclose(fake_quant.quantize(w, 3), [-1.0, -1 / 3, 0.0, 1 / 3, 2 / 3],
                             rtol=1e-6)
  np.testing.assert_allclose(fake_quant.quantize(w, 32), w)
  np.testing.assert_allclose(fake_quant.quantize(jnp.zeros(3), 4), 0.0)


def test_straight_through_gradient_and_vmapped_bits():
  w = jnp.array([-1.0, -0.4, 0.1, 0.26, 0.7])
  g = jax.grad(lambda w: jnp.sum(fake_quant.fake_quant(w, 2) * jnp.arange(5.0)))(w)
  np.testing.assert_allclose(g, jnp.arange(5.0))
  out = jax.vmap(fake_quant.fake_quant, in_axes=(None, 0))(w, jnp.array([2, 3, 32]))
  np.testing.assert_allclose(out[0], [-1.0, 0.0, 0.0, 0.0, 1.0])
  np.testing.assert_allclose(out[2], w)
