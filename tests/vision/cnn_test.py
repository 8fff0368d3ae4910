"""The baseline CNN: shapes, exact parameter counts, pruning equals masking."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from sfjax.vision import cnn
from sfjax.vision import conv_layers as layers


def test_param_count_is_exact():
  params = cnn.init_cnn(jax.random.key(0), (4, 6, 5))
  assert layers.num_params(params) == cnn.cnn_param_count((4, 6, 5))
  assert cnn.widths_of(params) == (4, 6, 5)
  assert sum(cnn.layer_weight_sizes((4, 6, 5))) == cnn.cnn_param_count((4, 6, 5)) - (4 + 6 + 5 + 10)


def test_pruned_network_is_smaller_and_computes_the_masked_logits():
  params = cnn.init_cnn(jax.random.key(0), (4, 6, 5))
  masks = (jnp.array([1, 0, 1, 1.0]), jnp.array([0, 1, 1, 0, 1, 1.0]), jnp.array([1, 1, 0, 0, 1.0]))
  small = cnn.prune_cnn(params, masks)
  assert cnn.widths_of(small) == (3, 4, 3)
  assert layers.num_params(small) == cnn.cnn_param_count((3, 4, 3))
  x = jax.random.uniform(jax.random.key(1), (2, 8, 8, 1))
  out = cnn.apply_cnn(params, x, masks=masks)
  chex.assert_shape(out, (2, 10))
  np.testing.assert_allclose(cnn.apply_cnn(small, x), out, rtol=1e-5, atol=1e-6)


def test_bits_quantize_the_weights():
  params = cnn.init_cnn(jax.random.key(0), (4, 6, 5))
  x = jax.random.uniform(jax.random.key(1), (2, 8, 8, 1))
  full = cnn.apply_cnn(params, x, bits=jnp.full((4,), 32))
  np.testing.assert_allclose(full, cnn.apply_cnn(params, x), rtol=1e-6)
  assert not np.allclose(cnn.apply_cnn(params, x, bits=jnp.full((4,), 2)), full)
