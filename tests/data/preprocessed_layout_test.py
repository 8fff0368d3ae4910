"""Tests for sfjax.data.preprocessed_layout: spec.json and mapping.json tied to the shards by
digests; a swapped, edited or old-format file is refused naming it."""

import json
import shutil
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.configs import ctr
from sfjax.core import feature_layout as fl
from sfjax.data import dataset, feature_map, preprocessed, preprocessed_layout, shards
from sfjax.data.generated import synthetic


@pytest.fixture(scope="module")
def criteo_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("criteo_text")
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / "train.tsv"), "train", 700)
  gen.write_criteo(str(root / "eval.tsv"), "eval", 300)
  gen.write_criteo(str(root / "test.tsv"), "eval", 100)
  return root


def _text_config(root, **data):
  d = ctr.get_config().data
  d.format, d.train_path = "criteo", f"{root}/train.tsv"
  d.eval_path, d.test_path = f"{root}/eval.tsv", f"{root}/test.tsv"
  d.shuffle_buffer = 0
  for k, v in data.items():
    d[k] = v
  return d


def _binary_config(out_dir):
  d = ctr.get_config().data
  d.format, d.train_path, d.shuffle_buffer = "preprocessed", str(out_dir), 0
  return d


@pytest.fixture(scope="module")
def pre_dir(criteo_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp("pre") / "dir"
  preprocessed.preprocess_files(_text_config(criteo_dir, hash_rows=500), str(out),
                                rows_per_shard=100)
  return out


@pytest.fixture(scope="module")
def other_dir(criteo_dir, tmp_path_factory):
  """The same text preprocessed with other settings (hash rows, rows per shard)."""
  out = tmp_path_factory.mktemp("other") / "dir"
  preprocessed.preprocess_files(_text_config(criteo_dir, hash_rows=400), str(out),
                                rows_per_shard=300)
  return out


def test_digests_tie_spec_and_mapping_to_the_shards(pre_dir, other_dir):
  digests = preprocessed_layout.dataset_digests(str(pre_dir))
  assert set(digests) == {"spec_crc32", "mapping_crc32", "splits"}
  assert set(digests["splits"]) == {"train", "eval", "test"}
  assert dataset.make_dataset(_binary_config(pre_dir), seed=0).digests == digests
  spec = json.loads((pre_dir / "spec.json").read_text())
  assert spec["version"] == 2 and spec["mapping_crc32"] == digests["mapping_crc32"]
  for split in ("train", "eval", "test"):
    recorded = json.loads((pre_dir / split / "split.json").read_text())["dataset"]
    assert recorded == {"spec_crc32": digests["spec_crc32"],
                        "mapping_crc32": digests["mapping_crc32"]}
  other = preprocessed_layout.dataset_digests(str(other_dir))
  assert other["spec_crc32"] != digests["spec_crc32"]
  assert other["mapping_crc32"] != digests["mapping_crc32"]
  assert other["splits"]["train"] != digests["splits"]["train"]


@pytest.mark.parametrize("swapped", ["spec.json", "mapping.json"])
def test_a_swapped_spec_or_mapping_is_refused_naming_it(pre_dir, other_dir, tmp_path, swapped):
  broken = tmp_path / "broken"
  shutil.copytree(pre_dir, broken)
  shutil.copyfile(other_dir / swapped, broken / swapped)
  for opener in (lambda: dataset.make_dataset(_binary_config(broken), seed=0),
                 lambda: preprocessed_layout.dataset_digests(str(broken))):
    with pytest.raises(shards.CorruptShardError, match="does not belong") as info:
      opener()
    assert info.value.path == str(broken / swapped) and "\n" not in str(info.value)


def test_an_edited_spec_with_the_same_fields_is_refused(pre_dir, tmp_path):
  broken = tmp_path / "broken"
  shutil.copytree(pre_dir, broken)
  spec = json.loads((broken / "spec.json").read_text())
  spec["source"]["paths"]["train"] = ["/elsewhere/train.tsv"]
  (broken / "spec.json").write_text(json.dumps(spec))
  with pytest.raises(shards.CorruptShardError, match="spec CRC-32 .* train/split.json records"):
    dataset.make_dataset(_binary_config(broken), seed=0)
  spec = json.loads((pre_dir / "spec.json").read_text())
  spec["splits"]["eval"]["num_examples"] += 1
  (broken / "spec.json").write_text(json.dumps(spec))
  with pytest.raises(shards.CorruptShardError, match="says 301 eval examples"):
    dataset.make_dataset(_binary_config(broken), seed=0)
  spec["splits"]["eval"]["num_examples"] -= 1
  spec["mapping_crc32"] = "00000000"
  (broken / "spec.json").write_text(json.dumps(spec))
  with pytest.raises(shards.CorruptShardError, match="spec.json: does not belong"):
    dataset.make_dataset(_binary_config(broken), seed=0)


@pytest.mark.parametrize("edit, reason", [
    (lambda s: s["fields"].pop(), "says 25 fields / 13 dense, train/split.json 26 / 13: "
                                  "replaced or edited"),
    (lambda s: s.update(num_dense=12), "says 26 fields / 12 dense, train/split.json 26 / 13: "
                                       "replaced or edited"),
    (lambda s: s["splits"]["test"].update(num_examples=99), "says 99 test examples, "
                                                            "test/split.json 100: replaced or "
                                                            "edited"),
])
def test_a_spec_whose_counts_differ_from_a_split_names_both_files(pre_dir, tmp_path, edit,
                                                                   reason):
  broken = tmp_path / "broken"
  shutil.copytree(pre_dir, broken)
  spec = json.loads((broken / "spec.json").read_text())
  edit(spec)
  (broken / "spec.json").write_text(json.dumps(spec))
  assert _digests_refusal(broken) == (str(broken / "spec.json"), reason)


def _digests_refusal(root):
  """(path, reason) of the `CorruptShardError` that `dataset_digests(root)` raises."""
  with pytest.raises(shards.CorruptShardError) as err:
    preprocessed_layout.dataset_digests(str(root))
  return err.value.path, err.value.reason


def test_a_split_recording_another_mapping_or_spec_is_refused_in_full(pre_dir, tmp_path):
  broken = tmp_path / "broken"
  shutil.copytree(pre_dir, broken)
  digests = preprocessed_layout.dataset_digests(str(pre_dir))
  split_json = broken / "eval" / "split.json"
  info = json.loads(split_json.read_text())
  info["dataset"]["mapping_crc32"] = "0badf00d"  # spec.json and mapping.json still agree
  split_json.write_text(json.dumps(info))
  assert _digests_refusal(broken) == (
      str(broken / "mapping.json"),
      f"CRC-32 {digests['mapping_crc32']}, eval/split.json records 0badf00d: it does not belong "
      "to these shards (replaced or edited); restore it or preprocess again")
  info["dataset"]["mapping_crc32"] = digests["mapping_crc32"]
  info["dataset"]["spec_crc32"] = "0badf00d"
  split_json.write_text(json.dumps(info))
  assert _digests_refusal(broken) == (
      str(broken / "spec.json"),
      f"does not belong to the shards in eval/ (spec CRC-32 {digests['spec_crc32']}, "
      "eval/split.json records 0badf00d): replaced or edited; restore it or preprocess again")


def test_a_replaced_vocabulary_file_is_refused_naming_it(criteo_dir, tmp_path):
  out = tmp_path / "vocab"
  preprocessed.preprocess_files(_text_config(criteo_dir, min_count=2), str(out),
                                rows_per_shard=500)
  dataset.make_dataset(_binary_config(out), seed=0)
  keys_path = out / "vocabulary" / "C3.keys.npy"
  keys = np.load(keys_path)
  np.save(keys_path, keys[::-1].copy())  # same size, other order: only the CRC can tell
  for opener in (lambda: dataset.make_dataset(_binary_config(out), seed=0),
                 lambda: preprocessed_layout.load_mapping(str(out))):
    with pytest.raises(shards.CorruptShardError, match="replaced: preprocess again") as info:
      opener()
    assert info.value.path == str(keys_path)


def test_a_directory_without_digests_is_refused_with_a_hint(pre_dir, tmp_path):
  old = tmp_path / "old"
  shutil.copytree(pre_dir, old)
  spec = json.loads((old / "spec.json").read_text())
  spec["version"] = 1
  del spec["mapping_crc32"]
  (old / "spec.json").write_text(json.dumps(spec))
  with pytest.raises(shards.CorruptShardError, match="older sfjax .* --overwrite") as info:
    dataset.make_dataset(_binary_config(old), seed=0)
  assert info.value.path == str(old / "spec.json") and "\n" not in str(info.value)


def test_spec_digest_ignores_the_split_counts_and_the_formatting(pre_dir):
  spec = json.loads((pre_dir / "spec.json").read_text())
  want = preprocessed_layout.spec_crc32(spec)
  assert preprocessed_layout.spec_crc32(json.loads(json.dumps(spec, indent=4))) == want
  assert preprocessed_layout.spec_crc32({**spec, "splits": {}}) == want
  assert preprocessed_layout.spec_crc32({**spec, "rows_per_shard": 99}) != want
  assert preprocessed_layout.read_spec(str(pre_dir))["spec_crc32"] == want


def test_a_missing_or_malformed_mapping_is_named(pre_dir, tmp_path):
  broken = tmp_path / "broken"
  shutil.copytree(pre_dir, broken)
  (broken / "mapping.json").unlink()
  with pytest.raises(shards.CorruptShardError, match="mapping.json: missing") as info:
    preprocessed_layout.dataset_digests(str(broken))
  assert info.value.path == str(broken / "mapping.json")
  (broken / "mapping.json").write_text("{not json")
  with pytest.raises(shards.CorruptShardError, match="mapping.json: malformed"):
    dataset.make_dataset(_binary_config(broken), seed=0)


def test_spec_records_no_layout_for_one_hot_data(pre_dir):
  spec = json.loads((pre_dir / "spec.json").read_text())
  assert "layout" not in spec and "truncated_ids" not in spec["splits"]["train"]
  assert json.loads((pre_dir / "train" / "split.json").read_text())["version"] == 2


@pytest.fixture(scope="module")
def bag_dir(tmp_path_factory):
  """Parquet with a sequence sharing the item table and a weighted bag, preprocessed."""
  root = tmp_path_factory.mktemp("bags")
  table = pa.table({"label": pa.array([0, 1, 1, 0, 1]), "item": pa.array([1, 2, 3, 2, 1]),
                    "history": pa.array([[1, 2, 3], [], [3, 2], [9], [1]]),
                    "tags": pa.array([["x"], ["y", "z"], [], ["x", "x"], ["z"]]),
                    "tw": pa.array([[0.5], [1.0, 2.0], [], [1.0, 3.0], [0.0]])})
  pq.write_table(table, root / "a.parquet", row_group_size=2)
  d = ctr.get_config().data
  d.format, d.train_path, d.eval_path = "parquet", str(root / "a.parquet"), str(root / "a.parquet")
  d.hash_rows, d.shuffle_buffer = 20, 0
  d.parquet.bags, d.parquet.shared_tables = "history:sequence:2,tags:multi_hot:2:sum:tw", "history=item"
  preprocessed.preprocess_files(d, str(root / "dir"), rows_per_shard=3)
  return root / "dir"


def test_the_layout_is_recorded_and_an_edited_one_is_refused(bag_dir, tmp_path):
  spec = json.loads((bag_dir / "spec.json").read_text())
  layout = fl.layout_from_json(spec["layout"])
  assert [f.table for f in layout.features] == ["item", "item", "tags"]
  assert spec["splits"]["train"]["truncated_ids"] == 1  # history [1, 2, 3] keeps [2, 3]
  ds = dataset.make_dataset(_binary_config(bag_dir), seed=0)
  assert ds.spec.layout == layout and ds.spec.num_columns == 5
  assert preprocessed_layout.dataset_digests(str(bag_dir)) == ds.digests
  broken = tmp_path / "broken"
  shutil.copytree(bag_dir, broken)
  spec["layout"]["features"][1]["capacity"] = 3  # same fields, another layout
  (broken / "spec.json").write_text(json.dumps(spec))
  with pytest.raises(shards.CorruptShardError, match="spec.json: does not belong") as info:
    dataset.make_dataset(_binary_config(broken), seed=0)
  assert info.value.path == str(broken / "spec.json")
  spec["layout"]["features"][1]["kind"] = "tree"
  (broken / "spec.json").write_text(json.dumps(spec))
  with pytest.raises(shards.CorruptShardError, match="spec.json: malformed.*features.inputs.history"):
    dataset.make_dataset(_binary_config(broken), seed=0)
  shutil.copyfile(bag_dir / "spec.json", broken / "spec.json")
  split = json.loads((broken / "train" / "split.json").read_text())
  split["layout"]["features"][2]["pooling"] = "mean"  # the shards' layout, edited
  (broken / "train" / "split.json").write_text(json.dumps(split))
  with pytest.raises(shards.CorruptShardError, match="does not belong to the shards in train/"):
    dataset.make_dataset(_binary_config(broken), seed=0)
  split["version"] = 2  # a layout split claiming the one-hot format: its bag files unlisted
  (broken / "train" / "split.json").write_text(json.dumps(split))
  with pytest.raises(shards.CorruptShardError, match=r"shard_00000.ids.npy: holds int32\[3, 1\], "
                     r"expected int32\[3, 3\]"):
    dataset.make_dataset(_binary_config(broken), seed=0)


def test_a_hashing_mapping_round_trips_and_is_described(tmp_path):
  crc = preprocessed_layout.save_mapping(feature_map.HashingMapper(7), ("a", "b"), str(tmp_path))
  raw = (tmp_path / preprocessed_layout.MAPPING_FILE).read_bytes()
  settings = json.loads(raw)
  assert settings == {
      "kind": "hashing", "num_rows": 7, "row": "key mod num_rows",
      "key": "feature_map.value_keys: SplitMix64 over the raw value's bytes (8-byte "
             "little-endian words) from a per-field salt"}
  assert raw.decode() == json.dumps(settings, indent=1) + "\n"
  assert crc == f"{zlib.crc32(raw):08x}"
  loaded = preprocessed_layout.load_mapping(str(tmp_path))
  assert isinstance(loaded, feature_map.HashingMapper) and loaded.num_rows == 7


def test_a_vocabulary_mapping_round_trips_with_its_key_files(tmp_path):
  vocab = feature_map.Vocabulary((np.array([3, 9], np.uint64), np.array([5], np.uint64)), 2, (4, 1))
  preprocessed_layout.save_mapping(vocab, ("a", "b"), str(tmp_path))
  settings = json.loads((tmp_path / preprocessed_layout.MAPPING_FILE).read_text())
  assert (settings["kind"], settings["min_count"], settings["num_distinct"]) == ("vocabulary", 2,
                                                                                 [4, 1])
  assert settings["row"] == ("1 + position of the key in the field's sorted keys; 0 = out of "
                             "vocabulary")
  assert [(f["name"], f["keys"], f["num_keys"]) for f in settings["fields"]] == [
      ("a", "vocabulary/a.keys.npy", 2), ("b", "vocabulary/b.keys.npy", 1)]
  loaded = preprocessed_layout.load_mapping(str(tmp_path))
  assert (loaded.min_count, loaded.num_distinct) == (2, (4, 1))
  for got, want in zip(loaded.keys, vocab.keys, strict=True):
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, want)
  (tmp_path / "vocabulary" / "b.keys.npy").unlink()
  with pytest.raises(shards.CorruptShardError) as err:
    preprocessed_layout.load_mapping(str(tmp_path))
  assert str(err.value) == (f"{tmp_path / 'vocabulary' / 'b.keys.npy'}: missing (listed in "
                            "mapping.json)")
  with pytest.raises(TypeError, match="^cannot store a mapper of type object$"):
    preprocessed_layout.mapping_settings(object())


def test_the_spec_digest_is_the_crc_of_its_canonical_json():
  meta = {"b": 1, "a": [1, 2], "splits": {"train": {"num_examples": 3}}}
  canonical = b'{"a":[1,2],"b":1}'  # sorted keys, no spaces, no per-split counts
  assert preprocessed_layout.spec_crc32(meta) == f"{zlib.crc32(canonical):08x}"


@pytest.mark.parametrize("meta,reason", [
    (None, "missing: not a preprocessed directory, or preprocessing did not finish (run "
           "experiments.preprocess)"),
    ({"kind": "sfjax.preprocessed", "version": 1},
     "written by an older sfjax (format 1: no spec/mapping digests to check the shards against); "
     "preprocess again (python -m experiments.preprocess ... --overwrite)"),
    ({"kind": "other", "version": 2}, "malformed (kind/version 'other'/2)"),
    ({"kind": "sfjax.preprocessed", "version": 3}, "malformed (kind/version 'sfjax.preprocessed'/3)"),
    ({"kind": "sfjax.preprocessed", "version": 2}, "malformed ('mapping_crc32')"),
])
def test_a_bad_spec_is_named_with_its_reason(tmp_path, meta, reason):
  if meta is not None:
    (tmp_path / preprocessed_layout.SPEC_FILE).write_text(json.dumps(meta))
  with pytest.raises(shards.CorruptShardError) as err:
    preprocessed_layout.read_spec(str(tmp_path))
  assert str(err.value) == f"{tmp_path / preprocessed_layout.SPEC_FILE}: {reason}"
