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
  with pytest.raises(ConfigError, match=r"^config field data\.multihot\.history_capacity: "):
    multihot.MultihotConfig.from_any(_block(history_capacity=value))


_LOWS = {"num_train": 1, "num_eval": 1, "user_rows": 1, "item_rows": 1, "num_context": 0,
         "context_rows": 1, "num_short_bags": 0, "short_bag_capacity": 1, "short_bag_rows": 1,
         "num_long_bags": 0, "long_bag_capacity": 1, "long_bag_rows": 1, "history_capacity": 1,
         "planted_dim": 1, "num_dense": 0, "test_rows": 0, "short_bag_mean_len": 1.0,
         "long_bag_median_len": 1.0, "long_bag_sigma": 0.0, "zipf_exponent": 0.0,
         "logit_scale": 0.0}


def _block(**overrides):
  block = ctr.get_config("multihot_smoke").data.multihot.to_dict()
  block.update(overrides)
  return type("Cfg", (), block)


@pytest.mark.parametrize("name,low", sorted(_LOWS.items()))
def test_each_field_takes_its_lowest_value_and_refuses_below(name, low):
  assert getattr(multihot.MultihotConfig.from_any(_block(**{name: low})), name) == low
  with pytest.raises(ConfigError) as err:
    multihot.MultihotConfig.from_any(_block(**{name: low - 1}))
  kind = "an integer in" if isinstance(low, int) else "a finite number >="
  assert str(err.value).startswith(f"config field data.multihot.{name}: must be {kind} [{low}"
                                   if isinstance(low, int) else
                                   f"config field data.multihot.{name}: must be {kind} {low}, got")


def test_config_limits_and_defaults_are_named():
  big = multihot._MAX_TABLE_ROWS
  assert multihot.MultihotConfig.from_any(_block(item_rows=big)).item_rows == big
  with pytest.raises(ConfigError) as err:
    multihot.MultihotConfig.from_any(_block(item_rows=big + 1))
  assert str(err.value) == f"config field data.multihot.item_rows: must be <= {big}, got {big + 1}"
  assert multihot.MultihotConfig.from_any(_block(num_train=multihot._MAX_COUNT)).num_train == (
      multihot._MAX_COUNT)
  with pytest.raises(ConfigError) as err:
    multihot.MultihotConfig.from_any(_block(num_train=multihot._MAX_COUNT + 1))
  assert str(err.value).startswith("config field data.multihot.num_train: must be an integer in "
                                   f"[1, {multihot._MAX_COUNT}], got")
  for ctr_value in (0.0, 1.0):
    with pytest.raises(ConfigError) as err:
      multihot.MultihotConfig.from_any(_block(target_ctr=ctr_value))
    assert str(err.value) == (f"config field data.multihot.target_ctr: must be in (0, 1), got "
                              f"{ctr_value!r}")
  with pytest.raises(ConfigError) as err:
    multihot.MultihotConfig.from_any(_block(target_ctr=-0.5))
  assert str(err.value).startswith("config field data.multihot.target_ctr: must be a finite number")
  with pytest.raises(ConfigError) as err:
    multihot.MultihotConfig.from_any(_block(shares=(1.0, 1.0)))
  assert str(err.value) == ("config field data.multihot.shares: must be 4 numbers ('first_order', "
                            "'bags', 'history', 'dense'), got (1.0, 1.0)")
  with pytest.raises(ConfigError) as err:
    multihot.MultihotConfig.from_any(_block(shares=(1.0, -1.0, 0.0, 0.0)))
  assert str(err.value).startswith("config field data.multihot.shares: must be a finite number >= 0")
  block = ctr.get_config("multihot_smoke").data.multihot.to_dict()
  del block["test_rows"]  # has a default
  assert multihot.MultihotConfig.from_any(type("Cfg", (), block)).test_rows == 0
  del block["planted_dim"]  # has none
  with pytest.raises(ConfigError) as err:
    multihot.MultihotConfig.from_any(type("Cfg", (), block))
  assert str(err.value) == "config field data.multihot.planted_dim: missing from the config"


def test_layout_names_poolings_and_roles():
  layout = multihot.multihot_layout(_cfg(num_context=1, num_short_bags=3, num_long_bags=3))
  assert [(f.name, f.table, f.kind, f.pooling, f.weighted) for f in layout.features] == [
      ("user", "user", "one_hot", "sum", False), ("item", "item", "one_hot", "sum", False),
      ("ctx0", "ctx0", "one_hot", "sum", False),
      ("bag0", "bag0", "multi_hot", "sum", True), ("bag1", "bag1", "multi_hot", "mean", False),
      ("bag2", "bag2", "multi_hot", "sum", False),
      ("long0", "long0", "multi_hot", "sqrtn", False), ("long1", "long1", "multi_hot", "mean", False),
      ("long2", "long2", "multi_hot", "sqrtn", False),
      ("history", "item", "sequence", "sum", False)]  # a FeatureSpec default; DIN reads it unpooled
  roles = multihot._roles(layout)
  assert roles.one_hot == (0, 1, 2) and roles.target == 1 and roles.history == 9
  assert roles.bags == ((3, 0), (4, 1), (5, 0), (6, 1), (7, 0), (8, 1))


def test_long_bags_hold_at_least_one_id_and_stats_are_named(smoke):
  ds = multihot.MultihotCTR(_cfg(long_bag_median_len=1.0, long_bag_sigma=2.0), seed=0)
  lengths = ds.generate_rows("eval", 0, 4096).lengths
  long = lengths[:, [f.name for f in ds.layout.features].index("long0")]
  assert lengths.dtype == np.int64 and long.min() == 1 and np.mean(long == 1) > 0.3
  assert ds.stats["bad_lines"] == 0
  assert sorted(ds.stats["mean_lengths"]) == sorted(f.name for f in ds.layout.features)
  assert [f.name for f in smoke.spec.fields] == [f.name for f in smoke.layout.features]


def test_rows_dtypes_bounds_and_the_hottest_id_carries_the_strongest_effect(smoke, rows):
  assert (rows.ids.dtype, rows.weights.dtype, rows.lengths.dtype) == (np.int64, np.float32, np.int64)
  assert (rows.dense.dtype, rows.labels.dtype) == (np.float32, np.float32)
  assert smoke.generate_rows("train", 5, 1).ids.shape == (1, smoke.layout.num_columns)
  for start, num_rows in ((-1, 3), (0, 0)):
    with pytest.raises(ValueError, match=f"^need start >= 0 and num_rows >= 1, got {start}, "
                       f"{num_rows}$"):
      smoke.generate_rows("eval", start, num_rows)
  assert next(smoke.train_batches(1, seed=0)).size == 1
  with pytest.raises(ValueError, match="^batch_size must be positive, got 0$"):
    next(smoke.train_batches(0, seed=0))
  # Rank 0 (the most frequent id) is the id the planted model gives its undecayed effect.
  user_rows = smoke.layout.tables[0].num_rows
  hottest = np.bincount(rows.ids[:, 0], minlength=user_rows).argmax()
  assert hottest == smoke._column_add[0] % user_rows
