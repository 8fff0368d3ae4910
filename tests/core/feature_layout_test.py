"""Feature layout: columns, offsets and shared tables; every bad field named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError

LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 5), fl.TableSpec("item", 10), fl.TableSpec("tag", 3)),
    (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item"),
     fl.FeatureSpec("tags", "tag", "multi_hot", 2, "mean", weighted=True),
     fl.FeatureSpec("history", "item", "sequence", 4)))


def test_columns_offsets_and_shared_tables():
  assert (LAYOUT.num_features, LAYOUT.num_columns, LAYOUT.total_rows) == (4, 8, 18)
  np.testing.assert_array_equal(LAYOUT.table_offsets, [0, 5, 15])
  # history shares item's rows: the same offset, the same table size.
  np.testing.assert_array_equal(LAYOUT.column_offsets, [0, 5, 15, 15, 5, 5, 5, 5])
  np.testing.assert_array_equal(LAYOUT.column_rows, [5, 10, 3, 3, 10, 10, 10, 10])
  np.testing.assert_array_equal(LAYOUT.column_features, [0, 1, 2, 2, 3, 3, 3, 3])
  assert LAYOUT.columns(2) == slice(2, 4) and LAYOUT.columns(3) == slice(4, 8)
  assert LAYOUT.feature_tables == (0, 1, 2, 1)
  assert LAYOUT.sequence_features() == (3,) and LAYOUT.has_padding
  assert hash(LAYOUT) == hash(fl.FeatureLayout(LAYOUT.tables, LAYOUT.features))  # static


def test_one_hot_layout_is_one_table_per_field():
  layout = fl.one_hot_layout(["a", "b"], [3, 4])
  np.testing.assert_array_equal(layout.column_offsets, [0, 3])
  assert layout.num_columns == 2 and not layout.has_padding


@pytest.mark.parametrize("tables,features,field", [
    ((fl.TableSpec("t", 3), fl.TableSpec("t", 4)), (fl.FeatureSpec("a", "t"),),
     "features.tables.t: declared twice"),
    ((fl.TableSpec("t", 0),), (fl.FeatureSpec("a", "t"),), "features.tables.t.num_rows"),
    ((fl.TableSpec("t", 3),), (), "config field features: declares no feature"),
    ((fl.TableSpec("t", 3),), (fl.FeatureSpec("a", "u"),), "features.inputs.a.table: unknown"),
    ((fl.TableSpec("t", 3),), (fl.FeatureSpec("a", "t", "bag"),), "features.inputs.a.kind"),
    ((fl.TableSpec("t", 3),), (fl.FeatureSpec("a", "t", capacity=2),),
     "features.inputs.a.capacity: a one_hot feature holds 1 id"),
    ((fl.TableSpec("t", 3),), (fl.FeatureSpec("a", "t", "multi_hot", 0),),
     "features.inputs.a.capacity: must be >= 1"),
    ((fl.TableSpec("t", 3),), (fl.FeatureSpec("a", "t", "multi_hot", 2, "max"),),
     "features.inputs.a.pooling"),
    ((fl.TableSpec("t", 3),), (fl.FeatureSpec("a", "t", "sequence", 2, weighted=True),),
     "features.inputs.a.weighted"),
    ((fl.TableSpec("t", 3),), (fl.FeatureSpec("a", "t"), fl.FeatureSpec("a", "t")),
     "features.inputs.a: declared twice"),
])
def test_bad_layouts_name_the_field(tables, features, field):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    fl.FeatureLayout(tables, features)


def test_tables_may_set_their_own_optimizer_rate_and_initializer():
  assert not LAYOUT.has_table_settings and not fl.TableSpec("t", 3).overrides
  tables = (fl.TableSpec("user", 5, "sgd", 0.5), fl.TableSpec("item", 10),
            fl.TableSpec("tag", 3, init_stddev=0.1))
  layout = fl.FeatureLayout(tables, LAYOUT.features)
  assert layout.has_table_settings and [t.overrides for t in tables] == [True, False, True]
  assert fl.layout_from_json(fl.layout_to_json(layout)) == layout  # recorded in checkpoints
  assert fl.layout_from_json(fl.layout_to_json(layout)) != LAYOUT


def test_row_tables_maps_rows_to_their_table():
  starts = LAYOUT.table_offsets  # [0, 5, 15], 18 rows
  got = fl.row_tables(starts, np.array([0, 4, 5, 14, 15, 17, 18, -1]))
  np.testing.assert_array_equal(got, [0, 0, 1, 1, 2, 2, 2, 0])  # 18 / -1: padding
  assert got.dtype == np.int32


@pytest.mark.parametrize("table, field", [
    (fl.TableSpec("user", 5, learning_rate=-0.1), "features.tables.user.learning_rate"),
    (fl.TableSpec("user", 5, init_stddev=float("nan")), "features.tables.user.init_stddev"),
    (fl.TableSpec("user", 5, optimizer=3), "features.tables.user.optimizer"),
    (fl.TableSpec("user", 5, learning_rate="0.1"),
     "features.tables.user.learning_rate: must be a finite number >= 0"),
    (fl.TableSpec("user", 5, init_stddev=True), "features.tables.user.init_stddev"),
    (fl.TableSpec("user", 5, dim=1.5), "features.tables.user.dim: must be an integer"),
])
def test_bad_table_settings_name_the_field(table, field):
  with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
    fl.FeatureLayout((table,), (fl.FeatureSpec("u", "user"),))


def test_table_field_errors_say_what_is_wrong_and_a_one_row_table_is_fine():
  one = fl.FeatureLayout((fl.TableSpec("user", 1),), (fl.FeatureSpec("u", "user"),))
  assert one.total_rows == 1
  for table, message in ((fl.TableSpec("user", 0), "num_rows: must be >= 1, got 0"),
                         (fl.TableSpec("user", 5, optimizer=3),
                          "optimizer: must be a row optimizer name, got 3")):
    with pytest.raises(ConfigError, match=f"features.tables.user.{message}"):
      fl.FeatureLayout((table,), (fl.FeatureSpec("u", "user"),))


def test_live_mask_reads_each_columns_dim_alike_in_numpy_and_traced():
  dims = np.asarray([0, 2, 3, 1])  # 0: every latent column
  want = np.asarray([[1, 1, 1, 1, 1], [1, 1, 0, 0, 1], [1, 1, 1, 0, 1], [1, 0, 0, 0, 1]], bool)
  got = fl.live_mask(dims, 4, 5)
  assert isinstance(got, np.ndarray)
  np.testing.assert_array_equal(got, want)
  traced = jax.jit(lambda d: fl.live_mask(d, 4, 5))(jnp.asarray(dims, jnp.float32))
  np.testing.assert_array_equal(np.asarray(traced), want)
  np.testing.assert_array_equal(fl.live_mask(dims, 4, 4), want[:, :4])  # no first-order column
