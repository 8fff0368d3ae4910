"""Tests for sfjax.models.deepfm."""

import itertools

import numpy as np
from flax import nnx

from sfjax.models.deepfm import DeepFM

B, F, D, ND = 4, 3, 4, 2


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((B, F, D + 1)).astype(np.float32),
          rng.standard_normal((B, ND)).astype(np.float32))


def test_with_silent_mlp_deepfm_is_fm_with_dense_linear():
  model = DeepFM(num_fields=F, embed_dim=D, num_dense=ND, mlp_dims=(5,), rngs=nnx.Rngs(0))
  model.mlp.out.kernel[...] = np.zeros_like(model.mlp.out.kernel[...])
  emb, dense = _inputs()
  vectors, weights = emb[..., :D], emb[..., D]
  pairwise = sum(np.sum(vectors[:, i] * vectors[:, j], -1)
                 for i, j in itertools.combinations(range(F), 2))
  expected = weights.sum(1) + dense @ np.asarray(model.dense_linear.kernel[...]) + pairwise
  np.testing.assert_allclose(model(emb, dense), expected, rtol=1e-5, atol=1e-5)


def test_first_order_column_enters_linearly_and_vectors_reach_the_mlp():
  model = DeepFM(num_fields=F, embed_dim=D, num_dense=ND, mlp_dims=(5,), rngs=nnx.Rngs(0))
  emb, dense = _inputs()
  delta = np.array([0.5, -1.0, 2.0], np.float32)
  shifted = emb.copy()
  shifted[..., D] += delta
  np.testing.assert_allclose(model(shifted, dense) - model(emb, dense),
                             np.full(B, delta.sum()), rtol=1e-5, atol=1e-5)
  # The MLP input is [v_1..v_F, dense] (F*D + Nd wide), never the weight column.
  assert model.mlp.hidden[0].kernel[...].shape == (F * D + ND, 5)


def test_deepfm_without_dense_features():
  model = DeepFM(num_fields=F, embed_dim=D, num_dense=0, mlp_dims=(5,), rngs=nnx.Rngs(0))
  emb, _ = _inputs()
  out = model(emb, np.zeros((B, 0), np.float32))
  assert out.shape == (B,) and np.all(np.isfinite(out))
