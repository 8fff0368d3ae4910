"""Quantization: per-tensor and per-row grids by hand, straight-through gradient, vmapped bits,
the stored form."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.compress import quant as ctr_quant

ROWS = jnp.array([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [-2.0, 1.0, 0.6]])


def test_fake_quant_by_hand():
  fq = jax.jit(ctr_quant.fake_quant_rows)
  # 3 bits: qmax 3, row 0 scale 1/3 -> codes [3, -2 (round half to even of -1.5), 1].
  chex.assert_trees_all_close(fq(ROWS, 3)[0], jnp.array([1.0, -2 / 3, 1 / 3]), atol=1e-6)
  # A zero row stays zero; row 2 at 2 bits: qmax 1, scale 2 -> codes [-1, 0 (0.5 to even), 0].
  chex.assert_trees_all_equal(fq(ROWS, 2)[1], jnp.zeros(3))
  chex.assert_trees_all_close(fq(ROWS, 2)[2], jnp.array([-2.0, 0.0, 0.0]), atol=1e-6)
  chex.assert_trees_all_equal(fq(ROWS, 32), ROWS)  # float rows: unchanged


def test_per_tensor_quantize_by_hand():
  w = jnp.array([-1.0, -0.4, 0.1, 0.26, 0.7])
  # 2 bits: levels = 1, scale = 1.0 -> round(w) clipped to [-1, 1].
  np.testing.assert_allclose(ctr_quant._quantize(w, 2), [-1.0, 0.0, 0.0, 0.0, 1.0])
  # 3 bits: levels = 3, scale = 1/3 -> round(3 w) / 3.
  np.testing.assert_allclose(ctr_quant._quantize(w, 3), [-1.0, -1 / 3, 0.0, 1 / 3, 2 / 3],
                             rtol=1e-6)
  np.testing.assert_allclose(ctr_quant._quantize(w, 32), w)
  np.testing.assert_allclose(ctr_quant._quantize(jnp.zeros(3), 4), 0.0)
  # One scale for the whole tensor, not one per row: row 1 shares row 2's grid.
  np.testing.assert_allclose(ctr_quant._quantize(ROWS, 2), [[0.0, 0.0, 0.0], [0.0] * 3,
                                                            [-2.0, 0.0, 0.0]])
  codes, scale = ctr_quant._quantize_codes(ROWS, 3, axis=None)
  assert scale.shape == () and float(scale) == pytest.approx(2 / 3)
  np.testing.assert_array_equal(codes[2], [-3.0, 2.0, 1.0])


def test_straight_through_gradient_and_vmapped_bits():
  w = jnp.array([-1.0, -0.4, 0.1, 0.26, 0.7])
  g = jax.grad(lambda w: jnp.sum(ctr_quant.fake_quant(w, 2) * jnp.arange(5.0)))(w)
  np.testing.assert_allclose(g, jnp.arange(5.0))
  out = jax.vmap(ctr_quant.fake_quant, in_axes=(None, 0))(w, jnp.array([2, 3, 32]))
  np.testing.assert_allclose(out[0], [-1.0, 0.0, 0.0, 0.0, 1.0])
  np.testing.assert_allclose(out[2], w)


def test_straight_through_gradient():
  w = jnp.array([[1.0, 2.0, 3.0]] * 3)
  grad = jax.grad(lambda x: jnp.sum(ctr_quant.fake_quant_rows(x, 4) * w))(ROWS)
  chex.assert_trees_all_equal(grad, w)


def test_stored_codes_dequantize_to_the_fake_quantized_rows():
  values = np.random.default_rng(0).normal(size=(50, 5)).astype(np.float32)
  for bits in (2, 4, 8):
    codes, scales = ctr_quant.table_codes(values, bits)
    assert codes.dtype == np.int8 and np.abs(codes).max() <= 2 ** (bits - 1) - 1
    chex.assert_trees_all_close(ctr_quant.dequantize(codes, scales),
                                np.asarray(jax.jit(ctr_quant.fake_quant_rows)(values, bits)),
                                atol=1e-6)
  assert ctr_quant.table_bits(50, 5, 4) == 50 * (5 * 4 + 32)
  assert ctr_quant.table_bits(50, 5, 32) == 50 * 5 * 32


def test_bad_bits_are_named():
  with pytest.raises(ValueError, match="bit_choices:"):
    ctr_quant.check_bit_choices((1, 4))
  with pytest.raises(ValueError, match="bit_choices:"):
    ctr_quant.check_bit_choices(())
  assert ctr_quant.check_bit_choices((32, 4, 4)) == (4, 32)
  with pytest.raises(ValueError, match="bits: 32 has no int8 code form"):
    ctr_quant.table_codes(np.zeros((2, 2)), 32)
