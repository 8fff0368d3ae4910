"""Tests for the planted click model: tables, logit components, calibration."""

import itertools

import numpy as np
import pytest

from sfjax.core import metrics
from sfjax.data.generated import planted, synthetic


def tiny_model(seed=0, perm_mul=(1, 1, 3), perm_add=(0, 0, 0), num_dense=2):
  """Three small fields (3, 5, 7 rows), K = 4."""
  return planted.init_planted_model(seed, np.array([3, 5, 7]), np.array(perm_mul), np.array(perm_add), num_dense, 4)


def test_popularity_decay_values():
  np.testing.assert_allclose(planted._popularity_decay(np.array([0, 1, 15])), [1.0, 2.0**-0.75, 16.0**-0.75],
                             rtol=1e-6)
  assert planted._popularity_decay(np.array([3])).dtype == np.float32


def test_tables_are_per_field_functions_of_the_seed_with_the_decay_folded_in():
  a, b = tiny_model(perm_add=(0, 0, 0)), tiny_model(perm_add=(2, 1, 5))
  assert a.first_order.shape == (15,) and a.factors.shape == (15, 4) and a.bias == 0.0
  np.testing.assert_array_equal(a.table_offsets, [0, 3, 8])
  np.testing.assert_allclose(a.factor_sqnorm, np.sum(a.factors**2, axis=1), rtol=1e-6)
  for f, n in enumerate((3, 5, 7)):
    rows = slice(a.table_offsets[f], a.table_offsets[f] + n)
    ids = np.arange(n)
    # Undoing each permutation's decay gives the same raw values: they depend on (seed, f) only.
    raw_a = a.first_order[rows] / planted._popularity_decay(((ids - a.rank_add[f]) * a.rank_mul[f]) % n)
    raw_b = b.first_order[rows] / planted._popularity_decay(((ids - b.rank_add[f]) * b.rank_mul[f]) % n)
    np.testing.assert_allclose(raw_a, raw_b, rtol=1e-6)
  assert not np.allclose(tiny_model(seed=1).first_order, a.first_order)


def test_logit_components_match_a_pairwise_fm():
  model = tiny_model()._replace(bias=-0.3)
  ids = np.array(list(itertools.product(range(3), range(5), range(7))))  # [105, 3]: every id combination
  counts = np.random.default_rng(0).integers(0, 50, size=(ids.shape[0], 2))
  rows = ids + model.table_offsets
  w, v = model.first_order[rows], model.factors[rows].astype(np.float64)  # [N, F], [N, F, K]
  fm = sum(np.sum(v[:, f] * v[:, g], axis=1) for f, g in itertools.combinations(range(3), 2))
  dense = np.log1p(counts) @ model.dense_weights
  parts = planted.logit_components(model, ids, counts)
  np.testing.assert_allclose(parts, np.stack([w.sum(1), fm, dense]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(planted.click_probabilities(model, ids, counts),
                             metrics.sigmoid(parts.sum(0) - 0.3), rtol=1e-12)


def test_planted_rank_inverts_the_id_permutation(data):
  p, s = data.planted, data.sampler
  ranks = np.tile(np.arange(4), (26, 1)).T  # [4, F]
  ids = (s.perm_mul * ranks + s.perm_add) % s.field_rows
  np.testing.assert_array_equal(((ids - p.rank_add) * p.rank_mul) % p.field_rows, ranks)


def test_huge_fields_hash_into_a_capped_table(small_config):
  data = synthetic.SyntheticCTR(small_config(cardinality_scale=0.03), seed=3)
  assert data.spec.field_rows[2] > planted._PLANTED_TABLE_CAP and data.planted.hashed[2]
  assert data.planted.first_order.size < data.spec.total_rows
  rows = data.generate_rows("train", 0, 4000)
  logits = data.planted.bias + planted.logit_components(data.planted, rows.ids, rows.dense_counts).sum(0)
  np.testing.assert_allclose(rows.probs, metrics.sigmoid(logits), rtol=1e-12)
  assert 0.2 < rows.probs.mean() < 0.3


def test_expected_auc_matches_pair_enumeration():
  rng = np.random.default_rng(0)
  p = rng.uniform(0.05, 0.9, size=40)
  s = np.round(rng.normal(size=40), 1)  # with ties
  i, j = np.meshgrid(np.arange(40), np.arange(40), indexing="ij")
  off = i != j
  win = (s[i] > s[j]) + 0.5 * (s[i] == s[j])
  brute = np.sum((p[i] * (1 - p[j]) * win)[off]) / np.sum((p[i] * (1 - p[j]))[off])
  np.testing.assert_allclose(planted._expected_auc(p, s), brute, rtol=1e-12)


def test_calibrate_logits_hits_both_targets():
  z = np.random.default_rng(1).standard_normal(20000)
  scale, bias = planted._calibrate_logits(z, 0.3, 0.75)
  p = metrics.sigmoid(scale * z + bias)
  np.testing.assert_allclose(p.mean(), 0.3, atol=1e-6)
  np.testing.assert_allclose(planted._expected_auc(p, z), 0.75, atol=1e-4)


@pytest.mark.parametrize("num_dense", [0, 2])
def test_calibrated_model_hits_the_targets_on_its_sample(num_dense):
  rng = np.random.default_rng(2)
  ids = np.stack([rng.integers(0, n, size=20000) for n in (3, 5, 7)], axis=1)
  counts = rng.integers(0, 100, size=(20000, num_dense))
  model = planted.calibrate_planted_model(tiny_model(num_dense=num_dense), ids, counts)
  p = planted.click_probabilities(model, ids, counts)
  np.testing.assert_allclose(p.mean(), planted._TARGET_CTR, atol=1e-4)
  np.testing.assert_allclose(planted._expected_auc(p, p), planted._TARGET_AUC, atol=1e-3)
  parts = planted.logit_components(model, ids, counts)
  shares = np.var(parts, axis=1) / np.sum(np.var(parts, axis=1))
  expected = np.asarray(planted._COMPONENT_SHARES) if num_dense else np.r_[planted._COMPONENT_SHARES[:2], 0.0]
  np.testing.assert_allclose(shares, expected / expected.sum(), rtol=1e-4, atol=1e-9)


def test_component_shares_default_and_interaction_share():
  assert planted.component_shares() is planted._COMPONENT_SHARES  # the default, exactly
  first, fm, dense = planted.component_shares(0.5)
  assert fm == 0.5 and first + fm + dense == pytest.approx(1.0)
  assert first / dense == pytest.approx(0.65 / 0.23)  # the other two keep their ratio
  assert planted.component_shares(0.0)[1] == 0.0
  for bad in (-0.1, 1.5, float("nan")):
    with pytest.raises(ValueError, match="interaction_share"):
      planted.component_shares(bad)


@pytest.mark.parametrize("share", [0.5, 0.0])
def test_calibration_plants_the_given_interaction_share(share):
  rng = np.random.default_rng(3)
  ids = np.stack([rng.integers(0, n, size=20000) for n in (3, 5, 7)], axis=1)
  counts = rng.integers(0, 100, size=(20000, 2))
  model = planted.calibrate_planted_model(tiny_model(), ids, counts,
                                          planted.component_shares(share))
  p = planted.click_probabilities(model, ids, counts)
  np.testing.assert_allclose(planted._expected_auc(p, p), planted._TARGET_AUC, atol=1e-3)
  parts = planted.logit_components(model, ids, counts)
  shares = np.var(parts, axis=1) / np.sum(np.var(parts, axis=1))
  np.testing.assert_allclose(shares, planted.component_shares(share), rtol=1e-4, atol=1e-9)


def test_oracle_beats_noisier_scorers(data):
  rows = data.generate_rows("eval", 0, 20000)
  logits = np.log(rows.probs) - np.log1p(-rows.probs)
  noisy = logits + np.random.default_rng(0).normal(scale=1.0, size=logits.shape)
  assert metrics.auc(rows.labels, noisy) < data.oracle["eval"]["auc"] - 0.02
  # Every component carries signal: dropping one costs AUC.
  parts = planted.logit_components(data.planted, rows.ids, rows.dense_counts)
  for k in range(3):
    assert metrics.auc(rows.labels, parts.sum(0) - parts[k]) < data.oracle["eval"]["auc"] - 0.005


def test_pair_logit_variance_by_hand():
  model = tiny_model()
  rng = np.random.default_rng(1)
  ids = np.stack([rng.integers(0, n, 500) for n in (3, 5, 7)], axis=1)
  variance = planted.pair_logit_variance(model, ids)
  v = model.factors[ids + model.table_offsets].astype(np.float64)  # [N, F, K]
  assert variance.shape == (3, 3)
  np.testing.assert_allclose(np.diag(variance), 0.0)
  np.testing.assert_allclose(variance, variance.T)
  for f, g in itertools.combinations(range(3), 2):
    np.testing.assert_allclose(variance[f, g], np.var(np.sum(v[:, f] * v[:, g], axis=1)), rtol=1e-10)
  # A field fixed to one id: its pairs still vary (through the other field), a pair of two fixed
  # fields does not.
  fixed = ids.copy()
  fixed[:, :2] = 0
  pair = planted.pair_logit_variance(model, fixed)
  assert pair[0, 1] < 1e-20 and pair[0, 2] > 1e-4 and pair[1, 2] > 1e-4


def test_factor_rows_apply_the_decay_of_hashed_fields(small_config):
  data = synthetic.SyntheticCTR(small_config(cardinality_scale=0.03), seed=3)
  rows = data.generate_rows("train", 0, 2000)
  v = planted._factor_rows(data.planted, rows.ids)  # [N, F, K]
  total = v.sum(axis=1)
  fm = 0.5 * (np.sum(total * total, axis=1) - np.sum(v * v, axis=(1, 2)))
  np.testing.assert_allclose(fm, planted.logit_components(data.planted, rows.ids, rows.dense_counts)[1],
                             rtol=1e-4, atol=1e-6)
