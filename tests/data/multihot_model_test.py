"""Tests for the planted multi-hot click model (`sfjax.data.generated.multihot_model`)."""

import numpy as np
import pytest

from sfjax.core import feature_layout as fl
from sfjax.data.generated import multihot_model as mm

# user (4 rows), item (5 rows), one weighted sum bag of 3 over tag (6 rows), a history of 2.
LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 4), fl.TableSpec("item", 5), fl.TableSpec("tag", 6)),
    (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item"),
     fl.FeatureSpec("tags", "tag", "multi_hot", 3, "mean", weighted=True),
     fl.FeatureSpec("history", "item", "sequence", 2)))
ROLES = mm.FeatureRoles(one_hot=(0, 1), bags=((2, 0),), target=1, history=3)


def _model():
  ones = np.ones(3, np.int64)
  return mm.init_multihot_model(0, LAYOUT, perm_mul=ones, perm_add=0 * ones, item_table=1,
                                num_dense=2, planted_dim=3)


def test_parts_by_hand():
  model = _model()
  # Columns: user | item | tags x3 | history x2.
  ids = np.array([[1, 2, 0, 5, -1, 4, -1], [3, 0, -1, -1, -1, 1, 2]])
  weights = np.array([[1, 1, 2.0, 0.5, 0, 1, 0], [1, 1, 0, 0, 0, 1, 1]], np.float32)
  dense = np.array([[1.0, -2.0], [0.0, 0.5]], np.float32)
  parts = mm.multihot_logit_parts(model, LAYOUT, ROLES, ids, weights, dense)
  user, item, tag = 0, 4, 9  # table offsets
  w, v, u = model.first_order, model.vectors, model.unit_item
  np.testing.assert_allclose(parts[0], [w[user + 1] + w[item + 2], w[user + 3] + w[item + 0]], rtol=1e-6)
  pooled = (2.0 * v[tag + 0] + 0.5 * v[tag + 5]) / 2.5  # weighted mean
  np.testing.assert_allclose(parts[1], [pooled @ v[user + 1], 0.0], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(parts[2], [u[2] @ u[4], max(u[0] @ u[1], u[0] @ u[2])], rtol=1e-5)
  np.testing.assert_allclose(parts[3], dense.astype(np.float64) @ model.dense_weights, rtol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, rtol=1e-5)


def test_popularity_decay_shrinks_rare_rows():
  model = _model()  # identity permutations: id = rank
  rng = np.random.default_rng([0, mm._TABLE_STREAM, 2])
  rng.standard_normal(6)
  raw = rng.standard_normal((6, 3)) / np.sqrt(3)
  np.testing.assert_allclose(model.vectors[9:15], raw * (np.arange(6) + 1.0)[:, None] ** -0.5, rtol=1e-6)


def test_calibration_hits_ctr_and_zero_share_removes_part():
  rng = np.random.default_rng(0)
  parts = rng.normal(size=(4, 20000)) * np.array([[1.0], [3.0], [0.5], [2.0]]) + 7.0
  model = mm.calibrate_multihot_model(_model(), parts, (0.25, 0.25, 0.0, 0.5), 2.0, 0.3)
  probs = mm.multihot_probabilities(model, parts)
  assert probs.mean() == pytest.approx(0.3, abs=1e-6)
  assert model.part_weights[2] == 0.0
  z = model.part_weights @ (parts - model.part_means[:, None])
  assert z.std() == pytest.approx(2.0 * np.sqrt(0.25 + 0.25 + 0.5), rel=0.02)
  constant = parts.copy()
  constant[3] = 1.0  # a constant part (no dense features) drops out
  assert mm.calibrate_multihot_model(_model(), constant, (1, 1, 1, 1), 1.0, 0.5).part_weights[3] == 0.0


@pytest.mark.parametrize("tag_rows,tag_mul,tag_add", [(6, 5, 2), (2, 1, 1), (1, 1, 0)])
def test_popularity_decay_follows_each_tables_rank_to_id_bijection(tag_rows, tag_mul, tag_add):
  layout = fl.FeatureLayout(LAYOUT.tables[:2] + (fl.TableSpec("tag", tag_rows),), LAYOUT.features)
  mul, add = np.array([3, 2, tag_mul]), np.array([1, 3, tag_add])  # id = (mul * rank + add) mod rows
  model = mm.init_multihot_model(0, layout, perm_mul=mul, perm_add=add, item_table=1,
                                 num_dense=2, planted_dim=3)
  assert (model.first_order.dtype, model.vectors.dtype, model.unit_item.dtype) == (
      np.float32, np.float32, np.float32)
  np.testing.assert_array_equal(  # reproducible: a stream of the seed's own
      model.dense_weights, np.random.default_rng([0, mm._DENSE_STREAM]).standard_normal(2))
  np.testing.assert_array_equal(model.part_means, np.zeros(4))
  np.testing.assert_array_equal(model.part_weights, np.ones(4))
  assert model.bias == 0.0
  start = 0
  for t, rows in enumerate((4, 5, tag_rows)):
    rng = np.random.default_rng([0, mm._TABLE_STREAM, t])
    raw_first = rng.standard_normal(rows)
    raw_vectors = rng.standard_normal((rows, 3)) / np.sqrt(3)
    ranks = np.arange(rows)
    ids = (mul[t] * ranks + add[t]) % rows
    decay = (ranks + 1.0) ** -0.5  # the most frequent id (rank 0) keeps its whole effect
    np.testing.assert_allclose(model.first_order[start + ids], raw_first[ids] * decay, rtol=1e-6)
    np.testing.assert_allclose(model.vectors[start + ids], raw_vectors[ids] * decay[:, None],
                               rtol=1e-6)
    start += rows


def test_pooling_sqrtn_and_weights_that_sum_to_zero_or_less_than_one():
  v = np.array([[[1.0, 2.0], [3.0, -1.0], [5.0, 5.0]]])  # [1, 3, 2]
  w = np.array([[3.0, 4.0, 0.0]])
  np.testing.assert_allclose(mm._pool(v, w, "sqrtn"), [[(3 + 12) / 5.0, (6 - 4) / 5.0]])
  np.testing.assert_allclose(mm._pool(v, w, "sum"), [[15.0, 2.0]])
  half = np.array([[0.25, 0.25, 0.0]])  # a mean over weights summing to 0.5 doubles the sum
  np.testing.assert_allclose(mm._pool(v, half, "mean"), [[2.0, 0.5]])
  opposite = np.array([[1.0, -1.0, 0.0]])  # weights summing to 0: the sum, undivided
  np.testing.assert_allclose(mm._pool(v, opposite, "mean"), [[-2.0, 3.0]])
  np.testing.assert_allclose(mm._pool(v, np.zeros((1, 3)), "sqrtn"), [[0.0, 0.0]])


def test_bag_parts_add_up_and_history_reads_id_zero_and_an_empty_history_adds_nothing():
  layout = fl.FeatureLayout(
      LAYOUT.tables,
      LAYOUT.features + (fl.FeatureSpec("more", "tag", "multi_hot", 1, "sum"),))
  roles = mm.FeatureRoles(one_hot=(0, 1), bags=((2, 0), (4, 1)), target=1, history=3)
  model = _model()
  # Columns: user | item | tags x3 | history x2 | more.
  ids = np.array([[1, 3, 0, -1, -1, 0, -1, 2], [2, 1, -1, -1, -1, -1, -1, 4]])
  weights = np.array([[1, 1, 1, 0, 0, 1, 0, 1], [1, 1, 0, 0, 0, 0, 0, 1]], np.float32)
  parts = mm.multihot_logit_parts(model, layout, roles, ids, weights, np.zeros((2, 2), np.float32))
  user, item, tag = 0, 4, 9
  v, u = model.vectors, model.unit_item
  np.testing.assert_allclose(parts[1], [v[tag + 0] @ v[user + 1] + v[tag + 2] @ v[item + 3],
                                        v[tag + 4] @ v[item + 1]], rtol=1e-5)
  np.testing.assert_allclose(parts[2], [u[3] @ u[0], 0.0], rtol=1e-5, atol=1e-12)


def test_expit_is_the_logistic_function():
  x = np.array([-30.0, -0.5, 0.0, 0.5, 2.0, 30.0])
  np.testing.assert_allclose(mm._expit(x), 1.0 / (1.0 + np.exp(-x)), rtol=1e-12)
