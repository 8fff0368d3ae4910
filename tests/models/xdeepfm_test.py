"""Tests for sfjax.models.xdeepfm."""

import numpy as np
from flax import nnx

from sfjax.models.xdeepfm import CIN, XDeepFM

B, F, D = 4, 3, 4


def _np_cin(cin, x0):
  x, pooled = x0, []
  for kernel in cin.kernels:
    w = np.asarray(kernel[...])  # [H_k, H_{k-1}, F]
    nxt = np.zeros((x0.shape[0], w.shape[0], x0.shape[2]))
    for n in range(w.shape[0]):
      for h in range(w.shape[1]):
        for m in range(w.shape[2]):
          nxt[:, n] += w[n, h, m] * x[:, h] * x0[:, m]
    x = nxt
    pooled.append(x.sum(-1))
  return np.concatenate(pooled, axis=1)


def test_cin_matches_explicit_loops():
  cin = CIN(F, (3, 2), rngs=nnx.Rngs(0))
  assert [k[...].shape for k in cin.kernels] == [(3, F, F), (2, 3, F)]
  assert cin.out_features == 5
  x0 = np.random.default_rng(0).standard_normal((B, F, D)).astype(np.float32)
  np.testing.assert_allclose(cin(x0), _np_cin(cin, x0), rtol=1e-4, atol=1e-5)


def test_first_order_column_enters_linearly():
  model = XDeepFM(num_fields=F, embed_dim=D, num_dense=2, mlp_dims=(5,), cin_dims=(3,),
                  rngs=nnx.Rngs(0))
  rng = np.random.default_rng(1)
  emb = rng.standard_normal((B, F, D + 1)).astype(np.float32)
  dense = rng.standard_normal((B, 2)).astype(np.float32)
  shifted = emb.copy()
  shifted[..., D] += np.array([1.0, -0.5, 0.25], np.float32)
  np.testing.assert_allclose(model(shifted, dense) - model(emb, dense), np.full(B, 0.75),
                             rtol=1e-5, atol=1e-5)
