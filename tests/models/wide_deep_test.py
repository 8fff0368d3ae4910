"""Tests for sfjax.models.wide_deep."""

import numpy as np
from flax import nnx

from sfjax.models.wide_deep import WideDeep

B, F, D, ND = 4, 3, 4, 2


def test_with_silent_deep_part_the_logit_is_the_wide_part():
  model = WideDeep(num_fields=F, embed_dim=D, num_dense=ND, mlp_dims=(5,), rngs=nnx.Rngs(0))
  model.mlp.out.kernel[...] = np.zeros_like(model.mlp.out.kernel[...])
  rng = np.random.default_rng(0)
  emb = rng.standard_normal((B, F, D + 1)).astype(np.float32)
  dense = rng.standard_normal((B, ND)).astype(np.float32)
  expected = emb[..., D].sum(1) + dense @ np.asarray(model.dense_linear.kernel[...])
  np.testing.assert_allclose(model(emb, dense), expected, rtol=1e-5, atol=1e-6)


def test_deep_part_sees_vectors_and_dense_but_not_first_order_weights():
  model = WideDeep(num_fields=F, embed_dim=D, num_dense=ND, mlp_dims=(5,), rngs=nnx.Rngs(0))
  assert model.mlp.hidden[0].kernel[...].shape == (F * D + ND, 5)
  rng = np.random.default_rng(1)
  emb = rng.standard_normal((B, F, D + 1)).astype(np.float32)
  dense = rng.standard_normal((B, ND)).astype(np.float32)
  shifted = emb.copy()
  shifted[:, 1, D] += 3.0
  np.testing.assert_allclose(model(shifted, dense) - model(emb, dense), np.full(B, 3.0),
                             rtol=1e-5, atol=1e-5)
