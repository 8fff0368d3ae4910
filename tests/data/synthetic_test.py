"""Tests for the synthetic Criteo-like row sampler and data set."""

import gzip
import itertools
import types

import chex
import numpy as np
import pytest

from sfjax.core import metrics
from sfjax.data.generated import planted, synthetic

CHUNK = synthetic._CHUNK_ROWS





def test_cardinalities_are_the_criteo_kaggle_ones():
  # Sum and extremes from data/ctr_dataset_facts.json (criteo_kaggle_total_rows).
  cards = synthetic._CRITEO_KAGGLE_CARDINALITIES
  assert len(cards) == 26 and sum(cards) == 33762577
  assert (cards[2], cards[8], cards[19]) == (10131227, 3, 4)


def test_spec_scales_cardinalities(data):
  rows = data.spec.field_rows
  assert data.spec.num_fields == 26 and data.spec.num_dense == 13
  assert rows[2] == 10131 and rows[3] == 2203 and rows[8] == 4  # round(card * 1e-3), min 4
  assert rows == tuple(max(4, round(c * 1e-3)) for c in synthetic._CRITEO_KAGGLE_CARDINALITIES)
  assert data.spec.fields[0].name == "C1" and data.stats == {"bad_lines": 0}


def test_rows_have_canonical_dtypes_and_ranges(data):
  rows = data.generate_rows("train", 0, 5000)
  batch, probs = data.generate("train", 0, 5000)
  chex.assert_shape([batch.ids, batch.dense, rows.dense_counts], [(5000, 26), (5000, 13), (5000, 13)])
  assert batch.ids.dtype == np.int64 and batch.dense.dtype == np.float32 and probs.dtype == np.float64
  assert np.all(batch.ids >= 0) and np.all(batch.ids < np.asarray(data.spec.field_rows))
  assert rows.dense_counts.dtype == np.int64 and rows.dense_counts.min() >= 0
  assert (rows.dense_counts == 0).mean() > 0.05 and rows.dense_counts.max() > 1000  # zeros and heavy tails
  np.testing.assert_allclose(batch.dense, np.log1p(rows.dense_counts), rtol=1e-6)
  assert set(np.unique(batch.labels)) == {0.0, 1.0} and np.all(batch.mask == 1)
  assert np.all((probs > 0) & (probs < 1))


def test_same_seed_same_rows_other_seed_other_rows(data, small_config):
  again = synthetic.SyntheticCTR(small_config(), seed=0)
  other = synthetic.SyntheticCTR(small_config(), seed=1)
  a, b, c = (d.generate_rows("train", 100, 2000) for d in (data, again, other))
  chex.assert_trees_all_equal(a, b)
  assert not np.array_equal(a.ids, c.ids) and not np.allclose(a.probs, c.probs)


def test_any_range_equals_the_slice_of_a_bigger_one(data):
  big = data.generate_rows("eval", 0, CHUNK + 700)
  part = data.generate_rows("eval", CHUNK - 300, 800)  # straddles a chunk boundary
  chex.assert_trees_all_equal(part, synthetic.SyntheticRows(*(a[CHUNK - 300:CHUNK + 500] for a in big)))
  chex.assert_trees_all_equal(data.chunk("eval", 1), data.generate_rows("eval", CHUNK, CHUNK))
  empty = data.generate_rows("eval", 5, 0)
  chex.assert_shape([empty.ids, empty.dense_counts, empty.labels], [(0, 26), (0, 13), (0,)])


def test_train_and_eval_streams_differ(data):
  train, eval_ = data.generate_rows("train", 0, 1000), data.generate_rows("eval", 0, 1000)
  assert not np.array_equal(train.ids, eval_.ids)


def test_probabilities_are_the_planted_model_of_the_row(data):
  rows = data.generate_rows("train", 0, 3000)
  logits = data.planted.bias + planted.logit_components(data.planted, rows.ids, rows.dense_counts).sum(0)
  np.testing.assert_allclose(rows.probs, metrics.sigmoid(logits), rtol=1e-12)


def test_sample_rows_draws_labels_after_the_features(data):
  # The calibration sample relies on this: features alone consume the same draws.
  rows = synthetic._sample_rows(data.sampler, data.planted, np.random.default_rng(11), 500)
  ids, counts = synthetic._sample_features(data.sampler, np.random.default_rng(11), 500)
  np.testing.assert_array_equal(rows.ids, ids)
  np.testing.assert_array_equal(rows.dense_counts, counts)
  np.testing.assert_array_equal(rows.probs, planted.click_probabilities(data.planted, ids, counts))


def test_id_frequencies_follow_a_power_law_with_scattered_hot_ids(data, small_config):
  ids = data.generate_rows("train", 0, 100_000).ids[:, 2]  # C3: 10131 rows
  counts = np.bincount(ids, minlength=10131)
  top = np.argsort(-counts)[:101]
  # Zipf 1.1 over 10131 ids: the top 1% hold ~60% of occurrences (uniform: 1%).
  assert counts[top].sum() / ids.size > 0.45
  hot = np.sort(top[:20])
  assert np.min(np.diff(hot)) > 1 and hot[-1] - hot[0] > 5000  # not a contiguous block
  uniform = synthetic.SyntheticCTR(small_config(zipf_exponent=0.0), seed=0).generate_rows("train", 0, 100_000).ids
  flat = np.bincount(uniform[:, 2], minlength=10131)
  assert np.sort(flat)[-101:].sum() / uniform.shape[0] < 0.03


def test_power_law_rank_probabilities_match_the_bounded_law():
  n, s = np.array([1000]), 1.1
  ranks = synthetic.bounded_power_law_ranks(np.random.default_rng(0).random((200_000, 1)), n, s)
  assert ranks.min() == 0 and ranks.max() <= 999
  def cdf(x):  # continuous law on [1, n+1)
    return (x ** (1 - s) - 1) / (1001 ** (1 - s) - 1)

  for r in (0, 1, 10):
    expected = cdf(r + 2.0) - cdf(r + 1.0)
    assert abs(np.mean(ranks == r) - expected) < 4 * np.sqrt(expected / 200_000)
  assert np.all(synthetic.bounded_power_law_ranks(np.array([[0.0, 1 - 1e-16]]), np.array([7, 7]), 1.0) < 7)


@pytest.mark.parametrize("n", [1, 2, 3, 16, 97, 1000, 10131])
def test_affine_permutation_is_a_bijection(n):
  a, b = synthetic._affine_permutation(np.random.default_rng(n), n)
  ids = (a * np.arange(n) + b) % n
  assert np.array_equal(np.sort(ids), np.arange(n))


def test_mean_ctr_and_oracle_are_criteo_like(data):
  rows = data.generate_rows("eval", 0, 20000)
  assert 0.22 < rows.labels.mean() < 0.28 and 0.23 < rows.probs.mean() < 0.27
  oracle = data.oracle["eval"]
  assert 0.75 < oracle["auc"] < 0.83
  assert data.oracle is data.oracle  # cached
  np.testing.assert_allclose(oracle["auc"], metrics.auc(rows.labels, rows.probs))
  base = np.full_like(rows.probs, rows.labels.mean())
  assert oracle["logloss"] < metrics.logloss(rows.labels, base) - 0.05


def test_eval_batches_pad_the_last_batch(data):
  batches = list(data.eval_batches("eval", 7000))
  assert [b.size for b in batches] == [7000, 7000, 7000]
  last = batches[-1]
  assert last.mask.sum() == 20000 - 14000
  real = slice(0, 6000)
  pad = slice(6000, None)
  assert np.all(last.mask[real] == 1) and np.all(last.mask[pad] == 0)
  assert not last.ids[pad].any() and not last.dense[pad].any() and not last.labels[pad].any()
  full, _ = data.generate("eval", 0, 20000)
  np.testing.assert_array_equal(np.concatenate([b.ids for b in batches])[:20000], full.ids)


def test_train_batches_cover_each_epoch_and_reshuffle(small_config):
  data = synthetic.SyntheticCTR(small_config(num_train=17000), seed=0)  # one chunk and a part
  stream = data.train_batches(batch_size=1000, seed=5)
  first = [next(stream) for _ in range(17)]  # exactly the first epoch
  second = [next(stream) for _ in range(17)]
  assert all(b.size == 1000 and b.mask.all() for b in first + second)
  rows = data.generate_rows("train", 0, 17000)
  def key(batches):
    return np.sort(np.concatenate([b.ids[:, 2] * 10**6 + b.ids[:, 3] for b in batches]))

  np.testing.assert_array_equal(key(first), np.sort(rows.ids[:, 2] * 10**6 + rows.ids[:, 3]))
  np.testing.assert_array_equal(key(first), key(second))
  assert not np.array_equal(first[0].ids, second[0].ids)  # another order per epoch
  again = list(itertools.islice(data.train_batches(1000, seed=5), 2))
  chex.assert_trees_all_equal(again, first[:2])


def test_train_batches_repeat_a_tiny_epoch(small_config):
  data = synthetic.SyntheticCTR(small_config(num_train=300), seed=0)
  batches = list(itertools.islice(data.train_batches(512, seed=0), 3))
  assert [b.size for b in batches] == [512, 512, 512]
  assert len({tuple(r) for r in np.concatenate([b.ids for b in batches]).tolist()}) <= 300


def test_unknown_split_and_bad_arguments_raise(data):
  with pytest.raises(ValueError, match="'test'"):
    data.generate("test", 0, 10)
  with pytest.raises(ValueError, match="'valid'"):
    next(data.eval_batches("valid", 10))
  with pytest.raises(ValueError, match="'dev'"):
    data.write_criteo("/tmp/unused.tsv", "dev", 1)
  with pytest.raises(ValueError, match="batch_size"):
    next(data.train_batches(0, seed=0))
  with pytest.raises(ValueError, match="start"):
    data.generate("train", -1, 10)


def test_config_errors_name_the_key(small_config):
  with pytest.raises(ValueError, match="data.synthetic.zipf_exponent"):
    synthetic.SyntheticCTR(small_config(zipf_exponent=-1.0), seed=0)
  with pytest.raises(ValueError, match="data.synthetic.planted_dim"):
    synthetic.SyntheticCTR(small_config(planted_dim=0), seed=0)
  partial = types.SimpleNamespace(num_train=10, num_eval=10, cardinality_scale=1e-3, min_rows=4, zipf_exponent=1.1,
                                  planted_dim=8)
  with pytest.raises(ValueError, match="data.synthetic.num_dense"):
    synthetic.SyntheticCTR(partial, seed=0)


def test_plain_object_config_and_no_dense_features():
  cfg = types.SimpleNamespace(num_train=100, num_eval=5000, cardinality_scale=1e-4, min_rows=2, zipf_exponent=1.3,
                              planted_dim=4, num_dense=0)
  data = synthetic.SyntheticCTR(cfg, seed=7)
  batch, probs = data.generate("train", 0, 5000)
  chex.assert_shape([batch.ids, batch.dense], [(5000, 26), (5000, 0)])
  assert min(data.spec.field_rows) == 2 and 0.2 < probs.mean() < 0.3
  assert 0.7 < data.oracle["eval"]["auc"] < 0.88


def test_interaction_share_is_optional_checked_and_plants_stronger_pairs():
  cfg = types.SimpleNamespace(num_train=100, num_eval=5000, cardinality_scale=1e-4, min_rows=2,
                              zipf_exponent=1.3, planted_dim=4, num_dense=0)
  assert synthetic.SyntheticConfig.from_any(cfg).interaction_share is None  # the default mix
  default = synthetic.SyntheticCTR(cfg, seed=7)
  cfg.interaction_share = 0.6
  strong = synthetic.SyntheticCTR(cfg, seed=7)
  rows = strong.generate_rows("train", 0, 5000)
  chex.assert_trees_all_equal(rows.ids, default.generate_rows("train", 0, 5000).ids)
  parts = planted.logit_components(strong.planted, rows.ids, rows.dense_counts)
  first, fm, _ = planted.component_shares(0.6)  # no dense features: the two renormalised
  assert np.var(parts[1]) / np.var(parts, axis=1).sum() == pytest.approx(fm / (first + fm),
                                                                         abs=0.02)
  assert 0.7 < strong.oracle["eval"]["auc"] < 0.88  # calibrated to the same oracle
  for bad in (1.5, -0.1, "x"):
    cfg.interaction_share = bad
    with pytest.raises(synthetic.ConfigError, match="data.synthetic.interaction_share"):
      synthetic.SyntheticConfig.from_any(cfg)


def test_generates_100k_rows(data):
  batch, probs = data.generate("train", 0, 100_000)
  assert batch.size == 100_000 and np.isfinite(probs).all()


@pytest.mark.parametrize("suffix", [".tsv", ".tsv.gz"])
def test_write_criteo_round_trips(data, tmp_path, suffix):
  path = str(tmp_path / ("rows" + suffix))
  data.write_criteo(path, "eval", 1500)
  with (gzip.open if suffix.endswith(".gz") else open)(path, "rt") as f:
    lines = f.read().splitlines()
  rows = data.generate_rows("eval", 0, 1500)
  assert len(lines) == 1500
  cols = [line.split("\t") for line in lines]
  assert {len(c) for c in cols} == {40}
  assert all(len(v) >= 8 for v in cols[0][14:])
  np.testing.assert_array_equal([int(c[0]) for c in cols], rows.labels.astype(int))
  np.testing.assert_array_equal([[int(v) for v in c[1:14]] for c in cols], rows.dense_counts)
  np.testing.assert_array_equal([[int(v, 16) for v in c[14:]] for c in cols], rows.ids)


def test_test_split_is_opt_in_held_out_and_deterministic(data, small_config):
  assert data.eval_splits == ("eval",)
  with pytest.raises(ValueError, match="'test'"):
    data.split_size("test")
  with_test = synthetic.SyntheticCTR(small_config(test_rows=1000), seed=0)
  assert with_test.eval_splits == ("eval", "test") and with_test.split_size("test") == 1000
  batches = list(with_test.eval_batches("test", 400))
  assert [int(b.mask.sum()) for b in batches] == [400, 400, 200]
  test_rows = with_test.generate_rows("test", 0, 1000)
  np.testing.assert_array_equal(np.concatenate([b.ids for b in batches])[:1000], test_rows.ids)
  # Its own stream: neither eval nor train rows, and eval rows are unchanged by it.
  assert not np.array_equal(test_rows.ids, with_test.generate_rows("eval", 0, 1000).ids)
  chex.assert_trees_all_equal(with_test.generate_rows("eval", 0, 500), data.generate_rows("eval", 0, 500))
  assert set(with_test.oracle) == {"eval", "test"} and 0.6 < with_test.oracle["test"]["auc"] < 0.95


def test_test_rows_is_optional_and_checked():
  cfg = types.SimpleNamespace(num_train=10, num_eval=10, cardinality_scale=1e-3, min_rows=4,
                              zipf_exponent=1.1, planted_dim=2, num_dense=13)
  assert synthetic.SyntheticConfig.from_any(cfg).test_rows == 0  # configs written before it
  cfg.test_rows = -1
  with pytest.raises(synthetic.ConfigError, match="data.synthetic.test_rows"):
    synthetic.SyntheticConfig.from_any(cfg)
