"""data.pooling: a data set's bags pooled another way (a search's choice, issue #22)."""

import dataclasses

import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.data import feature_pooling
from tests.train import bag_data


def _poolings(spec):
  return {f.name: f.pooling for f in spec.layout.features}


def test_parse_and_errors_name_the_field():
  assert feature_pooling.parse_poolings(" tags:mean , long0:sqrtn ,") == {
      "tags": "mean", "long0": "sqrtn"}
  assert feature_pooling.parse_poolings("") == {}
  for text, match in (("tags", "entry 'tags' is not 'feature:pooling'"),
                      ("tags:max", "tags: pooling must be one of sum, mean, sqrtn, got 'max'"),
                      ("tags:sum,tags:mean", "feature 'tags' is named twice")):
    with pytest.raises(ConfigError, match=f"config field data.pooling: {match}"):
      feature_pooling.parse_poolings(text)


def test_named_bags_pool_the_new_way_and_batches_are_unchanged():
  data = bag_data.BagDataset(num_train=64, num_eval=16)
  got = feature_pooling.with_pooling(data, "tags:sqrtn, tags_sum:mean")
  assert _poolings(got.spec) == {**_poolings(data.spec), "tags": "sqrtn", "tags_sum": "mean"}
  assert _poolings(data.spec)["tags"] == "mean"  # the wrapped data set is unchanged
  assert got.spec.layout.tables == data.spec.layout.tables and got.spec.fields == data.spec.fields
  a, b = next(data.train_batches(8, 0)), next(got.train_batches(8, 0))
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x, y)
  assert got.oracle is data.oracle and got.eval_splits == data.eval_splits
  assert feature_pooling.with_pooling(data, "") is data


def test_only_bags_can_be_repooled():
  data = bag_data.BagDataset(num_train=16, num_eval=16)
  sequence = next(f.name for f in data.spec.layout.features if f.kind == "sequence")
  bags = ", ".join(f.name for f in data.spec.layout.features if f.kind == "multi_hot")
  with pytest.raises(ConfigError) as err:
    feature_pooling.with_pooling(data, f"{sequence}:sum")
  assert str(err.value) == (f"config field data.pooling: '{sequence}' is not a multi_hot feature "
                            f"of the data set (its bags: {bags})")
  one_hot = dataclasses.replace(data.spec, layout=None)  # one id per field: no bag at all
  with pytest.raises(ConfigError) as err:
    feature_pooling.with_poolings(one_hot, {"tags": "sum"})
  assert str(err.value).endswith("'tags' is not a multi_hot feature of the data set (its bags: none)")


def test_make_dataset_applies_data_pooling():
  d = ctr_config.get_config("multihot_smoke").data
  d.pooling = "bag1:sqrtn,long0:sum"
  spec = dataset_lib.make_dataset(ml_collections.FrozenConfigDict(d), 0).spec
  assert _poolings(spec)["bag1"] == "sqrtn" and _poolings(spec)["long0"] == "sum"
  assert _poolings(spec)["bag0"] == "sum"  # its own
