"""Tests for sfjax.models.deepfm."""

import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
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


def _rows_and_vids(seed=0, u=5):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((u, D + 1)).astype(np.float32), rng.integers(0, u, (B, F)),
          rng.standard_normal((B, ND)).astype(np.float32))


def test_from_unique_rows_equals_the_call_on_gathered_rows_with_its_gradients():
  model = DeepFM(num_fields=F, embed_dim=D, num_dense=ND, mlp_dims=(5,), rngs=nnx.Rngs(0),
                 split_input=True)
  assert model.reads_unique_rows
  assert not DeepFM(num_fields=F, embed_dim=D, num_dense=ND, rngs=nnx.Rngs(0)).reads_unique_rows
  rows, vids, dense = _rows_and_vids()
  graphdef, params = nnx.split(model)

  def logits(params, rows, split):
    m = nnx.merge(graphdef, params)
    return m.from_unique_rows(rows, vids, dense) if split else m(rows[vids], dense)

  np.testing.assert_allclose(logits(params, rows, True), logits(params, rows, False),
                             rtol=1e-5, atol=1e-5)
  grads = [jax.grad(lambda p, r, s=s: jnp.sum(jnp.sin(logits(p, r, s))), argnums=(0, 1))(
      params, rows) for s in (True, False)]
  chex.assert_trees_all_close(grads[0], grads[1], rtol=1e-5, atol=1e-5)
  # The unique rows' gradient sums over the examples that read each row; an unread row gets 0.
  unread = np.setdiff1d(np.arange(rows.shape[0]), vids)
  np.testing.assert_array_equal(np.asarray(grads[0][1])[unread], 0.0)


def test_from_unique_rows_names_a_bad_shape():
  model = DeepFM(num_fields=F, embed_dim=D, num_dense=ND, rngs=nnx.Rngs(0), split_input=True)
  rows, vids, dense = _rows_and_vids()
  with pytest.raises(ValueError, match=r"rows must be \[U, 5\]"):
    model.from_unique_rows(rows[:, :D], vids, dense)
  with pytest.raises(ValueError, match=r"vids must be \[B, 3\]"):
    model.from_unique_rows(rows, vids[:, :2], dense)
  with pytest.raises(ValueError, match=r"dense must be \[4, 2\]"):
    model.from_unique_rows(rows, vids, dense[:, :1])
