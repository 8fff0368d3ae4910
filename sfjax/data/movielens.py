"""MovieLens-100k as a click log (`data.format = 'movielens'`).

Reads RecBole's atomic files `ml-100k.{inter,user,item}` (tab-separated, typed
header like `user_id:token`), from `data.movielens.path` or from the copy
inside the `recbole` wheel (`pip install --no-deps recbole==1.2.1`), located
without importing recbole (importing it needs torch). The data is never copied.

Each rating is one example: click = rating >= 4, and 8 categorical fields:
user_id, item_id, age, gender, occupation, zip3 (first 3 characters of the
zip code), release_year and genre (the first token of the item's `class`;
b'' when it has none). No dense features. A seeded random 80/10/10 split
gives 'train' / 'valid' / 'test'. The data is small (100k rows), so it is held
in memory; a vocabulary (or hashing) is fitted on the train split only.

`data.movielens.genres = 'all'` (all genres as a multi-hot bag) and/or
`data.movielens.history = N` (the user's N previous ratings as a sequence) give the
data set a feature layout (`sfjax.data.movielens_features`, issue #22); the split,
the example order and the one-hot fields stay the same.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import ml_collections
import numpy as np

from sfjax.core.errors import DataFormatError
from sfjax.core.feature_layout import PADDING_ID
from sfjax.data import batching, feature_map
from sfjax.data import movielens_features as features
from sfjax.data.types import Batch, DatasetSpec, make_batch

_FIELD_NAMES = ("user_id", "item_id", "age", "gender", "occupation", "zip3", "release_year", "genre")
_FILES = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")
_SPLITS = ("train", "valid", "test")
_SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
_INSTALL_HINT = "pip install --no-deps recbole==1.2.1"


def find_movielens_dir(path: str = "") -> str:
  """The folder holding `ml-100k.{inter,user,item}`.

  Args:
    path: `data.movielens.path`; '' = the copy inside the recbole wheel.

  Raises:
    FileNotFoundError: the files are not there, with how to get them.
  """
  if path:
    missing = [f for f in _FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
      raise FileNotFoundError(f"data.movielens.path={path!r} lacks {', '.join(missing)}")
    return path
  spec = importlib.util.find_spec("recbole")  # Locates the package; imports nothing.
  roots = list(spec.submodule_search_locations or []) if spec else []
  for root in roots:
    folder = os.path.join(root, "dataset_example", "ml-100k")
    if all(os.path.isfile(os.path.join(folder, f)) for f in _FILES):
      return folder
  raise FileNotFoundError(
      "MovieLens-100k not found: set data.movielens.path to a folder with "
      f"{', '.join(_FILES)}, or install the copy inside the recbole wheel with `{_INSTALL_HINT}`")


def _read_atomic_file(path: str, required: tuple[str, ...], skip_bad_lines: bool,
                      ) -> tuple[dict[str, int], list[tuple[int, list[bytes]]], int]:
  """Reads a RecBole atomic file (whole file: the data set is small).

  Args:
    path: the file; line 1 is the header `name:type\\t...`.
    required: column names that must be present.
    skip_bad_lines: drop lines with the wrong field count instead of raising.

  Returns:
    (columns, rows, num_bad): column name -> index, `(line number, fields)`
    per data line, and the number of lines dropped.
  """
  with open(path, "rb") as f:
    lines = f.read().splitlines()
  if not lines:
    raise DataFormatError(path, 1, "empty file, expected a typed header")
  names = [c.split(b":")[0].decode("utf-8", errors="replace") for c in lines[0].split(b"\t")]
  columns = {name: i for i, name in reversed(list(enumerate(names)))}
  missing = [c for c in required if c not in columns]
  if missing:
    raise DataFormatError(path, 1, f"header lacks required column(s) {', '.join(missing)}")
  rows, bad = [], 0
  for number, line in enumerate(lines[1:], start=2):
    fields = line.split(b"\t")
    if len(fields) == len(names):
      rows.append((number, fields))
    elif skip_bad_lines:
      bad += 1
    else:
      raise DataFormatError(
          path, number, f"expected {len(names)} tab-separated fields, got {len(fields)}")
  return columns, rows, bad


def _table(path: str, key: str, features: tuple[str, ...], skip_bad_lines: bool,
           ) -> tuple[dict[bytes, tuple[bytes, ...]], int]:
  """key value -> raw feature values, for the user and item files."""
  columns, rows, bad = _read_atomic_file(path, (key,) + features, skip_bad_lines)
  table = {}
  for _, fields in rows:
    table[fields[columns[key]]] = tuple(fields[columns[c]] for c in features)
  return table, bad


def _check_rating(text: bytes, uid: bytes, iid: bytes, users: dict, items: dict,
                  ) -> tuple[float, str | None]:
  """(rating, None) for a valid interaction, else (nan, the reason)."""
  try:
    rating = float(text)
  except ValueError:
    rating = float("nan")
  if not np.isfinite(rating):
    return rating, f"rating is not a finite number: {text.decode(errors='replace')!r}"
  if uid not in users:
    return rating, f"user_id {uid.decode(errors='replace')!r} is not in {_FILES[1]}"
  if iid not in items:
    return rating, f"item_id {iid.decode(errors='replace')!r} is not in {_FILES[2]}"
  return rating, None


class Ratings(NamedTuple):
  """All usable ratings of the inter file, in file order (a `text_io.RawChunk` and more).

  Attributes:
    values: [N, 8] bytes in `_FIELD_NAMES` order (genre = the item's first genre).
    dense: [N, 0] float32.
    labels: [N] float32, rating >= 4.
    classes: [N] bytes, the item's whole `class` field (all its genres).
    times: [N] float64 timestamps, or None when they were not read.
    genre_capacity: the most genres any movie of the item file has.
  """

  values: np.ndarray
  dense: np.ndarray
  labels: np.ndarray
  classes: np.ndarray
  times: np.ndarray | None
  genre_capacity: int


def _check_time(text: bytes) -> tuple[float, str | None]:
  """(timestamp, None) for a finite number, else (nan, the reason)."""
  try:
    value = float(text)
  except ValueError:
    value = float("nan")
  if not np.isfinite(value):
    return value, f"timestamp is not a finite number: {text.decode(errors='replace')!r}"
  return value, None


def _load_movielens(folder: str, skip_bad_lines: bool = False, with_times: bool = False,
                    ) -> tuple[Ratings, int]:
  """All ratings.

  Args:
    folder: holds `ml-100k.{inter,user,item}`.
    skip_bad_lines: drop bad lines (counted) instead of raising.
    with_times: read (and require) the inter file's `timestamp` column.

  Returns:
    (ratings, num_bad): the ratings; num_bad lines dropped.

  Raises:
    DataFormatError: a malformed line, a non-numeric rating (or timestamp) or an
      unknown user/item, naming file and line (unless `skip_bad_lines`).
  """
  inter, user, item = (os.path.join(folder, f) for f in _FILES)
  users, bad_u = _table(
      user, "user_id", ("age", "gender", "occupation", "zip_code"), skip_bad_lines)
  items, bad_i = _table(item, "item_id", ("release_year", "class"), skip_bad_lines)
  required = ("user_id", "item_id", "rating") + (("timestamp",) if with_times else ())
  columns, rows, bad = _read_atomic_file(inter, required, skip_bad_lines)
  bad += bad_u + bad_i
  values, labels, classes, times = [], [], [], []
  for number, fields in rows:
    uid, iid = fields[columns["user_id"]], fields[columns["item_id"]]
    rating, problem = _check_rating(fields[columns["rating"]], uid, iid, users, items)
    time = 0.0
    if problem is None and with_times:
      time, problem = _check_time(fields[columns["timestamp"]])
    if problem is not None:
      if not skip_bad_lines:
        raise DataFormatError(inter, number, problem)
      bad += 1
      continue
    age, gender, occupation, zip_code = users[uid]
    year, genres = items[iid]
    genre = genres.split()[0] if genres.split() else b""
    values.append((uid, iid, age, gender, occupation, zip_code[:3], year, genre))
    labels.append(rating >= 4.0)
    classes.append(genres)
    times.append(time)
  n = len(values)
  ratings = Ratings(
      np.array(values, dtype=bytes).reshape(n, len(_FIELD_NAMES)),
      np.zeros((n, 0), np.float32), np.asarray(labels, dtype=np.float32),
      np.array(classes, dtype=bytes).reshape(n),
      np.asarray(times, np.float64) if with_times else None,
      max([0] + [len(genres.split()) for _, genres in items.values()]))
  return ratings, bad


def _split_indices(n: int, seed: int) -> dict[str, np.ndarray]:
  """A seeded random 80/10/10 partition of range(n); each part sorted."""
  order = np.random.default_rng(seed).permutation(n)
  n_train = int(round(_SPLIT_FRACTIONS[0] * n))
  n_valid = int(round(_SPLIT_FRACTIONS[1] * n))
  parts = (order[:n_train], order[n_train:n_train + n_valid], order[n_train + n_valid:])
  return {name: np.sort(part) for name, part in zip(_SPLITS, parts, strict=True)}


class MovieLensDataset:
  """`CTRDataset` over MovieLens-100k (in memory), eval splits 'valid', 'test'."""

  def __init__(self, data_cfg: ml_collections.ConfigDict):
    ml = data_cfg.movielens
    options = features.feature_options(ml)
    self.folder = find_movielens_dir(str(ml.path))
    raw, bad = _load_movielens(self.folder, bool(data_cfg.skip_bad_lines), options.needs_times)
    split = _split_indices(raw.labels.shape[0], int(ml.split_seed))
    for name, idx in split.items():  # Fail now, not with a NaN metric at the first evaluation.
      if idx.shape[0] == 0:
        raise ValueError(
            f"data.movielens.path: split {name!r} has no examples: {raw.labels.shape[0]} usable "
            f"ratings in {self.folder} ({bad} bad lines dropped) are too few for an 80/10/10 "
            "split")
    mapper = feature_map.make_mapper(
        data_cfg.hash_rows, data_cfg.min_count, lambda: [raw.values[split["train"]]],
        len(_FIELD_NAMES))
    self.eval_splits = _SPLITS[1:]
    self.oracle = None
    self.split_rows = split  # split name -> its ratings (indices in file order, bad dropped)
    self.stats: dict[str, Any] = {"bad_lines": bad}
    self.spec: DatasetSpec
    if options.uses_layout:
      self.spec, ids, weights = self._layout_columns(raw, mapper, split["train"], options, data_cfg)
      self._batches = {
          name: make_batch(ids[idx], raw.dense[idx], raw.labels[idx], weights=weights[idx])
          for name, idx in split.items()}
    else:  # today's 8 one-hot fields, no layout
      self.spec = mapper.dataset_spec(_FIELD_NAMES, 0)
      self._batches = {
          name: make_batch(mapper(raw.values[idx]), raw.dense[idx], raw.labels[idx])
          for name, idx in split.items()}
    self.stats["examples"] = {name: b.size for name, b in self._batches.items()}
    self.stats["click_rate"] = {name: float(b.labels.mean()) for name, b in self._batches.items()}

  def _layout_columns(self, raw: Ratings, mapper: feature_map.FeatureMapper,
                      train_rows: np.ndarray, options: features.FeatureOptions,
                      data_cfg: ml_collections.ConfigDict,
                      ) -> tuple[DatasetSpec, np.ndarray, np.ndarray]:
    """The layout's spec, ids [N, S] and weights [N, S] of every rating (file order).

    The one-hot fields map exactly as without a layout (the same mapper); the genres
    bag and the history are added by `movielens_features`; stats gain their counts.
    """
    one_hot_ids = mapper(raw.values)  # [N, 8]
    rows = mapper.dataset_spec(_FIELD_NAMES, 0).field_rows
    keep = [i for i, name in enumerate(_FIELD_NAMES) if name != "genre" or options.genres == "first"]
    columns = {_FIELD_NAMES[i]: one_hot_ids[:, i] for i in keep}
    capacity = max(1, raw.genre_capacity)
    genre_rows = 1
    if options.genres == "all":
      bags = features.genre_bags(raw.classes, capacity)
      columns["genres"], genre_rows = features.map_bag(
          bags, train_rows, int(data_cfg.hash_rows), int(data_cfg.min_count))
      self.stats["genres_per_example"] = float((columns["genres"] >= 0).sum(1).mean())
    if options.history:
      assert raw.times is not None  # read whenever a history is asked for
      previous, earlier = features.previous_ratings(raw.values[:, 0], raw.times, options.history)
      item = _FIELD_NAMES.index("item_id")
      columns["history"] = np.where(
          previous >= 0, one_hot_ids[np.maximum(previous, 0), item], PADDING_ID)
      self.stats["history_mean_length"] = float(np.minimum(earlier, options.history).mean())
      self.stats["history_truncated"] = int((earlier > options.history).sum())
    if options.label_history:  # reads TRAIN-split labels only (movielens_features docstring)
      assert raw.times is not None
      in_train = np.zeros(raw.labels.shape[0], bool)
      in_train[train_rows] = True
      item = _FIELD_NAMES.index("item_id")
      for name, label in zip(features.LABEL_HISTORIES, (1.0, 0.0), strict=True):
        previous = features.previous_among(
            raw.values[:, 0], raw.times, in_train & (raw.labels == label), options.label_history)
        columns[name] = np.where(
            previous >= 0, one_hot_ids[np.maximum(previous, 0), item], PADDING_ID)
        self.stats[f"{name}_mean_length"] = float((previous >= 0).sum(1).mean())
    layout = features.movielens_layout(
        {_FIELD_NAMES[i]: rows[i] for i in keep}, options, genre_rows, capacity)
    ids, weights = features.stack_columns(layout, columns)
    return features.layout_spec(layout), ids, weights

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite full batches; each epoch is a fresh seeded permutation."""
    train = self._batches["train"]
    rng = np.random.default_rng(seed)

    def epoch():
      return [batching.take(train, rng.permutation(train.size))]

    return batching.train_batches(epoch, batch_size, shuffle_buffer=0, seed=seed)

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite batches of 'valid' or 'test', the last padded with mask 0."""
    if split not in self.eval_splits:
      raise ValueError(f"unknown eval split {split!r} (known: {', '.join(self.eval_splits)})")
    return batching.eval_batches([self._batches[split]], batch_size)
