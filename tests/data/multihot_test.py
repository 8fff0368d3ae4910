"""Tests for the synthetic multi-hot data set (`sfjax.data.generated.multihot`)."""

import dataclasses

import chex
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core import metrics
from sfjax.core.errors import ConfigError
from sfjax.data import dataset
from sfjax.data.generated import multihot
from sfjax.train import config_check, loop


def _cfg(**overrides) -> multihot.MultihotConfig:
  """The smoke variant's block, with overrides."""
  base = multihot.MultihotConfig.from_any(ctr.get_config("multihot_smoke").data.multihot)
  return dataclasses.replace(base, **overrides)


@pytest.fixture(scope="module")
def smoke():
  return multihot.MultihotCTR(_cfg(), seed=3)


@pytest.fixture(scope="module")
def rows(smoke):
  return smoke.generate_rows("eval", 0, 2048)


def test_layout_and_spec_agree(smoke):
  layout, spec, cfg = smoke.layout, smoke.spec, smoke.config
  kinds = [f.kind for f in layout.features]
  assert kinds.count("one_hot") == 2 + cfg.num_context
  assert kinds.count("multi_hot") == cfg.num_short_bags + cfg.num_long_bags
  assert kinds.count("sequence") == 1
  assert spec.num_fields == layout.num_features
  assert spec.num_columns == (2 + cfg.num_context + cfg.num_short_bags * cfg.short_bag_capacity
                              + cfg.num_long_bags * cfg.long_bag_capacity + cfg.history_capacity)
  history = layout.features[layout.sequence_features()[0]]
  assert history.table == "item" == layout.features[1].table  # the target and history share
  assert spec.total_rows == sum(t.num_rows for t in layout.tables)
  assert any(f.weighted for f in layout.features)
  assert [f.num_rows for f in spec.fields] == [
      layout.tables[layout.table_index(f.table)].num_rows for f in layout.features]
  assert spec.has_padding


def test_padding_matches_lengths_and_weights(smoke, rows):
  layout = smoke.layout
  chex.assert_shape(rows.ids, (2048, layout.num_columns))
  chex.assert_shape(rows.weights, (2048, layout.num_columns))
  pad = rows.ids == -1
  np.testing.assert_array_equal(pad, rows.weights == 0)
  for f, spec in enumerate(layout.features):
    cols = layout.columns(f)
    position = np.arange(spec.capacity)
    np.testing.assert_array_equal(~pad[:, cols], position < rows.lengths[:, f:f + 1])
    assert rows.lengths[:, f].min() >= 1 and rows.lengths[:, f].max() <= spec.capacity
  real = ~pad
  assert np.all(rows.ids[real] < np.broadcast_to(layout.column_rows, rows.ids.shape)[real])
  assert np.all(rows.ids[real] >= 0)
  weighted = [f for f, s in enumerate(layout.features) if s.weighted]
  w = rows.weights[:, layout.columns(weighted[0])]
  assert np.unique(w[w > 0]).size > 100  # real per-id weights, not ones
  unweighted = np.ones(layout.num_columns, bool)
  unweighted[layout.columns(weighted[0])] = False
  np.testing.assert_array_equal(rows.weights[:, unweighted], real[:, unweighted].astype(np.float32))


def test_batches_carry_weights_and_pad_eval(smoke):
  train = next(smoke.train_batches(100, seed=0))
  assert train.weights is not None and train.ids.shape == (100, smoke.spec.num_columns)
  batches = list(smoke.eval_batches("eval", 1000))
  assert len(batches) == 3 and batches[-1].mask.sum() == 48  # 2048 = 2 * 1000 + 48
  assert all(b.weights is not None for b in batches)
  np.testing.assert_array_equal(batches[0].ids, smoke.generate_rows("eval", 0, 1000).ids)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_seed_is_named(seed):
  with pytest.raises(ValueError, match=r"seed must be a non-negative integer"):
    multihot.MultihotCTR(_cfg(), seed=seed)


def test_deterministic_given_seed(smoke, rows):
  again = multihot.MultihotCTR(_cfg(), seed=3).generate_rows("eval", 0, 2048)
  chex.assert_trees_all_equal(tuple(rows), tuple(again))
  other = multihot.MultihotCTR(_cfg(), seed=4).generate_rows("eval", 0, 2048)
  assert not np.array_equal(rows.ids, other.ids)
  # Any row range regenerates alone.
  part = smoke.generate_rows("eval", 100, 50)
  np.testing.assert_array_equal(part.ids, rows.ids[100:150])
  a = next(smoke.train_batches(64, seed=1))
  b = next(multihot.MultihotCTR(_cfg(), seed=3).train_batches(64, seed=1))
  chex.assert_trees_all_equal(tuple(a), tuple(b))


def test_bag_lengths_follow_config():
  ds = multihot.MultihotCTR(_cfg(short_bag_capacity=6, short_bag_mean_len=2.0, long_bag_capacity=200,
                                 long_bag_median_len=40.0, long_bag_sigma=0.5, history_capacity=10),
                            seed=0)
  lengths = ds.generate_rows("eval", 0, 8192).lengths
  names = [f.name for f in ds.layout.features]
  short = lengths[:, names.index("bag0")]
  # min(Geometric(1/2), 6): P(1) = 1/2, mean 2 - 2 * 0.5**6 = 1.96875.
  assert abs(np.mean(short == 1) - 0.5) < 0.03
  assert abs(short.mean() - 1.96875) < 0.06
  long = lengths[:, names.index("long0")]
  assert abs(np.median(long) - 40) <= 2 and long.max() <= 200
  history = lengths[:, names.index("history")]
  assert history.min() == 1 and history.max() == 10 and abs(history.mean() - 5.5) < 0.15
  assert abs(ds.stats["ids_per_example"] - lengths.sum(1).mean()) < 0.05 * lengths.sum(1).mean()


def test_oracle_is_auc_of_planted_probabilities(smoke, rows):
  oracle = smoke.oracle["eval"]
  assert oracle["auc"] > 0.75
  assert abs(rows.labels.mean() - smoke.config.target_ctr) < 0.03
  assert oracle["auc"] == pytest.approx(metrics.auc(rows.labels, rows.probs))
  assert oracle["logloss"] == pytest.approx(metrics.logloss(rows.labels, rows.probs))


def test_history_and_bag_terms_matter():
  full = multihot.MultihotCTR(_cfg(), seed=0).oracle["eval"]["auc"]
  shares = _cfg().shares
  no_history = multihot.MultihotCTR(_cfg(shares=shares[:2] + (0.0,) + shares[3:]), seed=0)
  no_bags = multihot.MultihotCTR(_cfg(shares=shares[:1] + (0.0,) + shares[2:]), seed=0)
  assert full - no_history.oracle["eval"]["auc"] > 0.02
  assert full - no_bags.oracle["eval"]["auc"] > 0.01
  # Same rows (ids), other labels: the shares change only the planted model.
  np.testing.assert_array_equal(no_history.generate_rows("eval", 0, 10).ids,
                                no_bags.generate_rows("eval", 0, 10).ids)


def test_test_split_and_bad_split():
  ds = multihot.MultihotCTR(_cfg(test_rows=1000), seed=0)
  assert ds.eval_splits == ("eval", "test") and set(ds.oracle) == {"eval", "test"}
  with pytest.raises(ValueError, match="unknown split 'valid'"):
    ds.split_size("valid")


@pytest.mark.parametrize("field,value,match", [
    ("short_bag_capacity", 0, "data.multihot.short_bag_capacity"),
    ("shares", (1.0, 1.0), "data.multihot.shares"),
    ("target_ctr", 1.5, "data.multihot.target_ctr"),
    ("item_rows", -5, "data.multihot.item_rows"),
    ("long_bag_sigma", float("nan"), "data.multihot.long_bag_sigma"),
])
def test_bad_config_names_field(field, value, match):
  c = ctr.get_config("multihot_smoke")
  c.data.multihot[field] = value
  with pytest.raises(ConfigError, match=match):
    config_check.validate(c)
  with pytest.raises(ConfigError, match=match):
    dataset.make_dataset(c.data, 0)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_trains_end_to_end_on_device_backend():
  c = ctr.get_config("multihot_smoke")
  c.train.num_devices = 1
  ds = dataset.make_dataset(c.data, c.seed)
  assert isinstance(ds, multihot.MultihotCTR)
  result, _ = loop.train_and_evaluate(c, dataset=ds)
  assert result["step"] == 30 and np.isfinite(result["loss"])
  assert 0.5 < result["eval_auc"] <= 1.0
  assert result["oracle_eval_auc"] == ds.oracle["eval"]["auc"]


@pytest.mark.parametrize("variant", ["multihot", "multihot_smoke"])
def test_shipped_variants_validate(variant):
  c = ctr.get_config(variant)
  config_check.validate(c)
  assert c.data.format == "multihot"


@pytest.mark.parametrize("value", [None, True, "3", float("inf"), 10**400, 2**70, -1, 1.5, [2]])
def test_hostile_values_name_the_field(value):
  block = ctr.get_config("multihot_smoke").data.multihot.to_dict()
  block["history_capacity"] = value
  with pytest.raises(ConfigError, match=r"^config field data\.multihot\.history_capacity: "):
    multihot.MultihotConfig.from_any(type("Cfg", (), block))
