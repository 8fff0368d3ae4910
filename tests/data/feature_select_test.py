"""data.use_features: a data set reduced to some features (ablations)."""

import numpy as np
import pytest

from sfjax.core.errors import ConfigError
from sfjax.data import feature_select
from tests.train import bag_data


def test_one_hot_features_alone_take_the_plain_one_hot_path():
  data = bag_data.BagDataset(num_train=64, num_eval=16)
  sel = feature_select.with_features(data, "item, user")
  assert sel.spec.layout is None and [f.name for f in sel.spec.fields] == ["user", "item"]
  assert sel.spec.field_rows == (300, 500)
  full, got = next(data.train_batches(8, 0)), next(sel.train_batches(8, 0))
  np.testing.assert_array_equal(got.ids, full.ids[:, :2])
  assert got.weights is None
  np.testing.assert_array_equal(got.labels, full.labels)
  assert sel.oracle is data.oracle and sel.eval_splits == data.eval_splits
  assert sel.stats["features"] == ["user", "item"]


def test_bags_and_a_shared_table_keep_a_layout_of_their_tables():
  data = bag_data.BagDataset(num_train=64, num_eval=16)
  sel = feature_select.SelectedFeatures(data, ("history", "tags", "item"))
  layout = sel.spec.layout
  assert [f.name for f in layout.features] == ["item", "tags", "history"]  # data set order
  assert [t.name for t in layout.tables] == ["item", "tag"]  # user dropped, order kept
  np.testing.assert_array_equal(layout.column_offsets[:3], [0, 500, 500])
  full, got = next(data.eval_batches("eval", 16)), next(sel.eval_batches("eval", 16))
  cols = np.r_[1, 2:7, 14:20]
  np.testing.assert_array_equal(got.ids, full.ids[:, cols])
  np.testing.assert_array_equal(got.weights, full.weights[:, cols])


def test_bad_names_are_named():
  data = bag_data.BagDataset(num_train=16, num_eval=16)
  assert feature_select.with_features(data, " ") is data
  with pytest.raises(ConfigError, match="data.use_features: unknown feature 'genre'"):
    feature_select.with_features(data, "user,genre")
  with pytest.raises(ConfigError, match="named twice"):
    feature_select.with_features(data, "user,user")
