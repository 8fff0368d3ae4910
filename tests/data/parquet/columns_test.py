"""The `data.parquet` block: parsing, validation, features and tables."""

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
