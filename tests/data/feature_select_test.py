"""data.use_features: a data set reduced to some features (ablations)."""

import numpy as np
import pytest

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data import feature_select, types
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


def test_names_are_split_on_commas_and_stripped():
  assert feature_select.parse_names(" a, ,b ,") == ("a", "b")
  assert feature_select.parse_names("") == () == feature_select.parse_names(" , ")
  with pytest.raises(ConfigError, match="^config field data.use_features: names no feature$"):
    feature_select.SelectedFeatures(bag_data.BagDataset(num_train=8, num_eval=8), ())


def test_one_hot_features_sharing_a_table_keep_a_layout():
  layout = fl.FeatureLayout(
      (fl.TableSpec("user", 300), fl.TableSpec("item", 500)),
      (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item"),
       fl.FeatureSpec("last_item", "item")))
  data = bag_data.BagDataset(num_train=32, num_eval=8, layout=layout)
  sel = feature_select.with_features(data, "last_item,item")
  assert sel.spec.layout is not None and sel.spec.num_dense == bag_data.NUM_DENSE
  assert [t.name for t in sel.spec.layout.tables] == ["item"]
  assert [(f.name, f.num_rows) for f in sel.spec.fields] == [("item", 500), ("last_item", 500)]
  full, got = next(data.train_batches(8, 1)), next(sel.train_batches(8, 1))
  np.testing.assert_array_equal(got.ids, full.ids[:, 1:])
  assert got.ids.flags.c_contiguous and got.weights.flags.c_contiguous
  np.testing.assert_array_equal(got.weights, full.weights[:, 1:])
  np.testing.assert_array_equal(got.dense, full.dense)
  unweighted = sel._map(full._replace(weights=None))
  np.testing.assert_array_equal(unweighted.weights, np.ones((8, 2), np.float32))
  assert unweighted.weights.dtype == np.float32
  only = feature_select.with_features(data, "item")  # one feature on its table: no layout
  assert only.spec.layout is None and only.spec.fields[0].name == "item"
  assert sel.stats == {"bad_lines": 0, "features": ["item", "last_item"]}
  assert data.stats == {"bad_lines": 0}


class _OneHot:
  """Three one-hot fields, no layout; each split's ids are offset by its own base."""

  spec = types.DatasetSpec((types.FieldSpec("a", 10), types.FieldSpec("b", 20),
                            types.FieldSpec("c", 30)), 1, None)
  eval_splits, oracle, stats = ("valid", "test"), None, {}
  _base = {"train": 0, "valid": 100, "test": 200}

  def _batch(self, split, n):
    ids = self._base[split] + np.arange(3 * n).reshape(n, 3)
    return types.make_batch(ids, np.zeros((n, 1), np.float32), np.zeros(n, np.float32))

  def train_batches(self, batch_size, seed):
    del seed
    return iter([self._batch("train", batch_size)])

  def eval_batches(self, split, batch_size):
    return iter([self._batch(split, batch_size)])


def test_a_data_set_without_a_layout_is_read_by_its_fields():
  sel = feature_select.with_features(_OneHot(), "c,a")
  assert sel.spec.layout is None and sel.spec.num_dense == 1
  assert [(f.name, f.num_rows) for f in sel.spec.fields] == [("a", 10), ("c", 30)]
  np.testing.assert_array_equal(next(sel.train_batches(2, 0)).ids, [[0, 2], [3, 5]])
  np.testing.assert_array_equal(next(sel.eval_batches("test", 2)).ids, [[200, 202], [203, 205]])
  np.testing.assert_array_equal(next(sel.eval_batches("valid", 1)).ids, [[100, 102]])
  with pytest.raises(ConfigError) as err:
    feature_select.with_features(_OneHot(), "d")
  assert str(err.value) == "config field data.use_features: unknown feature 'd' (known: a, b, c)"
