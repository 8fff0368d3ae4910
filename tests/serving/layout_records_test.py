"""`parse_layout_records`: records of lists become id columns and weights as training lays
them out (a bag keeps its first ids, a sequence its most recent, left-aligned, -1 padding);
a bad record is named by index and feature."""

import numpy as np
import pytest

from sfjax.core import feature_layout as fl
from sfjax.serving.layout_records import RecordError, parse_layout_records

LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("item", 10), fl.TableSpec("tag", 5)),
    (fl.FeatureSpec("item_id", "item"),
     fl.FeatureSpec("tags", "tag", "multi_hot", 3, "mean", weighted=True),
     fl.FeatureSpec("history", "item", "sequence", 3)))  # columns 0 | 1..3 | 4..6


def test_lists_are_laid_out_and_truncated_as_in_training():
  records = [
      {"item_id": 7, "tags": [4, 0, 2, 1], "tags_weights": [0.5, 1.0, 2.0, 3.0],
       "history": [1, 2, 3, 4, 5], "d0": 1.5},  # bag: first 3 kept; sequence: last 3 kept
      {"item_id": 0, "history": [9], "d0": -2},  # no tags: an empty bag
      {"item_id": 3, "tags": [], "history": [], "d0": 0.0},
  ]
  ids, dense, weights = parse_layout_records(records, LAYOUT, ["d0"])
  np.testing.assert_array_equal(ids, [[7, 4, 0, 2, 3, 4, 5],
                                      [0, -1, -1, -1, 9, -1, -1],
                                      [3, -1, -1, -1, -1, -1, -1]])
  np.testing.assert_array_equal(weights, [[1, 0.5, 1, 2, 1, 1, 1],
                                          [1, 0, 0, 0, 1, 0, 0],
                                          [1, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(dense, [[1.5], [-2], [0]])
  assert ids.dtype == np.int64 and weights.dtype == np.float32 and dense.dtype == np.float32


@pytest.mark.parametrize("record, match", [
    ({"tags": [1], "tags_weights": [1.0], "d0": 0}, "missing feature 'item_id'"),
    ({"item_id": 1, "tags": 3, "d0": 0}, "feature 'tags' is a bag or sequence"),
    ({"item_id": 1, "history": [1, "2"], "d0": 0},
     "feature 'history' has an id of the wrong type str"),
    ({"item_id": True, "d0": 0}, "feature 'item_id' has an id of the wrong type bool"),
    ({"item_id": 1, "history": [10], "d0": 0},
     r"feature 'history' has id 10 outside its table 'item' rows \[0, 10\)"),
    ({"item_id": 1, "tags": [1, 2], "d0": 0}, "missing 'tags_weights'"),
    ({"item_id": 1, "tags": [1, 2], "tags_weights": [1.0], "d0": 0},
     "'tags_weights' must be a list of 2 numbers"),
    ({"item_id": 1}, "missing feature 'd0'"),
    ({"item_id": 1, "d0": "x"}, "feature 'd0' has the wrong type str"),
    ("7,1,2", "this bundle's run had no raw values"),
])
def test_bad_records_are_named(record, match):
  good = {"item_id": 1, "d0": 0.0}
  with pytest.raises(RecordError, match="^record 1: " + match):  # the second record
    parse_layout_records([good, record], LAYOUT, ["d0"])
