"""Pooling id columns into fields: hand-checked sums, means, sqrtn, empty bags, sequences."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.core import feature_layout as fl
from sfjax.models.behavior import pooling

LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("a", 4), fl.TableSpec("b", 4)),
    (fl.FeatureSpec("one", "a"),
     fl.FeatureSpec("bag", "b", "multi_hot", 3, "sum", weighted=True),
     fl.FeatureSpec("avg", "b", "multi_hot", 2, "mean"),
     fl.FeatureSpec("rt", "b", "multi_hot", 2, "sqrtn"),
     fl.FeatureSpec("seq", "a", "sequence", 3)))


def _inputs():
  emb = jnp.arange(2 * 11 * 2, dtype=jnp.float32).reshape(2, 11, 2)  # [B, S, E]
  w = jnp.array([[1, 2, 0.5, 0, 1, 1, 3, 4, 1, 1, 0],
                 [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]], jnp.float32)
  return emb, w


def test_poolings_by_hand():
  emb, w = _inputs()
  out = np.asarray(pooling.pool_features(LAYOUT, emb, w))  # [2, 5, 2]
  e = np.asarray(emb)
  np.testing.assert_allclose(out[0, 0], e[0, 0])
  np.testing.assert_allclose(out[0, 1], 2 * e[0, 1] + 0.5 * e[0, 2])
  np.testing.assert_allclose(out[0, 2], (e[0, 4] + e[0, 5]) / 2)
  np.testing.assert_allclose(out[0, 3], (3 * e[0, 6] + 4 * e[0, 7]) / 5.0, rtol=1e-6)
  np.testing.assert_allclose(out[0, 4], (e[0, 8] + e[0, 9]) / 2)
  # Example 1: every bag empty -> 0 (and a finite gradient).
  np.testing.assert_array_equal(out[1, 1:], 0)
  grad = jax.grad(lambda x: pooling.pool_features(LAYOUT, x, w).sum())(emb)
  chex.assert_tree_all_finite(grad)
  np.testing.assert_array_equal(np.asarray(grad)[np.asarray(w) == 0], 0)


class _SeqReader(nnx.Module):
  reads_sequences = True

  def __call__(self, fields, dense, sequences):
    (values, mask), = sequences
    return fields.sum((1, 2)) + (values.sum(-1) * mask).sum(1) * 1000 + dense.sum(1)


class _Plain(nnx.Module):
  def __call__(self, fields, dense):
    return fields.sum((1, 2)) + dense.sum(1)


def test_pooled_input_hands_sequences_only_to_a_sequence_model():
  emb, w = _inputs()
  dense = jnp.zeros((2, 0))
  plain = pooling.PooledInput(_Plain(), LAYOUT)(emb, dense, w)
  seq = pooling.PooledInput(_SeqReader(), LAYOUT)(emb, dense, w)
  e = np.asarray(emb)
  np.testing.assert_allclose(np.asarray(seq - plain)[0], 1000 * (e[0, 8].sum() + e[0, 9].sum()))
  np.testing.assert_allclose(np.asarray(seq - plain)[1], 0)  # empty history: mask all 0


def test_wrong_number_of_columns_is_an_error():
  emb, w = _inputs()
  try:
    pooling.PooledInput(_Plain(), LAYOUT)(emb[:, :5], jnp.zeros((2, 0)), w[:, :5])
  except ValueError as e:
    assert "5 id columns, the layout has 11" in str(e)
  else:
    raise AssertionError("no error")
