"""Tests for sfjax.data.movielens: MovieLens-100k as an 8-field click log."""

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import DataFormatError
from sfjax.data import movielens

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


def _config(path="", **overrides):
  cfg = ctr.get_config("movielens").data
  cfg.movielens.path = path
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
