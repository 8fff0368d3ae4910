"""The `data.parquet` block: parsing, validation, features and tables."""

import types

import pytest

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data.parquet import columns as pcols
from sfjax.train import defaults


def _block(**fields):
  c = defaults.ctr_defaults().data.parquet
  c.dense = "price"
  for key, value in fields.items():
    c[key] = value
  return c


def test_defaults_read_scalar_columns_without_a_layout():
  columns = pcols.parse_columns(_block()).with_categorical(["label", "price", "user", "item"])
  assert columns.categorical == ("user", "item") and not columns.has_layout
  assert pcols.feature_specs(columns) == (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item"))
  assert pcols.table_names(columns) == ("user", "item")


def test_bags_weights_and_shared_tables():
  columns = pcols.parse_columns(_block(
      bags="genres:multi_hot:8:mean, history:sequence:20,tags:multi_hot:16:sum:w",
      shared_tables="history=item"))
  columns = columns.with_categorical(["label", "item", "genres", "price", "history", "tags", "w"])
  assert columns.categorical == ("item",) and columns.weight_columns == ("w",)
  assert pcols.feature_specs(columns) == (
      fl.FeatureSpec("item", "item"), fl.FeatureSpec("genres", "genres", "multi_hot", 8, "mean"),
      fl.FeatureSpec("history", "item", "sequence", 20, "mean"),
      fl.FeatureSpec("tags", "tags", "multi_hot", 16, "sum", True))
  assert pcols.table_names(columns) == ("item", "genres", "tags")
  pcols.check_features(columns)
  fl.FeatureLayout(tuple(fl.TableSpec(t, 5) for t in pcols.table_names(columns)),
                   pcols.feature_specs(columns))  # a valid layout


@pytest.mark.parametrize("field,value,message", [
    ("bags", "history:sequence", "data.parquet.bags: entry 'history:sequence': want name:kind"),
    ("bags", "h:bag:3", "data.parquet.bags: entry 'h:bag:3': kind must be one of"),
    ("bags", "h:multi_hot:0", "capacity must be an integer >= 1, got '0'"),
    ("bags", "h:multi_hot:2:max", "pooling must be one of"),
    ("bags", "h:sequence:2:sum", "a sequence takes no pooling"),
    ("shared_tables", "history", "data.parquet.shared_tables: entry 'history': want feature=owner"),
    ("shared_tables", "a=b,b=c", "'b' reads another table itself"),
    ("dense_transform", "log", "data.parquet.dense_transform: must be one of"),
    ("categorical", "price", "data.parquet.categorical: column 'price' is already used as dense"),
])
def test_config_errors_name_the_field(field, value, message):
  c = defaults.ctr_defaults().data.parquet
  c.dense = "price"
  c[field] = value
  with pytest.raises(ConfigError, match=message):
    pcols.parse_columns(c)


def test_shared_names_must_be_features_and_something_must_embed():
  columns = pcols.parse_columns(_block(shared_tables="history=item")).with_categorical(
      ["label", "price", "item"])
  with pytest.raises(ConfigError, match="data.parquet.shared_tables: history=item: 'history' is "
                     "not a categorical or bag column"):
    pcols.check_features(columns)
  with pytest.raises(ConfigError, match="data.parquet.categorical: the files hold no categorical"):
    pcols.check_features(pcols.parse_columns(_block()).with_categorical(["label", "price"]))


def test_a_mapping_or_an_object_with_only_some_fields_takes_the_defaults():
  for cfg in ({}, types.SimpleNamespace()):
    columns = pcols.parse_columns(cfg)
    assert columns == pcols.ParquetColumns("label", (), (), (), (), "none")
  columns = pcols.parse_columns(types.SimpleNamespace(label=" y ", dense="a, b", bags="t:multi_hot:1"))
  assert (columns.label, columns.dense) == ("y", ("a", "b"))
  assert columns.bags == (pcols.BagColumn("t", "multi_hot", 1, "sum", ""),)  # capacity 1 is valid


def test_bag_entries_defaults_and_limits():
  columns = pcols.parse_columns({"bags": "g:multi_hot:3,h:sequence:2:mean,w:multi_hot:2::x"})
  assert columns.bags == (pcols.BagColumn("g", "multi_hot", 3, "sum", ""),
                          pcols.BagColumn("h", "sequence", 2, "mean", ""),
                          pcols.BagColumn("w", "multi_hot", 2, "sum", "x"))


@pytest.mark.parametrize("cfg,message", [
    ({"label": "  "}, "config field data.parquet.label: must name the label column"),
    ({"bags": "h:multi_hot:2:sum:w:extra"},
     "config field data.parquet.bags: entry 'h:multi_hot:2:sum:w:extra': want name:kind:capacity"),
    ({"bags": ":multi_hot:2"}, "config field data.parquet.bags: entry ':multi_hot:2': want name"),
    ({"bags": "h:multi_hot:two"},
     "config field data.parquet.bags: entry 'h:multi_hot:two': capacity must be an integer >= 1, "
     "got 'two'"),
    ({"bags": "h:sequence:2:mean:w"},
     "config field data.parquet.bags: entry 'h:sequence:2:mean:w': a sequence takes no pooling and "
     "no weight column (models read it unpooled, or mean-pooled)"),
    ({"shared_tables": "=item"}, "config field data.parquet.shared_tables: entry '=item': want"),
    ({"shared_tables": "history="}, "config field data.parquet.shared_tables: entry 'history=': want"),
    ({"shared_tables": "item=item"},
     "config field data.parquet.shared_tables: entry 'item=item': a feature cannot share its own "
     "table"),
    ({"shared_tables": "h=a,h=b"}, "config field data.parquet.shared_tables: a feature is listed twice"),
    ({"shared_tables": "a=b,b=c"},
     "config field data.parquet.shared_tables: a=b: 'b' reads another table itself"),
    ({"dense": "label"}, "config field data.parquet.dense: column 'label' is already used as label"),
    ({"categorical": "t", "bags": "t:multi_hot:2"},
     "config field data.parquet.bags: column 't' is already used as categorical"),
    ({"categorical": "w", "bags": "t:multi_hot:2:sum:w"},
     "config field data.parquet.bags: column 'w' is already used as categorical"),
])
def test_errors_name_the_field_in_full(cfg, message):
  with pytest.raises(ConfigError) as err:
    pcols.parse_columns(cfg)
  assert str(err.value).startswith(message)


def test_shared_tables_split_at_the_first_equals_sign_and_a_shared_scalar_reads_its_owner():
  assert pcols.parse_columns({"shared_tables": "a=b=c"}).shared == (("a", "b=c"),)
  columns = pcols.parse_columns({"categorical": "item,other", "shared_tables": "other=item"})
  assert pcols.feature_specs(columns) == (fl.FeatureSpec("item", "item"),
                                          fl.FeatureSpec("other", "item"))
  with pytest.raises(ConfigError) as err:
    pcols.check_features(pcols.parse_columns({"categorical": "item,price",
                                              "shared_tables": "h=item"}))
  assert str(err.value) == ("config field data.parquet.shared_tables: h=item: 'h' is not a "
                            "categorical or bag column (features: item, price)")
  with pytest.raises(ConfigError) as err:
    pcols.check_features(pcols.parse_columns({}))
  assert str(err.value).endswith("data.parquet.bags is empty: nothing to embed")
