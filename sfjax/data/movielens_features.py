"""MovieLens-100k's bag and sequence features: all genres, each user's earlier ratings (issue #22).

`data.movielens.genres = 'all'` replaces the one-hot first genre by 'genres', a
`multi_hot` bag of all of the movie's genres (mean-pooled; capacity = the most genres
any movie of the item file has) reading a table of its own. `data.movielens.history = N`
(> 0) adds 'history', a `sequence` of the items of the user's N most recent earlier
ratings, reading the 'item' table that `item_id` reads (a shared table). Either one
gives the data set a `FeatureLayout`; neither ('first', 0) is today's 8 one-hot fields.

History and leakage. Rating (u, i, t) sees the items of u's ratings with timestamp
STRICTLY less than t, the most recent last (earlier ties in file order), at most N.
Ties at t are excluded: within one second the order is unknown, and a same-second
rating may be the example itself or one that follows it. The earlier ratings are taken
from all of u's ratings whatever their split: only item ids enter, never a rating or a
label, and a system serving at time t has seen every earlier rating. An example's own
rating and any later one never enter its history (tests/data/movielens_test.py checks
every example of every split against the raw file, by (user, item, timestamp)).
History items map through the item mapping fitted on the train split (an unseen item
-> row 0, as for `item_id`).

Label histories (THESE FEATURES READ TRAIN-SPLIT LABELS). `data.movielens.label_history
= N` (> 0) adds 'liked_history' and 'disliked_history', two `sequence`s over the 'item'
table: the items of the user's N most recent STRICTLY earlier ratings that are in the
TRAIN split with label 1 (rating >= 4), resp. label 0. Only train-split labels enter
any feature: a valid/test rating never appears in any example's label history, so its
label reaches neither training nor another example's features; an example's own rating
and any later or same-second one never enter (tests/data/movielens_test.py checks
every example against the raw file and the split).
"""

from __future__ import annotations

from typing import NamedTuple

import ml_collections
import numpy as np

from sfjax.core.errors import ConfigError
from sfjax.core.feature_layout import PADDING_ID, FeatureLayout, FeatureSpec, TableSpec
from sfjax.data import feature_map
from sfjax.data.types import DatasetSpec, FieldSpec

GENRE_CHOICES = ("first", "all")
ITEM_TABLE = "item"  # read by item_id and by history
LABEL_HISTORIES = ("liked_history", "disliked_history")  # train-split labels 1, 0


class FeatureOptions(NamedTuple):
  """`data.movielens.{genres, history}`, checked.

  Attributes:
    genres: 'first' (one-hot first genre, today's) | 'all' (a multi_hot bag).
    history: N, earlier ratings per example (0 = no history feature).
  """

  genres: str
  history: int
  label_history: int = 0

  @property
  def uses_layout(self) -> bool:
    """True when some feature is a bag or a sequence (the data set has a layout)."""
    return self.genres == "all" or self.history > 0 or self.label_history > 0

  @property
  def needs_times(self) -> bool:
    """True when some feature reads the ratings' timestamps."""
    return self.history > 0 or self.label_history > 0


def feature_options(ml_cfg: ml_collections.ConfigDict) -> FeatureOptions:
  """Reads and checks `data.movielens.{genres, history, label_history}`."""
  genres, history = ml_cfg.genres, ml_cfg.history
  label_history = ml_cfg.get("label_history", 0)
  if genres not in GENRE_CHOICES:
    raise ConfigError(
        f"config field data.movielens.genres: must be one of {GENRE_CHOICES}, got {genres!r}")
  for name, value in (("history", history), ("label_history", label_history)):
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
      raise ConfigError(
          f"config field data.movielens.{name}: must be an integer >= 0, got {value!r}")
  return FeatureOptions(str(genres), int(history), int(label_history))


def previous_ratings(users: np.ndarray, times: np.ndarray, length: int,
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Each rating's most recent STRICTLY earlier ratings by the same user.

  Args:
    users: [N] user keys (any sortable dtype, e.g. the raw bytes).
    times: [N] finite timestamps.
    length: L >= 1, ratings kept per example (the most recent ones).

  Returns:
    (rows, earlier): rows [N, L] int64 indices into the N ratings, in time order with
    the most recent last (earlier ties in index order), left-aligned, -1 padding;
    earlier [N] int64, the user's ratings strictly before this one (before truncation).
  """
  return _previous(users, times, np.ones(users.shape[0], np.bool_), length)


def previous_among(users: np.ndarray, times: np.ndarray, source: np.ndarray, length: int,
                   ) -> np.ndarray:
  """Each rating's most recent STRICTLY earlier ratings by the same user among `source`.

  Args:
    users: [N] user keys (any sortable dtype).
    times: [N] finite timestamps.
    source: [N] bool, the ratings that may enter a history (e.g. train split, label 1).
    length: L >= 1, ratings kept per example (the most recent ones).

  Returns:
    [N, L] int64 indices of source ratings, most recent last (ties in index order),
    left-aligned, -1 padding. Same-time ratings (the example itself included) never enter.
  """
  return _previous(users, times, source, length)[0]


def _previous(users: np.ndarray, times: np.ndarray, source: np.ndarray, length: int,
              ) -> tuple[np.ndarray, np.ndarray]:
  """(`previous_among`'s rows, [N] int64 count of the user's strictly earlier source ratings)."""
  _, user_codes = np.unique(users, return_inverse=True)
  _, time_ranks = np.unique(times, return_inverse=True)
  keys = user_codes.astype(np.int64) * (int(time_ranks.max(initial=0)) + 2) + time_ranks
  src = np.flatnonzero(source)
  src = src[np.lexsort((src, keys[src]))]  # by (user, time), then index
  src_keys = keys[src]
  end = np.searchsorted(src_keys, keys, "left")  # first source at or after (user, t)
  user_first = keys - time_ranks  # the user's key at time rank 0
  start = np.searchsorted(src_keys, user_first, "left")
  earlier = (end - start).astype(np.int64)
  kept = np.minimum(earlier, length)
  cols = np.arange(length)
  pick = end[:, None] - kept[:, None] + cols[None, :]  # [N, L]
  safe = src[np.clip(pick, 0, max(src.shape[0] - 1, 0))] if src.shape[0] else np.zeros_like(pick)
  return np.where(cols[None, :] < kept[:, None], safe, PADDING_ID).astype(np.int64), earlier


def genre_bags(classes: np.ndarray, capacity: int) -> np.ndarray:
  """A movie's `class` field (b'Animation Comedy') -> its genre tokens.

  Args:
    classes: [N] bytes, space-separated genres per rating (b'' = none).
    capacity: G >= 1, tokens kept (the most genres any movie has: none is dropped).

  Returns:
    [N, G] bytes, the genres in file order, left-aligned, b'' padding.
  """
  distinct, inverse = np.unique(classes, return_inverse=True)
  tokens = [c.split()[:capacity] for c in distinct.tolist()]
  width = max([1] + [len(tok) for toks in tokens for tok in toks])
  table = np.zeros((len(tokens), capacity), dtype=f"S{width}")
  for i, toks in enumerate(tokens):
    table[i, :len(toks)] = toks
  return table[inverse.reshape(-1)]


def map_bag(bags: np.ndarray, train_rows: np.ndarray, hash_rows: int, min_count: int,
            ) -> tuple[np.ndarray, int]:
  """Maps a bag's tokens to rows of its own table, fitted on the train split.

  Args:
    bags: [N, G] bytes, b'' padding.
    train_rows: indices of the train examples (the vocabulary's source).
    hash_rows: `data.hash_rows` (> 0: hashing).
    min_count: `data.min_count` (a vocabulary's threshold, counted per token).

  Returns:
    (ids, rows): ids [N, G] int64 rows, -1 in padding; rows, the table's rows.
  """
  present = bags != b""
  train = bags[train_rows]
  mapper = feature_map.make_mapper(
      hash_rows, min_count, lambda: [train[present[train_rows]][:, None]], 1)
  ids = mapper(bags.reshape(-1, 1)).reshape(bags.shape)
  rows = mapper.dataset_spec(("genres",), 0).field_rows[0]
  return np.where(present, ids, PADDING_ID), int(rows)


def movielens_layout(one_hot: dict[str, int], options: FeatureOptions, genre_rows: int,
                     genre_capacity: int) -> FeatureLayout:
  """The layout: the one-hot fields (own tables, item_id's called 'item'), genres, history.

  Args:
    one_hot: one-hot feature name -> its table's rows, in field order.
    options: the genres and history choice.
    genre_rows: rows of the genres table (used when `options.genres == 'all'`).
    genre_capacity: G, ids of the genres bag.
  """
  tables, features = [], []
  for name, rows in one_hot.items():
    table = ITEM_TABLE if name == "item_id" else name
    tables.append(TableSpec(table, int(rows)))
    features.append(FeatureSpec(name, table))
  if options.genres == "all":
    tables.append(TableSpec("genres", int(genre_rows)))
    features.append(FeatureSpec("genres", "genres", "multi_hot", int(genre_capacity), "mean"))
  if options.history:
    features.append(FeatureSpec("history", ITEM_TABLE, "sequence", options.history))
  if options.label_history:
    for name in LABEL_HISTORIES:
      features.append(FeatureSpec(name, ITEM_TABLE, "sequence", options.label_history))
  return FeatureLayout(tuple(tables), tuple(features))


def layout_spec(layout: FeatureLayout) -> DatasetSpec:
  """The `DatasetSpec`: one field per feature, its rows those of the table it reads."""
  fields = tuple(FieldSpec(f.name, layout.tables[t].num_rows)
                 for f, t in zip(layout.features, layout.feature_tables, strict=True))
  return DatasetSpec(fields, 0, layout)


def stack_columns(layout: FeatureLayout, columns: dict[str, np.ndarray],
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Per-feature ids -> the batch's id columns and per-id weights.

  Args:
    layout: the feature layout.
    columns: feature name -> [N] or [N, capacity] int64 local ids, -1 padding.

  Returns:
    (ids, weights): ids [N, S] int64 in layout column order; weights [N, S] float32,
    1 for an id and 0 for padding.
  """
  parts = []
  for f in layout.features:
    part = np.asarray(columns[f.name], np.int64)
    parts.append(part.reshape(part.shape[0], f.capacity))
  ids = np.concatenate(parts, axis=1)
  return ids, (ids != PADDING_ID).astype(np.float32)
