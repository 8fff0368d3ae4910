"""Tests for sfjax.data.movielens_features: genre bags, earlier-rating histories, the layout."""

import ml_collections
import numpy as np
import pytest

from sfjax.core.errors import ConfigError
from sfjax.data import movielens_features as features


def _brute_force_history(users, times, length):
  """rows [N, L] by the definition: same user, time strictly less, the L most recent."""
  n = len(users)
  out = np.full((n, length), -1, np.int64)
  for r in range(n):
    earlier = sorted((times[j], j) for j in range(n) if users[j] == users[r] and times[j] < times[r])
    kept = [j for _, j in earlier][-length:]
    out[r, :len(kept)] = kept
  return out


def test_history_excludes_ties_keeps_the_most_recent_last():
  users = np.array([b"a", b"a", b"b", b"a", b"a", b"b"])
  times = np.array([5.0, 3.0, 1.0, 5.0, 9.0, 1.0])
  rows, earlier = features.previous_ratings(users, times, 2)
  np.testing.assert_array_equal(rows, [
      [1, -1],   # a@5: a@3 only (a@5 of row 3 ties)
      [-1, -1],  # a@3: the user's first rating
      [-1, -1],  # b@1
      [1, -1],   # a@5 (row 3): row 0 ties at 5, excluded
      [0, 3],    # a@9: a@3, a@5, a@5 -> the 2 most recent, ties in row order, newest last
      [-1, -1],  # b@1 ties with row 2
  ])
  np.testing.assert_array_equal(earlier, [1, 0, 0, 1, 3, 0])


def test_history_matches_the_definition_on_random_logs():
  rng = np.random.default_rng(0)
  for length in (1, 3, 8):
    users = rng.integers(0, 5, size=60)
    times = rng.integers(0, 12, size=60).astype(np.float64)  # many ties
    rows, earlier = features.previous_ratings(users, times, length)
    np.testing.assert_array_equal(rows, _brute_force_history(users, times, length))
    expected = [(users == users[r]).astype(int) @ (times < times[r]) for r in range(60)]
    np.testing.assert_array_equal(earlier, expected)


def _brute_force_among(users, times, source, length):
  """rows [N, L]: same user, a source rating, time strictly less, the L most recent."""
  out = np.full((len(users), length), -1, np.int64)
  for r in range(len(users)):
    earlier = sorted((times[j], j) for j in range(len(users))
                     if source[j] and users[j] == users[r] and times[j] < times[r])
    kept = [j for _, j in earlier][-length:]
    out[r, :len(kept)] = kept
  return out


def test_previous_among_keeps_only_source_ratings_strictly_earlier():
  users = np.array([b"a", b"a", b"a", b"a", b"b"])
  times = np.array([1.0, 2.0, 3.0, 3.0, 0.0])
  source = np.array([True, False, True, True, True])  # row 1 is not a source (e.g. a test row)
  rows = features.previous_among(users, times, source, 2)
  np.testing.assert_array_equal(rows, [
      [-1, -1],  # a@1: first
      [0, -1],   # a@2: a@1
      [0, -1],   # a@3: a@2 is no source; a@3 of row 3 ties
      [0, -1],   # a@3 (row 3): its own and the tie excluded
      [-1, -1],  # b@0
  ])


def test_previous_among_matches_the_definition_on_random_logs():
  rng = np.random.default_rng(1)
  for length in (1, 4):
    users = rng.integers(0, 4, size=50)
    times = rng.integers(0, 10, size=50).astype(np.float64)
    source = rng.random(50) < 0.5
    np.testing.assert_array_equal(features.previous_among(users, times, source, length),
                                  _brute_force_among(users, times, source, length))
  none = np.zeros(50, bool)
  assert (features.previous_among(users, times, none, 3) == -1).all()


def test_genre_bags_hold_every_token_left_aligned():
  classes = np.array([b"Animation Children's Comedy", b"", b"Drama", b"Animation Children's Comedy"])
  bags = features.genre_bags(classes, 3)
  assert bags.tolist() == [[b"Animation", b"Children's", b"Comedy"], [b"", b"", b""],
                           [b"Drama", b"", b""], [b"Animation", b"Children's", b"Comedy"]]


def test_bag_vocabulary_is_fitted_on_train_and_padding_is_minus_one():
  bags = np.array([[b"x", b"y"], [b"y", b""], [b"z", b""], [b"", b""]])
  ids, rows = features.map_bag(bags, np.array([0, 1]), hash_rows=0, min_count=1)
  assert rows == 3  # x, y + the OOV row 0
  assert ids[0, 0] != ids[0, 1] and min(ids[0]) >= 1 and ids[1, 0] == ids[0, 1]
  assert ids[2].tolist() == [0, -1] and ids[3].tolist() == [-1, -1]  # z unseen in train: OOV
  hashed, rows = features.map_bag(bags, np.array([0, 1]), hash_rows=7, min_count=1)
  assert rows == 7 and (hashed[bags != b""] < 7).all() and (hashed[bags == b""] == -1).all()


def test_layout_shares_the_item_table_and_stacks_columns():
  options = features.FeatureOptions("all", 3)
  layout = features.movielens_layout({"user_id": 5, "item_id": 9, "age": 4}, options, 6, 2)
  assert [t.name for t in layout.tables] == ["user_id", "item", "age", "genres"]
  assert [(f.name, f.table, f.kind, f.capacity) for f in layout.features] == [
      ("user_id", "user_id", "one_hot", 1), ("item_id", "item", "one_hot", 1),
      ("age", "age", "one_hot", 1), ("genres", "genres", "multi_hot", 2),
      ("history", "item", "sequence", 3)]
  assert layout.features[3].pooling == "mean"
  np.testing.assert_array_equal(layout.column_offsets, [0, 5, 14, 18, 18, 5, 5, 5])
  spec = features.layout_spec(layout)
  assert spec.field_rows == (5, 9, 4, 6, 9) and spec.total_rows == 24 and spec.has_padding
  ids, weights = features.stack_columns(layout, {
      "user_id": np.array([1, 2]), "item_id": np.array([3, 4]), "age": np.array([0, 1]),
      "genres": np.array([[2, -1], [1, 5]]), "history": np.array([[7, 8, -1], [-1, -1, -1]])})
  np.testing.assert_array_equal(ids, [[1, 3, 0, 2, -1, 7, 8, -1], [2, 4, 1, 1, 5, -1, -1, -1]])
  np.testing.assert_array_equal(weights, [[1, 1, 1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
  assert weights.dtype == np.float32


def test_no_bag_and_no_history_means_no_layout():
  assert not features.FeatureOptions("first", 0).uses_layout
  assert features.FeatureOptions("first", 1).uses_layout
  assert features.FeatureOptions("all", 0).uses_layout
  assert features.FeatureOptions("first", 0, 5).uses_layout
  assert features.FeatureOptions("first", 0, 5).needs_times
  assert not features.FeatureOptions("all", 0).needs_times


def test_bad_label_history_names_the_field():
  cfg = ml_collections.ConfigDict({"genres": "all", "history": 0, "label_history": -2})
  with pytest.raises(ConfigError, match=r"^config field data.movielens.label_history: "):
    features.feature_options(cfg)


@pytest.mark.parametrize("genres, history, field", [
    ("some", 0, "data.movielens.genres"),
    ("all", -1, "data.movielens.history"),
    ("all", True, "data.movielens.history"),
    ("all", 2.5, "data.movielens.history"),
])
def test_bad_options_name_the_field(genres, history, field):
  cfg = ml_collections.ConfigDict({"genres": genres, "history": history})
  with pytest.raises(ConfigError, match=rf"^config field {field}: "):
    features.feature_options(cfg)


def test_good_options_are_read_as_plain_values():
  cfg = ml_collections.ConfigDict({"genres": "all", "history": np.int64(20), "label_history": 5})
  options = features.feature_options(cfg)
  assert options == ("all", 20, 5)
  assert [type(v) for v in options] == [str, int, int]
  # A config from before label histories (no such key) has none.
  assert features.feature_options(ml_collections.ConfigDict({"genres": "first", "history": 3})
                                  ) == ("first", 3, 0)


def test_history_rows_are_int64_and_an_empty_log_has_none():
  rows, earlier = features.previous_ratings(np.array([b"a", b"a"]), np.array([1.0, 2.0]), 3)
  assert rows.dtype == np.int64 and earlier.dtype == np.int64
  np.testing.assert_array_equal(rows, [[-1, -1, -1], [0, -1, -1]])
  rows, earlier = features.previous_ratings(np.array([], "S1"), np.array([]), 2)
  assert rows.shape == (0, 2) and earlier.shape == (0,)


def test_previous_among_reaches_the_last_and_a_single_source_rating():
  # The source sorted by (user, time) ends with b@4, which b@7 (no source) must see;
  # and with one source rating in all, the unused columns stay padding.
  users = np.array([b"a", b"b", b"b", b"a"])
  times = np.array([1.0, 4.0, 7.0, 2.0])
  rows = features.previous_among(users, times, np.array([True, True, False, False]), 3)
  np.testing.assert_array_equal(rows, [[-1, -1, -1], [-1, -1, -1], [1, -1, -1], [0, -1, -1]])
  assert rows.dtype == np.int64
  only = features.previous_among(users, times, np.array([False, True, False, False]), 3)
  np.testing.assert_array_equal(only, [[-1, -1, -1], [-1, -1, -1], [1, -1, -1], [-1, -1, -1]])


def test_layout_with_label_histories_and_its_spec():
  options = features.FeatureOptions("first", 0, 4)
  layout = features.movielens_layout({"user_id": 5, "item_id": 9}, options, 6, 2)
  assert [t.name for t in layout.tables] == ["user_id", "item"]
  assert [(f.name, f.table, f.kind, f.capacity) for f in layout.features] == [
      ("user_id", "user_id", "one_hot", 1), ("item_id", "item", "one_hot", 1),
      ("liked_history", "item", "sequence", 4), ("disliked_history", "item", "sequence", 4)]
  spec = features.layout_spec(layout)
  assert [f.name for f in spec.fields] == ["user_id", "item_id", "liked_history",
                                           "disliked_history"]
  assert spec.field_rows == (5, 9, 9, 9) and spec.num_dense == 0 and spec.layout is layout


def test_stacked_ids_are_int64_whatever_the_columns_dtype():
  layout = features.movielens_layout({"user_id": 5, "item_id": 9}, features.FeatureOptions("first", 2),
                                     1, 1)
  ids, _ = features.stack_columns(layout, {"user_id": np.array([1], np.int32),
                                           "item_id": np.array([3], np.int16),
                                           "history": np.array([[2, -1]], np.int32)})
  assert ids.dtype == np.int64 and ids.tolist() == [[1, 3, 2, -1]]
