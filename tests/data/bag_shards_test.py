"""Tests for sfjax.data.bag_shards: padded id columns <-> one-hot ids plus values + offsets."""

import numpy as np
import pytest

from sfjax.core import feature_layout as fl
from sfjax.data import bag_shards
from sfjax.data.types import Batch, FieldSpec, make_batch

# user (one-hot), history (sequence of items, 3), item_id (one-hot), tags (weighted bag, 2).
LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 5), fl.TableSpec("item", 9), fl.TableSpec("tags", 4)),
    (fl.FeatureSpec("user", "user"), fl.FeatureSpec("history", "item", "sequence", 3, "mean"),
     fl.FeatureSpec("item_id", "item"),
     fl.FeatureSpec("tags", "tags", "multi_hot", 2, "sum", weighted=True)))
# Columns: user | history x3 | item_id | tags x2.
IDS = np.array([[0, 1, 2, 3, 4, 1, 1],
                [4, -1, -1, -1, 8, -1, -1],
                [2, 8, -1, -1, 0, 3, -1]], np.int64)
WEIGHTS = np.array([[1, 1, 1, 1, 1, 0.5, 0.0],  # a weighted id may weigh 0: it is no padding
                    [1, 0, 0, 0, 1, 0, 0],
                    [1, 1, 0, 0, 1, -2, 0]], np.float32)


def test_unpad_stores_ids_without_padding_and_pad_rebuilds_them():
  one_hot, bags = bag_shards.unpad(IDS, WEIGHTS, LAYOUT, np.dtype(np.int32))
  assert bag_shards.ragged_features(LAYOUT) == (1, 3)
  np.testing.assert_array_equal(bag_shards.one_hot_columns(LAYOUT), [0, 4])
  assert one_hot.dtype == np.int32
  np.testing.assert_array_equal(one_hot, [[0, 4], [4, 8], [2, 0]])
  history, tags = bags
  np.testing.assert_array_equal(history.values, [1, 2, 3, 8])
  np.testing.assert_array_equal(history.offsets, [0, 3, 3, 4])
  assert history.weights is None and history.values.dtype == np.int32
  np.testing.assert_array_equal(tags.values, [1, 1, 3])
  np.testing.assert_array_equal(tags.offsets, [0, 2, 2, 3])
  np.testing.assert_array_equal(tags.weights, [0.5, 0.0, -2.0])
  ids, weights = bag_shards.pad(one_hot, bags, LAYOUT)
  assert ids.dtype == np.int64 and weights.dtype == np.float32
  np.testing.assert_array_equal(ids, IDS)
  np.testing.assert_array_equal(weights, WEIGHTS)
  assert bag_shards.array_names(LAYOUT) == ("f1.values", "f1.offsets", "f3.values", "f3.offsets",
                                            "f3.weights")
  assert bag_shards.from_files(bag_shards.bag_files(bags, LAYOUT), LAYOUT) == bags


def test_rows_and_concat_rebase_offsets():
  _, (history, tags) = bag_shards.unpad(IDS, WEIGHTS, LAYOUT, np.dtype(np.int64))
  tail = bag_shards.take_rows(history, 1, 3)
  np.testing.assert_array_equal(tail.offsets, [0, 0, 1])
  np.testing.assert_array_equal(tail.values, [8])
  head = bag_shards.take_rows(tags, 0, 1)
  again = bag_shards.concat([head, bag_shards.take_rows(tags, 1, 3)])
  for got, want in zip(again, tags, strict=True):
    np.testing.assert_array_equal(got, want)


def test_stored_examples_round_trip_a_chunk_with_and_without_a_layout():
  chunk = make_batch(IDS, np.arange(6).reshape(3, 2), [0, 1, 1], weights=WEIGHTS)
  stored = bag_shards.stored(chunk, LAYOUT, np.dtype(np.int32))
  files = bag_shards.merged_files([stored.rows(0, 1), stored.rows(1, 3)], LAYOUT)
  assert list(files)[:3] == ["ids", "dense", "labels"]
  merged = bag_shards.StoredExamples(files["ids"], files["dense"], files["labels"],
                                     bag_shards.from_files(files, LAYOUT))
  back = bag_shards.to_batch(merged.rows(1, 3), LAYOUT)
  for got, want in zip(back, chunk, strict=True):
    np.testing.assert_array_equal(got, want[1:])
  plain = make_batch([[1, 2], [3, 4]], np.zeros((2, 0)), [1, 0])
  back = bag_shards.to_batch(bag_shards.stored(plain, None, np.dtype(np.int32)), None)
  assert back.weights is None and back.ids.dtype == np.int64
  np.testing.assert_array_equal(back.ids, plain.ids)
  with pytest.raises(ValueError, match="a data set with a feature layout yields weights"):
    bag_shards.stored(chunk._replace(weights=None), LAYOUT, np.dtype(np.int32))
  fields = tuple(FieldSpec(f.name, 9) for f in LAYOUT.features)
  assert [f.name for f in bag_shards.id_fields(fields, LAYOUT)] == ["user", "item_id"]


@pytest.mark.parametrize("where,value,weight,match", [
    ((1, 2), 5, 1.0, r"feature 'history' \(chunk row 1\): ids must be left-aligned"),
    ((1, 1), -1, 1.0, r"feature 'history' \(chunk row 1\)"),  # padding of weight 1
    ((0, 2), 2, 3.0, r"feature 'history' \(chunk row 0\)"),  # an unweighted id of weight 3
    ((2, 6), -1, 0.5, r"feature 'tags' \(chunk row 2\)"),  # padding of weight 0.5
    ((2, 1), 9, 1.0, r"ids of feature 'history' outside \[0, 9\): 9 \(chunk row 2\)"),
    ((2, 1), -3, 1.0, r"ids of feature 'history' outside \[0, 9\): -3 \(chunk row 2\)"),
    ((1, 0), 3, 0.5, r"weight 0.5 of one-hot feature 'user' \(chunk row 1\) is not 1"),
])
def test_unpad_refuses_what_it_could_not_rebuild(where, value, weight, match):
  ids, weights = IDS.copy(), WEIGHTS.copy()
  ids[where], weights[where] = value, weight
  with pytest.raises(ValueError, match=match):
    bag_shards.unpad(ids, weights, LAYOUT, np.dtype(np.int32))


def _bag(values, offsets, weights=None):
  return bag_shards.BagArrays(np.asarray(values, np.int32), np.asarray(offsets, np.int64),
                              None if weights is None else np.asarray(weights, np.float32))


@pytest.mark.parametrize("feature,bag,expected", [
    (1, _bag([1, 2, 3, 8], [0, 3, 3, 4]), None),
    (1, _bag([1, 2, 3, 8], [1, 3, 3, 4]), ("f1.offsets", 0, "offsets run from 1 to 4")),
    (1, _bag([1, 2, 3, 8], [0, 3, 3, 5]), ("f1.offsets", 2, "offsets run from 0 to 5, not from 0 "
                                                             "to the 4 values")),
    (1, _bag([1, 2, 3, 8], [0, 3, 1, 4]), ("f1.offsets", 1, "-2 ids, not in [0, capacity 3]")),
    (1, _bag([1, 2, 3, 8], [0, 4, 4, 4]), ("f1.offsets", 0, "4 ids, not in [0, capacity 3]")),
    (1, _bag([1, 2, 3, 9], [0, 3, 3, 4]), ("f1.values", 2, "id 9 outside the table's rows "
                                                           "[0, 9)")),
    (1, _bag([1, -1, 3, 8], [0, 3, 3, 4]), ("f1.values", 0, "id -1 outside")),
    (3, _bag([1, 1, 3], [0, 2, 2, 3], [0.5, 1, np.nan]), ("f3.weights", 2, "weight nan is not "
                                                                           "finite")),
    (1, _bag([9, 2, 3, 8], [0, 3, 3, 4]), ("f1.values", 0, "id 9 outside")),  # the first value
    # in the second block of 2, not at its start: the example of value 3
    (3, _bag([1, 1, 3, 2], [0, 2, 2, 4], [1, 1, 1, np.inf]), ("f3.weights", 2, "weight inf")),
])
def test_first_bad_bag_names_array_and_row(feature, bag, expected):
  found = bag_shards.first_bad_bag(bag, feature, LAYOUT, block=2)
  if expected is None:
    assert found is None
  else:
    assert (found.array, found.row) == expected[:2] and found.reason.startswith(expected[2])


def test_expected_arrays_of_a_shard():
  maps = {"f3.values": np.zeros(7, np.int32)}
  assert bag_shards.expected_array("f3.values", 4, np.dtype(np.int32), maps) == (np.int32, (None,))
  assert bag_shards.expected_array("f3.offsets", 4, np.dtype(np.int32), maps) == (np.int64, (5,))
  assert bag_shards.expected_array("f3.weights", 4, np.dtype(np.int32), maps) == (np.float32, (7,))


def test_stored_and_to_batch_keep_their_dtypes_without_a_layout():
  plain = Batch(np.array([[1, 2], [3, 4]], np.int64), np.array([[0.5], [1.5]], np.float64),
                np.array([1.0, 0.0], np.float64), np.ones(2))  # wider than stored
  kept = bag_shards.stored(plain, None, np.dtype(np.int32))
  assert (kept.ids.dtype, kept.dense.dtype, kept.labels.dtype) == (np.int32, np.float32, np.float32)
  assert kept.bags == ()
  back = bag_shards.to_batch(kept, None)
  np.testing.assert_array_equal(back.dense, [[0.5], [1.5]])
  np.testing.assert_array_equal(back.labels, [1, 0])
  np.testing.assert_array_equal(back.mask, [1, 1])
  assert back.mask.dtype == np.float32 and back.dense.dtype == np.float32


def test_stored_with_a_layout_stores_ids_in_the_split_dtype_and_names_bad_weights():
  chunk = make_batch(IDS, np.zeros((3, 1)), [0, 1, 1])._replace(weights=WEIGHTS.astype(np.float64))
  kept = bag_shards.stored(chunk, LAYOUT, np.dtype(np.int32))
  assert kept.ids.dtype == np.int32 and kept.bags[0].values.dtype == np.int32
  assert kept.bags[1].weights.dtype == np.float32
  with pytest.raises(ValueError, match=r"^chunk weights \(3, 6\) do not match its ids \(3, 7\)"):
    bag_shards.stored(chunk._replace(weights=WEIGHTS[:, :6]), LAYOUT, np.dtype(np.int32))


def test_concat_of_several_parts_of_several_rows():
  parts = [_bag([1, 2, 3], np.array([0, 2, 3], np.int32)), _bag([4], [0, 0, 1]),
           _bag([5, 6], [0, 2])]
  whole = bag_shards.concat(parts)
  np.testing.assert_array_equal(whole.values, [1, 2, 3, 4, 5, 6])
  np.testing.assert_array_equal(whole.offsets, [0, 2, 3, 3, 4, 6])
  assert whole.offsets.dtype == np.int64 and whole.weights is None
  middle = bag_shards.take_rows(bag_shards.BagArrays(whole.values, whole.offsets.astype(np.int32),
                                                     None), 1, 4)
  np.testing.assert_array_equal(middle.offsets, [0, 1, 1, 2])
  np.testing.assert_array_equal(middle.values, [3, 4])
  assert middle.offsets.dtype == np.int64
