"""Tests for sfjax.models.dlrm."""

import itertools

import numpy as np
import pytest
from flax import nnx

from sfjax.models.dlrm import DLRM, num_interactions, pairwise_dot_interactions

B, F, D = 4, 3, 4


def test_pairwise_dots_equal_a_double_loop_in_upper_triangle_order():
  vectors = np.random.default_rng(0).standard_normal((B, 5, D)).astype(np.float32)
  expected = np.stack([np.sum(vectors[:, i] * vectors[:, j], -1)
                       for i, j in itertools.combinations(range(5), 2)], axis=1)
  out = pairwise_dot_interactions(vectors)
  assert out.shape == (B, 10)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_interaction_counts():
  assert num_interactions(26, 13) == 27 * 26 // 2  # Criteo: 26 fields + the dense vector
  assert num_interactions(26, 0) == 26 * 25 // 2
  assert num_interactions(1, 5) == 1
  assert num_interactions(1, 0) == 0


def test_top_mlp_input_is_dense_vector_plus_interactions():
  with_dense = nnx.eval_shape(lambda: DLRM(num_fields=F, embed_dim=D, num_dense=2, mlp_dims=(5,),
                                           bottom_mlp_dims=(3,), rngs=nnx.Rngs(0)))
  assert with_dense.bottom.out_features == D
  assert with_dense.top.hidden[0].kernel.shape == (D + num_interactions(F, 2), 5)
  no_dense = nnx.eval_shape(lambda: DLRM(num_fields=F, embed_dim=D, num_dense=0, mlp_dims=(5,),
                                         rngs=nnx.Rngs(0)))
  assert no_dense.bottom is None
  assert no_dense.top.hidden[0].kernel.shape == (num_interactions(F, 0), 5)


def test_logit_depends_on_embeddings_only_through_dot_products():
  model = DLRM(num_fields=F, embed_dim=D, num_dense=2, mlp_dims=(5,), rngs=nnx.Rngs(0))
  # Silence the bottom MLP (z = ReLU(0) = 0): the top MLP then sees only field-field dots
  # (and z = 0), which a common rotation Q of all field vectors leaves unchanged.
  last = model.bottom.hidden[-1]
  last.kernel[...] = np.zeros_like(last.kernel[...])
  last.bias[...] = np.zeros_like(last.bias[...])
  rng = np.random.default_rng(1)
  emb = rng.standard_normal((B, F, D)).astype(np.float32)
  dense = rng.standard_normal((B, 2)).astype(np.float32)
  q, _ = np.linalg.qr(rng.standard_normal((D, D)))
  rotated = (emb @ q.astype(np.float32)).astype(np.float32)
  np.testing.assert_allclose(model(rotated, dense), model(emb, dense), rtol=1e-4, atol=1e-5)
  assert not np.allclose(model(2.0 * emb, dense), model(emb, dense))


def test_a_single_field_without_dense_is_rejected():
  with pytest.raises(ValueError, match=r"dlrm: needs at least two vectors"):
    DLRM(num_fields=1, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0))
