"""data.tables: a feature layout's tables take their own settings (issue #22)."""

import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.data import table_settings
from tests.train import bag_data


def test_parse_and_errors_name_the_field():
  got = table_settings.parse_table_settings(
      " item:dim=8, optimizer=adagrad,learning_rate=0.05 ;; user:init_stddev=0.02;")
  assert got == {"item": {"dim": 8, "optimizer": "adagrad", "learning_rate": 0.05},
                 "user": {"init_stddev": 0.02}}
  assert table_settings.parse_table_settings("") == {}
  for text, match in (("item", "entry 'item' is not 'table:key=value,...'"),
                      ("item:", "entry 'item:' is not 'table:key=value,...'"),
                      (":dim=2", "entry ':dim=2' is not 'table:key=value,...'"),
                      ("item:width=3", "item: 'width=3' is not key=value with a key among "
                                       "optimizer, learning_rate, init_stddev, dim"),
                      ("item:dim=2=3", "item.dim: '2=3' is not an integer"),
                      ("item:dim", "item: 'dim' is not key=value"),
                      ("item:dim=2.5", "item.dim: '2.5' is not an integer"),
                      ("item:learning_rate=fast", "item.learning_rate: 'fast' is not a number"),
                      ("item:dim=2,dim=3", "item: dim is set twice"),
                      ("item:dim=2;item:dim=3", "table 'item' is named twice")):
    with pytest.raises(ConfigError, match=f"config field data.tables: {match}"):
      table_settings.parse_table_settings(text)


def test_format_is_the_inverse_of_parse():
  settings = {"item": {"dim": 8, "optimizer": "adagrad", "learning_rate": 0.05},
              "user": {"init_stddev": 0.02}, "tag": {}}
  text = table_settings.format_table_settings(settings)
  assert text == "item:dim=8,optimizer=adagrad,learning_rate=0.05; user:init_stddev=0.02"
  assert table_settings.parse_table_settings(text) == {k: v for k, v in settings.items() if v}
  assert table_settings.format_table_settings({}) == ""


def test_named_tables_take_the_settings_and_batches_are_unchanged():
  data = bag_data.BagDataset(num_train=64, num_eval=16)
  got = table_settings.with_tables(data, "item:dim=2,optimizer=sgd; tag:learning_rate=0.5")
  tables = {t.name: t for t in got.spec.layout.tables}
  assert tables["item"] == fl.TableSpec("item", 500, "sgd", dim=2)
  assert tables["tag"] == fl.TableSpec("tag", 40, learning_rate=0.5)
  assert tables["user"] == data.spec.layout.tables[0]
  assert data.spec.layout.tables[1].dim == 0  # the wrapped data set is unchanged
  assert got.spec.layout.features == data.spec.layout.features
  a, b = next(data.train_batches(8, 0)), next(got.train_batches(8, 0))
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x, y)
  assert table_settings.with_tables(data, "") is data
  # The layout (and so checkpoints, exports and serving bundles) carries the settings.
  assert fl.layout_from_json(fl.layout_to_json(got.spec.layout)) == got.spec.layout


def test_unknown_tables_and_bad_values_are_named():
  data = bag_data.BagDataset(num_train=64, num_eval=16)
  with pytest.raises(ConfigError, match="data.tables: 'items' is not a table of the data set "
                                        r"\(its tables: user, item, tag\)"):
    table_settings.with_tables(data, "items:dim=2")
  with pytest.raises(ConfigError, match=r"features\.tables\.item\.dim: must be an integer >= 1"):
    table_settings.with_tables(data, "item:dim=-1")
  c = ctr_config.get_config("smoke")  # one-hot synthetic data: no feature layout
  c.data.tables = "C1:dim=2"
  with pytest.raises(ConfigError, match="its tables: none: it has no feature layout"):
    dataset_lib.make_dataset(c.data, seed=0)


def test_make_dataset_applies_data_tables():
  c = ctr_config.get_config("multihot_smoke")
  c.data.tables = "item:dim=4"
  spec = dataset_lib.make_dataset(c.data, seed=0).spec
  assert spec.layout.tables[spec.layout.table_index("item")].dim == 4
