"""Tests for sfjax.models.fm."""

import itertools

import numpy as np
from flax import nnx

from sfjax.models.fm import FM, fm_pairwise


def _brute_force_pairwise(vectors):
  b, f, _ = vectors.shape
  out = np.zeros(b)
  for i, j in itertools.combinations(range(f), 2):
    out += np.sum(vectors[:, i] * vectors[:, j], axis=-1)
  return out


def test_fm_pairwise_hand_checked_case():
  # <v1,v2> = 3 - 2 = 1, <v1,v3> = 8, <v2,v3> = -4: total 5.
  vectors = np.array([[[1.0, 2.0], [3.0, -1.0], [0.0, 4.0]]], np.float32)
  np.testing.assert_allclose(fm_pairwise(vectors), [5.0])
  np.testing.assert_allclose(_brute_force_pairwise(vectors), [5.0])


def test_fm_pairwise_equals_double_loop_on_random_vectors():
  vectors = np.random.default_rng(0).standard_normal((5, 4, 3)).astype(np.float32)
  np.testing.assert_allclose(fm_pairwise(vectors), _brute_force_pairwise(vectors), rtol=1e-5,
                             atol=1e-5)


def test_fm_logit_is_bias_first_order_dense_and_pairwise():
  model = FM(num_fields=3, embed_dim=2, num_dense=1, rngs=nnx.Rngs(0))
  model.dense_linear.kernel[...] = np.array([4.0], np.float32)
  model.bias[...] = np.float32(0.25)
  vectors = np.array([[[1.0, 2.0], [3.0, -1.0], [0.0, 4.0]]], np.float32)
  weights = np.array([[[0.5], [-1.0], [2.0]]], np.float32)
  emb = np.concatenate([vectors, weights], axis=-1)  # [1, 3, 3]: weight in the last column
  # 0.25 + 1.5 + 4 * 0.5 + 5 = 8.75
  np.testing.assert_allclose(model(emb, np.array([[0.5]], np.float32)), [8.75], rtol=1e-6)
  assert FM.embedding_width(2) == 3
