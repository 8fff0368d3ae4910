"""Tests for sfjax.models.lr."""

import numpy as np
from flax import nnx

from sfjax.models.lr import LR


def test_lr_is_sum_of_weights_plus_dense_linear_plus_bias():
  model = LR(num_fields=3, embed_dim=8, num_dense=2, rngs=nnx.Rngs(0))
  model.dense_linear.kernel[...] = np.array([2.0, 3.0], np.float32)
  model.bias[...] = np.float32(0.5)
  emb = np.array([[[1.0], [2.0], [3.0]], [[-1.0], [0.0], [0.25]]], np.float32)  # [B=2, F=3, 1]
  dense = np.array([[1.0, 1.0], [0.0, -2.0]], np.float32)
  # Row 0: 6 + (2 + 3) + 0.5; row 1: -0.75 + (-6) + 0.5.
  np.testing.assert_allclose(model(emb, dense), [11.5, -6.25], rtol=1e-6)


def test_lr_without_dense_features():
  model = LR(num_fields=2, embed_dim=4, num_dense=0, rngs=nnx.Rngs(0))
  model.bias[...] = np.float32(-1.0)
  emb = np.array([[[0.5], [2.0]]], np.float32)
  np.testing.assert_allclose(model(emb, np.zeros((1, 0), np.float32)), [1.5])
  assert LR.embedding_width(16) == 1
