"""Tests for sfjax.data.movielens: MovieLens-100k as a click log (one-hot, bags, history)."""

import bisect
import collections
import os

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import DataFormatError
from sfjax.data import movielens
from sfjax.train import ctr_defaults, loop

USER = "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
ITEM = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
INTER = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"


def _recbole_dir():
  try:
    return movielens.find_movielens_dir("")
  except FileNotFoundError as e:
    pytest.skip(f"recbole's ml-100k copy not installed ({e})")


def _mini(tmp_path, inter_rows=None):
  (tmp_path / "ml-100k.user").write_text(
      USER + "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\tT8H1N\n")
  (tmp_path / "ml-100k.item").write_text(
      ITEM + "10\tToy Story\t1995\tAnimation Children's Comedy\n11\tOdd\tunknown\t\n")
  rows = inter_rows or ["1\t10\t5\t1", "2\t10\t3\t2", "2\t11\t4.0\t3", "1\t11\t1\t4"]
  (tmp_path / "ml-100k.inter").write_text(INTER + "".join(r + "\n" for r in rows))
  return str(tmp_path)


def _config(path="", genres="first", history=0, **overrides):
  cfg = ctr.get_config("movielens_onehot").data
  cfg.movielens.path = path
  cfg.movielens.genres, cfg.movielens.history = genres, history
  for k, v in overrides.items():
    cfg[k] = v
  return cfg


def test_fields_and_labels_from_a_mini_copy(tmp_path):
  raw, bad = movielens._load_movielens(_mini(tmp_path))
  assert bad == 0 and raw.dense.shape == (4, 0)
  np.testing.assert_array_equal(raw.labels, [1, 0, 1, 0])  # rating >= 4
  assert raw.values[0].tolist() == [b"1", b"10", b"24", b"M", b"technician", b"857", b"1995",
                                    b"Animation"]
  assert raw.values[2].tolist() == [b"2", b"11", b"53", b"F", b"other", b"T8H", b"unknown", b""]


@pytest.mark.parametrize("row, reason", [
    ("3\t10\t5\t1", "user_id '3' is not in ml-100k.user"),
    ("1\t12\t5\t1", "item_id '12' is not in ml-100k.item"),
    ("1\t10\tfive\t1", "rating is not a finite number: 'five'"),
    ("1\t10\t5", "expected 4 tab-separated fields, got 3"),
])
def test_bad_interactions_name_file_and_line(tmp_path, row, reason):
  folder = _mini(tmp_path, ["1\t10\t5\t1", row])
  with pytest.raises(DataFormatError) as e:
    movielens._load_movielens(folder)
  assert (e.value.path, e.value.line, e.value.reason) == (f"{folder}/ml-100k.inter", 3, reason)
  raw, bad = movielens._load_movielens(folder, skip_bad_lines=True)
  assert (raw.labels.shape[0], bad) == (1, 1)


def test_missing_data_explains_how_to_get_it(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError, match=r"data.movielens.path=.* lacks ml-100k.inter"):
    movielens.find_movielens_dir(str(tmp_path))
  monkeypatch.setattr(movielens.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match=r"pip install --no-deps recbole==1\.2\.1"):
    movielens.find_movielens_dir("")


def test_split_is_80_10_10_disjoint_and_seeded():
  parts = movielens._split_indices(1000, seed=5)
  assert [len(parts[s]) for s in movielens._SPLITS] == [800, 100, 100]
  np.testing.assert_array_equal(np.sort(np.concatenate(list(parts.values()))), np.arange(1000))
  again = movielens._split_indices(1000, seed=5)
  assert all(np.array_equal(parts[s], again[s]) for s in movielens._SPLITS)
  assert not np.array_equal(parts["test"], movielens._split_indices(1000, seed=6)["test"])


def test_dataset_from_a_mini_copy_vocab_from_train(tmp_path):
  rows = [f"{1 + i % 2}\t{10 + i % 2}\t{i % 6}\t{i}" for i in range(40)]
  ds = movielens.MovieLensDataset(_config(_mini(tmp_path, rows)))
  assert ds.spec.num_fields == 8 and ds.spec.num_dense == 0
  assert ds.eval_splits == ("valid", "test") and ds.oracle is None
  assert ds.stats["examples"] == {"train": 32, "valid": 4, "test": 4}
  batch = next(ds.train_batches(16, seed=0))
  assert batch.ids.shape == (16, 8) and batch.mask.all()
  assert (batch.ids < np.asarray(ds.spec.field_rows)).all() and (batch.ids > 0).all()
  ev = list(ds.eval_batches("test", 3))
  assert [b.mask.tolist() for b in ev] == [[1, 1, 1], [1, 0, 0]]
  with pytest.raises(ValueError, match="unknown eval split 'eval'"):
    ds.eval_batches("eval", 4)


def test_recbole_copy_values_and_split_sizes():
  raw, bad = movielens._load_movielens(_recbole_dir())
  assert raw.values.shape == (100_000, 8) and bad == 0
  # First line of ml-100k.inter: user 196 rated item 242 (Kolya, 1996, Comedy) with 3.
  assert raw.values[0].tolist() == [b"196", b"242", b"49", b"M", b"writer", b"551", b"1996",
                                    b"Comedy"]
  assert raw.labels[0] == 0
  assert len(np.unique(raw.values[:, 0])) == 943 and len(np.unique(raw.values[:, 1])) == 1682
  assert set(np.unique(raw.values[:, 3]).tolist()) == {b"F", b"M"}


def test_recbole_dataset_is_deterministic():
  _recbole_dir()
  a = movielens.MovieLensDataset(_config())
  assert a.stats["examples"] == {"train": 80_000, "valid": 10_000, "test": 10_000}
  assert a.spec.field_rows[0] <= 944 and a.spec.field_rows[3] == 3  # users + OOV; F, M + OOV
  b = movielens.MovieLensDataset(_config())
  for split in ("valid", "test"):
    ba, bb = next(a.eval_batches(split, 512)), next(b.eval_batches(split, 512))
    np.testing.assert_array_equal(ba.ids, bb.ids)
  other = _config()
  other.movielens.split_seed = 7
  c = movielens.MovieLensDataset(other)
  test_a, test_c = next(a.eval_batches("test", 512)), next(c.eval_batches("test", 512))
  assert not np.array_equal(test_a.ids, test_c.ids)


def test_an_empty_split_fails_at_construction_naming_it(tmp_path):
  # 4 ratings: 80/10/10 leaves 'valid' empty; all-bad ratings leave every split empty.
  with pytest.raises(ValueError, match=r"^data.movielens.path: split 'valid' has no examples: "
                     r"4 usable ratings .* \(0 bad lines dropped\)"):
    movielens.MovieLensDataset(_config(_mini(tmp_path)))
  bad = _mini(tmp_path, ["1\t10\tnan\t1", "9\t10\t5\t2"])
  with pytest.raises(ValueError, match=r"split 'train' has no examples: 0 usable ratings .* "
                     r"\(2 bad lines dropped\)"):
    movielens.MovieLensDataset(_config(bad, skip_bad_lines=True))


def test_defaults_are_todays_one_hot_fields(tmp_path):
  assert (ctr_defaults().data.movielens.genres, ctr_defaults().data.movielens.history) == ("first", 0)
  assert ctr.get_config("movielens_onehot").data.movielens.to_dict() == ctr_defaults().data.movielens.to_dict()
  rows = [f"{1 + i % 2}\t{10 + i % 2}\t{i % 6}\t{i}" for i in range(40)]
  ds = movielens.MovieLensDataset(_config(_mini(tmp_path, rows)))
  assert ds.spec.layout is None and not ds.spec.has_padding
  assert [f.name for f in ds.spec.fields] == list(movielens._FIELD_NAMES)
  assert next(ds.train_batches(8, seed=0)).weights is None
  assert next(ds.eval_batches("test", 8)).weights is None


def _item_ids(ds, split, raw):
  """raw item bytes -> mapped item_id, from the data set's own item_id column."""
  batch = ds._batches[split]
  return dict(zip(raw.values[ds.split_rows[split], 1].tolist(), batch.ids[:, 1].tolist(), strict=True))


def test_mini_copy_with_all_genres_and_history(tmp_path):
  # Users 1/2 alternate; each user's items alternate 10, 10, 11, 11, ...; time = row.
  rows = [f"{1 + i % 2}\t{10 + (i // 2) % 2}\t{i % 6}\t{i}" for i in range(40)]
  folder = _mini(tmp_path, rows)
  ds = movielens.MovieLensDataset(_config(folder, genres="all", history=3))
  raw, _ = movielens._load_movielens(folder, with_times=True)
  layout = ds.spec.layout
  assert [f.name for f in layout.features] == [
      "user_id", "item_id", "age", "gender", "occupation", "zip3", "release_year", "genres",
      "history"]
  g, h = layout.columns(7), layout.columns(8)
  assert (g.stop - g.start, h.stop - h.start) == (3, 3)  # Toy Story's 3 genres; history 3
  offsets = ds.spec.column_offsets
  assert (offsets[h] == offsets[1]).all() and ds.spec.field_rows[8] == ds.spec.field_rows[1]
  item_ids = {}
  for split in movielens._SPLITS:
    item_ids.update(_item_ids(ds, split, raw))
  for split in movielens._SPLITS:
    batch = ds._batches[split]
    assert batch.weights.shape == batch.ids.shape == (batch.size, 1 + 1 + 5 + 3 + 3)
    np.testing.assert_array_equal(batch.weights, batch.ids != -1)
    for k, r in enumerate(ds.split_rows[split].tolist()):
      earlier = [r - d for d in (6, 4, 2) if r - d >= 0]  # the same user: every other row
      expected = [item_ids[f"{10 + (j // 2) % 2}".encode()] for j in earlier]
      assert batch.ids[k, h].tolist() == expected + [-1] * (3 - len(expected))
      toy_story = (r // 2) % 2 == 0
      assert (batch.ids[k, g] >= 1).sum() == (3 if toy_story else 0)  # item 11 has no genre
      assert (batch.ids[k, g] == -1).sum() == (0 if toy_story else 3)
  assert ds.stats["history_truncated"] == 40 - 8  # rows >= 8 had more than 3 earlier ones


def test_a_bad_timestamp_is_named_only_when_history_reads_it(tmp_path):
  folder = _mini(tmp_path, ["1\t10\t5\t1", "2\t11\t3\tsoon"])
  with pytest.raises(DataFormatError, match=r"ml-100k.inter:3: timestamp is not a finite number: 'soon'"):
    movielens._load_movielens(folder, with_times=True)
  ratings, bad = movielens._load_movielens(folder, skip_bad_lines=True, with_times=True)
  assert (ratings.labels.shape[0], bad) == (1, 1)
  assert movielens._load_movielens(folder)[0].labels.shape[0] == 2  # history off: not read


def _raw_inter(folder):
  """(user, item, timestamp) of every line of ml-100k.inter, read here independently."""
  with open(os.path.join(folder, "ml-100k.inter")) as f:
    header = f.readline().rstrip("\n").split("\t")
    cols = [header.index(f"{c}:{t}") for c, t in
            (("user_id", "token"), ("item_id", "token"), ("timestamp", "float"))]
    return [tuple(line.rstrip("\n").split("\t")[c] for c in cols) for line in f]


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_recbole_history_never_holds_its_own_or_a_later_rating():
  folder = _recbole_dir()
  length = 30
  ds = movielens.MovieLensDataset(_config(genres="all", history=length))
  inter = _raw_inter(folder)
  raw, _ = movielens._load_movielens(folder, with_times=True)
  assert len(inter) == raw.labels.shape[0] == 100_000  # no bad line: row r is line r + 2
  by_user = collections.defaultdict(list)  # user -> [(time, row, item)] in time order
  for r, (user, item, time) in enumerate(inter):
    by_user[user].append((float(time), r, item))
  user_times = {}
  for user, ratings in by_user.items():
    ratings.sort()
    user_times[user] = [t for t, _, _ in ratings]
  item_ids = {}
  for split in movielens._SPLITS:
    item_ids.update(_item_ids(ds, split, raw))
  users = np.array([u for u, _, _ in inter])
  rows = movielens.features.previous_ratings(users, raw.times, length)[0].tolist()
  h = ds.spec.layout.columns(8)
  checked = 0
  for split in movielens._SPLITS:
    batch = ds._batches[split]
    history, weights = batch.ids[:, h].tolist(), batch.weights[:, h].tolist()
    for k, r in enumerate(ds.split_rows[split].tolist()):
      user, item, time = inter[r]
      start = bisect.bisect_left(user_times[user], float(time))  # ties at `time` excluded
      earlier = by_user[user][max(0, start - length):start]  # the definition, in time order
      # The rows the history came from, by (user, item, timestamp) of the raw file.
      taken = [inter[j] for j in rows[r] if j >= 0]
      assert [(u, i, float(t)) for u, i, t in taken] == [(user, i, t) for t, _, i in earlier]
      assert r not in rows[r] and inter[r] not in taken  # never its own rating
      assert not taken or float(taken[-1][2]) < float(time)  # the newest is strictly earlier
      expected = [item_ids[i.encode()] for _, _, i in earlier]
      pad = length - len(expected)
      assert history[k] == expected + [-1] * pad, (split, r)
      assert weights[k] == [1.0] * len(expected) + [0.0] * pad
      checked += 1
  assert checked == 100_000


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_recbole_label_histories_hold_only_earlier_train_ratings_of_that_label():
  folder = _recbole_dir()
  length = 20
  cfg = _config(genres="all", history=0)
  cfg.movielens.label_history = length
  ds = movielens.MovieLensDataset(cfg)
  inter = _raw_inter(folder)
  raw, _ = movielens._load_movielens(folder, with_times=True)
  train = set(ds.split_rows["train"].tolist())
  by_user = collections.defaultdict(list)  # user -> [(time, row)] of TRAIN ratings only
  for r, (user, _, time) in enumerate(inter):
    if r in train:
      by_user[user].append((float(time), r))
  for ratings in by_user.values():
    ratings.sort()
  item_ids = {}
  for split in movielens._SPLITS:
    item_ids.update(_item_ids(ds, split, raw))
  names = [f.name for f in ds.spec.layout.features]
  checked = 0
  for name, label in (("liked_history", 1.0), ("disliked_history", 0.0)):
    cols = ds.spec.layout.columns(names.index(name))
    for split in movielens._SPLITS:
      ids = ds._batches[split].ids[:, cols].tolist()
      for k, r in enumerate(ds.split_rows[split].tolist()):
        user, _, time = inter[r]
        # The definition: train ratings of `user` with this label, strictly earlier.
        earlier = [j for t, j in by_user[user] if t < float(time) and raw.labels[j] == label]
        earlier = earlier[-length:]
        assert r not in earlier and all(j in train for j in earlier)
        expected = [item_ids[inter[j][1].encode()] for j in earlier]
        assert ids[k] == expected + [-1] * (length - len(expected)), (name, split, r)
        checked += 1
  assert checked == 200_000
  # A valid/test label reaches no feature: flipping them leaves every id unchanged.
  flipped = raw.labels.copy()
  held_out = np.concatenate([ds.split_rows["valid"], ds.split_rows["test"]])
  flipped[held_out] = 1.0 - flipped[held_out]
  in_train = np.zeros(flipped.shape[0], bool)
  in_train[ds.split_rows["train"]] = True
  users = raw.values[:, 0]
  for label in (1.0, 0.0):
    np.testing.assert_array_equal(
        movielens.features.previous_among(users, raw.times, in_train & (raw.labels == label), 5),
        movielens.features.previous_among(users, raw.times, in_train & (flipped == label), 5))


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_recbole_genre_bags_hold_every_genre_of_a_movie():
  _recbole_dir()
  ds = movielens.MovieLensDataset(_config(genres="all"))
  layout = ds.spec.layout
  assert [f.name for f in layout.features][-1] == "genres" and ds.spec.num_fields == 8
  g = layout.columns(7)
  assert g.stop - g.start == 6  # Empire Strikes Back, Transformers, Kid in King Arthur's Court
  raw, _ = movielens._load_movielens(movielens.find_movielens_dir(""))
  test = ds._batches["test"]
  items = raw.values[ds.split_rows["test"], 1]
  # item -> its genres: 1 Toy Story (Animation Children's Comedy), 242 Kolya (Comedy),
  # 50 Star Wars (Action Adventure Romance Sci-Fi War), 172 Empire Strikes Back (+ Drama).
  bags = {}
  for item, count in ((b"1", 3), (b"242", 1), (b"50", 5), (b"172", 6)):
    rows = np.flatnonzero(items == item)
    assert rows.size > 0, item
    bag = test.ids[rows[0], g]
    assert (bag >= 1).sum() == count and len(set(bag[bag >= 1].tolist())) == count
    assert (bag[count:] == -1).all() and (test.weights[rows, g][:, count:] == 0).all()
    assert (test.ids[rows, g] == bag).all()  # every rating of the movie has the same bag
    bags[item] = set(bag[bag >= 1].tolist())
  assert bags[b"242"] < bags[b"1"]  # Comedy is one of Toy Story's genres
  assert bags[b"50"] < bags[b"172"] and not bags[b"1"] & bags[b"50"]
  one_hot = movielens.MovieLensDataset(_config())
  np.testing.assert_array_equal(one_hot._batches["test"].ids[:, :7], test.ids[:, :7])


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_all_genres_and_history_train_end_to_end(tmp_path):
  rows = [f"{1 + i % 2}\t{10 + (i // 3) % 2}\t{(i * 7) % 6}\t{i // 4}" for i in range(60)]
  c = ctr.get_config("movielens")
  assert (c.data.movielens.genres, c.data.movielens.history) == ("all", 20)
  c.data.movielens.path = _mini(tmp_path, rows)
  c.model.mlp_dims, c.model.embed_dim = (8,), 4
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.log_every = 4, 16, 4, 4
  final, _ = loop.train_and_evaluate(c)
  assert np.isfinite(final["test_auc"]) and np.isfinite(final["valid_logloss"])
