"""Tests for sfjax.data.dataset: the `make_dataset` factory over file formats."""

import itertools
import sys
import types

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import DataFormatError
from sfjax.data import avazu, dataset


def _criteo_line(i, label=None):
  ints = [str(i % 5)] + [""] * 12
  cats = [f"{i % 3:08x}", f"{i:08x}"] + [""] * 24
  return "\t".join([str(i % 2 if label is None else label)] + ints + cats) + "\n"


def _config(**data):
  cfg = ctr.get_config().data
  for k, v in data.items():
    cfg[k] = v
  return cfg


@pytest.fixture
def criteo_files(tmp_path, write_file):
  write_file(tmp_path / "train-0.tsv", [_criteo_line(i) for i in range(0, 30)])
  write_file(tmp_path / "train-1.tsv.gz", [_criteo_line(i) for i in range(30, 50)], gz=True)
  write_file(tmp_path / "eval.tsv", [_criteo_line(i) for i in range(100, 110)])
  write_file(tmp_path / "test.tsv", [_criteo_line(i) for i in range(200, 203)])
  return tmp_path


def test_criteo_hashing_dataset(criteo_files):
  cfg = _config(format="criteo", train_path=f"{criteo_files}/train-*", hash_rows=64,
                eval_path=f"{criteo_files}/eval.tsv", test_path=f"{criteo_files}/test.tsv")
  ds = dataset.make_dataset(cfg, seed=0)
  assert ds.spec.field_rows == (64,) * 26 and ds.spec.num_dense == 13
  assert ds.eval_splits == ("eval", "test") and ds.oracle is None
  ev = list(ds.eval_batches("eval", 4))
  assert [b.mask.tolist() for b in ev] == [[1] * 4, [1] * 4, [1, 1, 0, 0]]
  labels = np.concatenate([b.labels for b in ev])
  np.testing.assert_array_equal(labels[:10], np.arange(100, 110) % 2)
  np.testing.assert_allclose(ev[0].dense[:, 0], np.log1p(np.arange(100, 104) % 5), rtol=1e-6)
  assert ev[-1].ids[2:].max() == 0 and (ev[0].ids < 64).all()
  assert next(ds.eval_batches("test", 8)).mask.sum() == 3
  batches = list(itertools.islice(ds.train_batches(16, seed=1), 7))  # > 2 epochs of 50
  assert all(b.ids.shape == (16, 26) and b.mask.all() for b in batches)
  again = list(itertools.islice(ds.train_batches(16, seed=1), 7))
  assert all(np.array_equal(a.ids, b.ids) for a, b in zip(batches, again, strict=True))
  assert ds.stats == {"bad_lines": 0, "bad_lines_by_split": {"train": 0, "eval": 0, "test": 0}}


def test_criteo_vocabulary_dataset_maps_unseen_to_oov(criteo_files):
  cfg = _config(format="criteo", train_path=f"{criteo_files}/train-*", min_count=2,
                eval_path=f"{criteo_files}/eval.tsv")
  ds = dataset.make_dataset(cfg, seed=0)
  # C1 takes 3 values, each >= 2 times; C2 is unique per line (all OOV); C3.. always ''.
  assert ds.spec.field_rows == (4, 1) + (2,) * 24
  assert ds.eval_splits == ("eval",)
  ev = next(ds.eval_batches("eval", 16))
  real = ev.mask > 0
  assert (ev.ids[real, 0] > 0).all()
  assert (ev.ids[real, 1] == 0).all()
  assert (ev.ids[real, 2:] == 1).all()


def test_skip_bad_lines_is_counted_in_stats(tmp_path, write_file):
  lines = [_criteo_line(i) for i in range(10)]
  lines[3] = _criteo_line(3, label=5)
  lines[7] = "junk\n"
  cfg = _config(format="criteo", train_path=write_file(tmp_path / "t.tsv", lines), hash_rows=8,
                eval_path=write_file(tmp_path / "e.tsv", lines[:5]), skip_bad_lines=True)
  ds = dataset.make_dataset(cfg, seed=0)
  next(ds.train_batches(4, 0))  # Hashing needs no pass at construction: stream once.
  assert sum(b.mask.sum() for b in ds.eval_batches("eval", 4)) == 4
  assert ds.stats["bad_lines_by_split"] == {"train": 2, "eval": 1}
  assert ds.stats["bad_lines"] == 3
  cfg.skip_bad_lines = False
  strict = dataset.make_dataset(cfg, seed=0)  # Hashing: nothing is read until iterated.
  with pytest.raises(DataFormatError, match=r"t.tsv:4: label must be 0 or 1, got '5'"):
    next(strict.train_batches(4, 0))
  cfg.hash_rows = 0  # The vocabulary pass reads the train files at construction.
  with pytest.raises(DataFormatError, match=r"t.tsv:4: label must be 0 or 1, got '5'"):
    dataset.make_dataset(cfg, seed=0)


def test_avazu_dataset(tmp_path):
  header = ["id", "click", "hour"] + list(avazu.CATEGORICAL_COLUMNS)
  rows = [[str(i), str(i % 2), "14102100"] + ["x"] * 21 for i in range(6)]
  text = ",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in rows)
  path = tmp_path / "train.csv"
  path.write_text(text)
  ds = dataset.make_dataset(_config(format="avazu", train_path=str(path), eval_path=str(path)), 0)
  assert ds.spec.num_fields == 23 and ds.spec.num_dense == 0
  assert ds.spec.field_rows == (2,) * 23  # One value per field + OOV.
  batch = next(ds.train_batches(4, 0))
  assert batch.dense.shape == (4, 0) and (batch.ids == 1).all()


def test_config_errors_name_the_key(tmp_path, write_file):
  known = r"\(known: synthetic, multihot, criteo, avazu, parquet, movielens, preprocessed\)"
  with pytest.raises(ValueError, match=rf"data.format: unknown format 'orc' {known}"):
    dataset.make_dataset(_config(format="orc"), 0)
  with pytest.raises(ValueError, match="data.train_path is empty"):
    dataset.make_dataset(_config(format="criteo"), 0)
  with pytest.raises(ValueError, match="data.eval_path: .* matches no file"):
    cfg = _config(format="avazu", train_path=__file__, eval_path=f"{tmp_path}/none*")
    dataset.make_dataset(cfg, 0)
  path = write_file(tmp_path / "t.tsv", [_criteo_line(0)])
  with pytest.raises(ValueError, match="data.hash_rows must be >= 0"):
    dataset.make_dataset(_config(format="criteo", train_path=path, hash_rows=-3), 0)
  ds = dataset.make_dataset(_config(format="criteo", train_path=path, hash_rows=4), 0)
  with pytest.raises(ValueError, match=r"unknown eval split 'eval' \(known: none"):
    ds.eval_batches("eval", 4)


def test_file_dataset_exposes_its_splits_for_preprocessing(criteo_files):
  cfg = _config(format="criteo", train_path=f"{criteo_files}/train-*", hash_rows=64,
                eval_path=f"{criteo_files}/eval.tsv")
  ds = dataset.make_dataset(cfg, seed=0)
  assert ds.format_name == "criteo"
  assert ds.paths == {"train": (f"{criteo_files}/train-0.tsv", f"{criteo_files}/train-1.tsv.gz"),
                      "eval": (f"{criteo_files}/eval.tsv",)}
  assert sum(c.size for c in ds.chunks("train")) == 50  # one pass, file order
  with pytest.raises(ValueError, match=r"unknown split 'test' \(known: train, eval\)"):
    next(ds.chunks("test"))


def test_synthetic_format_delegates_to_synthetic_ctr(monkeypatch):
  fake = types.ModuleType("sfjax.data.generated.synthetic")
  fake.SyntheticCTR = lambda cfg, seed: ("synthetic", cfg.num_train, seed)
  monkeypatch.setitem(sys.modules, "sfjax.data.generated.synthetic", fake)
  cfg = _config(format="synthetic")
  assert dataset.make_dataset(cfg, seed=7) == ("synthetic", cfg.synthetic.num_train, 7)


_AVAZU_HEADER = ",".join(["id", "click", "hour"] + list(avazu.CATEGORICAL_COLUMNS)) + "\n"


@pytest.mark.parametrize("fmt, content", [("criteo", b""), ("avazu", b""),
                                          ("avazu", _AVAZU_HEADER.encode())])  # Header only.
@pytest.mark.parametrize("split", ["train", "eval", "test"])
def test_a_split_without_data_lines_fails_at_construction_naming_it(tmp_path, write_file, fmt,
                                                                    content, split):
  if fmt == "criteo":
    good = write_file(tmp_path / "good.tsv", [_criteo_line(0)])
  else:
    good = write_file(tmp_path / "good.csv",
                      _AVAZU_HEADER + ",".join(["1", "0", "14102100"] + ["x"] * 21) + "\n")
  empty = tmp_path / f"empty.{fmt}"
  empty.write_bytes(content)
  paths = {"train": good, "eval": good, "test": good, split: str(empty)}
  cfg = _config(format=fmt, hash_rows=8, train_path=paths["train"], eval_path=paths["eval"],
                test_path=paths["test"])
  with pytest.raises(ValueError, match=rf"^data.{split}_path: split '{split}' has no examples: "
                     rf"no data line in {empty}$"):
    dataset.make_dataset(cfg, 0)
  cfg.hash_rows = 0  # The vocabulary pass must not hide an empty split either.
  with pytest.raises(ValueError, match=rf"^data.{split}_path: split '{split}' has no examples"):
    dataset.make_dataset(cfg, 0)


def test_a_0_byte_part_of_a_glob_is_harmless(tmp_path, write_file):
  write_file(tmp_path / "t-0.tsv", "")
  write_file(tmp_path / "t-1.tsv.gz", [_criteo_line(i) for i in range(3)], gz=True)
  write_file(tmp_path / "t-2.tsv.gz", "", gz=True)
  cfg = _config(format="criteo", hash_rows=8, train_path=f"{tmp_path}/t-*",
                eval_path=f"{tmp_path}/t-*")
  ds = dataset.make_dataset(cfg, 0)
  assert sum(b.mask.sum() for b in ds.eval_batches("eval", 2)) == 3
  assert next(ds.train_batches(5, 0)).size == 5


def test_a_split_whose_every_line_is_skipped_names_it_after_one_pass(tmp_path, write_file):
  good = write_file(tmp_path / "t.tsv", [_criteo_line(i) for i in range(4)])
  junk = write_file(tmp_path / "e.tsv", ["junk\n", _criteo_line(1, label=7)])
  cfg = _config(format="criteo", hash_rows=8, train_path=good, eval_path=junk,
                skip_bad_lines=True)
  ds = dataset.make_dataset(cfg, 0)  # Data lines exist; that they are all bad shows on reading.
  with pytest.raises(ValueError, match=rf"^data.eval_path: split 'eval' has no examples: all 2 "
                     rf"data lines of {junk} were malformed and skipped$"):
    list(ds.eval_batches("eval", 4))
  cfg.train_path, cfg.eval_path = junk, good
  with pytest.raises(ValueError, match=r"^data.train_path: split 'train' has no examples"):
    next(dataset.make_dataset(cfg, 0).train_batches(4, 0))


def test_ids_stay_in_the_table_for_values_never_seen(criteo_files, write_file):
  unseen = write_file(criteo_files / "unseen.tsv",
                      ["\t".join(["1"] + ["1"] * 13 + [f"new{j}" for j in range(26)]) + "\n"])
  for hash_rows in (0, 5):  # A vocabulary maps them to the OOV row 0; hashing wraps them.
    cfg = _config(format="criteo", train_path=f"{criteo_files}/train-*", eval_path=unseen,
                  hash_rows=hash_rows)
    ds = dataset.make_dataset(cfg, 0)
    ids = next(ds.eval_batches("eval", 1)).ids[0]
    assert ((ids >= 0) & (ids < np.asarray(ds.spec.field_rows))).all()
    if hash_rows == 0:
      assert (ids == 0).all()
