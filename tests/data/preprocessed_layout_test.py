"""Tests for sfjax.data.preprocessed_layout: spec.json and mapping.json tied to the shards by
digests; a swapped, edited or old-format file is refused naming it."""

import json
import shutil

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.data import dataset, preprocessed, preprocessed_layout, shards, synthetic


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
