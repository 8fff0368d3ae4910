"""Host data types: spec properties, canonical batches, concatenation."""

import chex
import numpy as np
import pytest

from sfjax.data import types


def _spec():
  return types.DatasetSpec((types.FieldSpec("a", 3), types.FieldSpec("b", 5),
                            types.FieldSpec("c", 2)), num_dense=2)


def test_dataset_spec_properties():
  spec = _spec()
  assert spec.num_fields == 3
  assert spec.field_rows == (3, 5, 2)
  np.testing.assert_array_equal(spec.field_offsets, [0, 3, 8])
  assert spec.field_offsets.dtype == np.int64
  assert spec.total_rows == 10 and isinstance(spec.total_rows, int)


def test_dataset_spec_is_frozen_and_hashable():
  assert hash(_spec()) == hash(_spec()) and _spec() == _spec()
  with pytest.raises(AttributeError):
    _spec().num_dense = 3  # frozen dataclass


def test_make_batch_canonical_dtypes_and_default_mask():
  b = types.make_batch([[0, 1, 1], [2, 4, 0]], [[0.5, 1.0], [2.0, 3.0]], [1, 0])
  assert b.ids.dtype == np.int64 and b.dense.dtype == np.float32
  assert b.labels.dtype == np.float32 and b.mask.dtype == np.float32
  chex.assert_shape([b.ids, b.dense, b.labels, b.mask], [(2, 3), (2, 2), (2,), (2,)])
  np.testing.assert_array_equal(b.mask, [1.0, 1.0])
  assert b.size == 2 and isinstance(b.size, int)


def test_make_batch_flat_dense_is_one_feature_and_mask_kept():
  b = types.make_batch(np.zeros((3, 1)), [1.0, 2.0, 3.0], [0, 1, 0], mask=[1, 1, 0])
  np.testing.assert_array_equal(b.dense, [[1.0], [2.0], [3.0]])
  np.testing.assert_array_equal(b.mask, [1.0, 1.0, 0.0])
  assert b.mask.dtype == np.float32


def test_make_batch_without_dense_features():
  b = types.make_batch(np.zeros((4, 2)), np.zeros((4, 0)), np.ones(4))
  chex.assert_shape(b.dense, (4, 0))
  assert b.size == 4


def test_concat_batches():
  a = types.make_batch([[0, 1]], [[1.0]], [1])
  b = types.make_batch([[2, 3], [4, 0]], [[2.0], [3.0]], [0, 1], mask=[1, 0])
  c = types.concat_batches([a, b])
  np.testing.assert_array_equal(c.ids, [[0, 1], [2, 3], [4, 0]])
  np.testing.assert_array_equal(c.dense, [[1.0], [2.0], [3.0]])
  np.testing.assert_array_equal(c.labels, [1, 0, 1])
  np.testing.assert_array_equal(c.mask, [1, 1, 0])
  assert c.size == 3 and c.ids.dtype == np.int64 and c.mask.dtype == np.float32


def test_spec_with_a_layout_has_columns_of_shared_tables():
  from sfjax.core import feature_layout as fl  # pylint: disable=import-outside-toplevel
  layout = fl.FeatureLayout((fl.TableSpec("item", 6), fl.TableSpec("tag", 2)),
                            (fl.FeatureSpec("item", "item"),
                             fl.FeatureSpec("tags", "tag", "multi_hot", 2),
                             fl.FeatureSpec("hist", "item", "sequence", 3)))
  spec = types.DatasetSpec((types.FieldSpec("item", 6), types.FieldSpec("tags", 2),
                            types.FieldSpec("hist", 6)), 0, layout)
  assert (spec.num_fields, spec.num_columns, spec.total_rows) == (3, 6, 8)
  np.testing.assert_array_equal(spec.column_offsets, [0, 6, 6, 0, 0, 0])
  np.testing.assert_array_equal(spec.column_rows, [6, 2, 2, 6, 6, 6])
  assert spec.has_padding and not _spec().has_padding and _spec().column_rows is None
  np.testing.assert_array_equal(_spec().column_offsets, _spec().field_offsets)
  with pytest.raises(ValueError, match="2 fields but the layout has 3 features"):
    types.DatasetSpec(spec.fields[:2], 0, layout)


def test_weights_travel_through_concat_and_map_and_stay_absent_without_a_layout():
  a = types.make_batch([[1, -1]], [[0.0]], [1], weights=[[1.0, 0.0]])
  b = types.make_batch([[2, 3]], [[0.0]], [0], weights=[[0.5, 2.0]])
  both = types.concat_batches([a, b])
  np.testing.assert_array_equal(both.weights, [[1.0, 0.0], [0.5, 2.0]])
  assert both.weights.dtype == np.float32
  plain = types.concat_batches([a._replace(weights=None), b._replace(weights=None)])
  assert plain.weights is None
  assert types.map_arrays(lambda x: x[:1], plain).weights is None
  np.testing.assert_array_equal(types.map_arrays(lambda x: x[1:], both).weights, [[0.5, 2.0]])
