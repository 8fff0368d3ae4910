"""Tests for sfjax.data.preprocessed: text -> shards once, then the same examples as the text path."""

import itertools
import json
import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.configs import ctr
from sfjax.core.errors import ConfigError
from sfjax.data import dataset, feature_map, preprocessed, preprocessed_layout, shards
from sfjax.data.generated import synthetic
from sfjax.data.types import concat_batches
from sfjax.train import config_check, loop


@pytest.fixture(scope="module")
def criteo_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("criteo_text")
  gen = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=0)
  gen.write_criteo(str(root / "train_0.tsv"), "train", 700)
  gen.write_criteo(str(root / "train_1.tsv.gz"), "train", 500)  # 1200 train lines
  gen.write_criteo(str(root / "eval.tsv"), "eval", 300)
  other = synthetic.SyntheticCTR(ctr.get_config("smoke").data.synthetic, seed=1)
  other.write_criteo(str(root / "test.tsv"), "eval", 130)
  return root


def _text_config(root, **data):
  d = ctr.get_config().data
  d.format, d.train_path = "criteo", f"{root}/train_*"
  d.eval_path, d.test_path = f"{root}/eval.tsv", f"{root}/test.tsv"
  d.shuffle_buffer = 0
  for k, v in data.items():
    d[k] = v
  return d


def _binary_config(out_dir, shuffle_buffer=0):
  d = ctr.get_config().data
  d.format, d.train_path, d.shuffle_buffer = "preprocessed", str(out_dir), shuffle_buffer
  return d


def _assert_same_batches(a_iter, b_iter):
  count = 0
  for a, b in itertools.zip_longest(a_iter, b_iter):
    for x, y in zip(a, b, strict=True):
      if x is None or y is None:  # weights: absent on both sides without a feature layout
        assert x is y
        continue
      assert x.dtype == y.dtype
      np.testing.assert_array_equal(x, y)
    count += 1
  return count


@pytest.mark.parametrize("mapping", [{"hash_rows": 500}, {"min_count": 2}])
def test_shards_give_the_text_path_examples_in_its_order(criteo_dir, tmp_path, mapping):
  text_cfg = _text_config(criteo_dir, hash_rows=mapping.get("hash_rows", 0),
                          min_count=mapping.get("min_count", 1))
  meta = preprocessed.preprocess_files(text_cfg, str(tmp_path / "pre"), rows_per_shard=256)
  assert {k: v["num_examples"] for k, v in meta["splits"].items()} == {
      "train": 1200, "eval": 300, "test": 130}
  assert meta["splits"]["train"]["num_shards"] == 5 and meta["source"]["format"] == "criteo"
  assert meta == {**json.loads((tmp_path / "pre" / "spec.json").read_text())}

  text = dataset.make_dataset(text_cfg, seed=0)
  binary = dataset.make_dataset(_binary_config(tmp_path / "pre"), seed=0)
  assert isinstance(binary, preprocessed.PreprocessedDataset)
  assert binary.spec == text.spec and binary.eval_splits == ("eval", "test")
  assert binary.mapping["kind"] == ("hashing" if "hash_rows" in mapping else "vocabulary")
  # 3+ epochs of 1200 in batches of 512 that straddle epoch boundaries.
  n = _assert_same_batches(itertools.islice(text.train_batches(512, seed=3), 8),
                           itertools.islice(binary.train_batches(512, seed=3), 8))
  assert n == 8
  for split in ("eval", "test"):
    assert _assert_same_batches(text.eval_batches(split, 128), binary.eval_batches(split, 128)) > 1
  assert binary.stats == {"bad_lines": 0,
                          "preprocess_bad_lines_by_split": {"train": 0, "eval": 0, "test": 0},
                          "rows_read": 0}  # (by index: `read_train`; the stream counts none)

  mapper = preprocessed_layout.load_mapping(str(tmp_path / "pre"))
  if "hash_rows" in mapping:
    assert mapper == feature_map.HashingMapper(500)
  else:
    assert mapper.min_count == 2 and mapper.num_distinct == text.mapper.num_distinct
    for got, want in zip(mapper.keys, text.mapper.keys, strict=True):
      np.testing.assert_array_equal(got, want)
    settings = json.loads((tmp_path / "pre" / "mapping.json").read_text())
    assert settings["fields"][0]["keys"] == os.path.join("vocabulary", "C1.keys.npy")


@pytest.fixture(scope="module")
def pre_dir(criteo_dir, tmp_path_factory):
  out = tmp_path_factory.mktemp("pre") / "dir"
  preprocessed.preprocess_files(_text_config(criteo_dir, hash_rows=500), str(out),
                                rows_per_shard=100)
  return out


def test_shuffled_training_is_seeded_and_each_epoch_a_permutation(pre_dir):
  ds = dataset.make_dataset(_binary_config(pre_dir, shuffle_buffer=256), seed=0)
  plain = concat_batches(list(ds.split("train").chunks(1000)))
  epoch = concat_batches(list(itertools.islice(ds.train_batches(100, seed=5), 12)))  # 1200
  again = concat_batches(list(itertools.islice(ds.train_batches(100, seed=5), 12)))
  other = concat_batches(list(itertools.islice(ds.train_batches(100, seed=6), 12)))
  np.testing.assert_array_equal(epoch.ids, again.ids)
  assert not np.array_equal(epoch.ids, other.ids)
  assert not np.array_equal(epoch.ids, plain.ids)

  def rows(b):
    return sorted(map(tuple, np.concatenate([b.ids, b.dense, b.labels[:, None]], 1).tolist()))

  assert rows(epoch) == rows(plain)


def _block_config(out_dir, shuffle_buffer=256, block_rows=32):
  d = _binary_config(out_dir, shuffle_buffer)
  d.shuffle, d.shuffle_block_rows = "block", block_rows
  return d


def test_block_shuffle_is_its_index_order_split_over_processes(pre_dir):
  ds = dataset.make_dataset(_block_config(pre_dir), seed=0)
  plain = concat_batches(list(ds.split("train").chunks(1000)))
  stream = list(itertools.islice(ds.train_batches(100, seed=5), 30))  # 2.5 epochs of 1200
  # The reader by index gives the same batches; two processes, each reading its half of
  # every global batch, give them too (`input_feed`'s contract), from any position.
  order = ds.train_order(100, seed=5)
  halves = [dataset.make_dataset(_block_config(pre_dir), seed=0) for _ in range(2)]
  for step, batch in enumerate(stream):
    indices = order.next_batch()
    _assert_same_batches([batch], [ds.read_train(indices)])
    parts = [h.read_train(indices[p * 50:(p + 1) * 50]) for p, h in enumerate(halves)]
    _assert_same_batches([batch], [concat_batches(parts)])
    if step == 13:
      position = json.loads(json.dumps(order.position()))
  assert ds.stats["rows_read"] == 3000 and halves[0].stats["rows_read"] == 1500
  resumed = ds.train_order(100, seed=5, position=position)
  for batch in stream[14:]:
    _assert_same_batches([batch], [ds.read_train(resumed.next_batch())])

  def rows(b):
    return sorted(map(tuple, np.concatenate([b.ids, b.dense, b.labels[:, None]], 1).tolist()))

  epoch = concat_batches(stream[:12])
  assert rows(epoch) == rows(plain) and not np.array_equal(epoch.ids, plain.ids)
  again = concat_batches(list(itertools.islice(ds.train_batches(100, seed=5), 12)))
  np.testing.assert_array_equal(again.ids, epoch.ids)
  other = concat_batches(list(itertools.islice(ds.train_batches(100, seed=6), 12)))
  assert not np.array_equal(other.ids, epoch.ids)
  streamed = dataset.make_dataset(_binary_config(pre_dir, shuffle_buffer=256), seed=0)
  assert not np.array_equal(next(streamed.train_batches(100, seed=5)).ids, stream[0].ids)
  # A second thread preparing the windows changes nothing in the stream.
  d = _block_config(pre_dir)
  d.shuffle_threads = 2
  ahead = dataset.make_dataset(d, seed=0).train_batches(100, seed=5)
  _assert_same_batches(list(itertools.islice(ahead, 30)), stream)
  # The block shuffle keeps the ids as the shards store them (the reader by index too).
  assert stream[0].ids.dtype == ds.split("train").shard(0).ids.dtype == np.int32
  # shuffle_buffer <= 1: file order in either mode.
  unshuffled = dataset.make_dataset(_block_config(pre_dir, shuffle_buffer=0), seed=0)
  np.testing.assert_array_equal(next(unshuffled.train_batches(1200, seed=5)).ids, plain.ids)


def test_block_shuffle_settings_are_checked(pre_dir):
  with pytest.raises(ValueError, match="data.shuffle must be one of buffer, block, got 'rows'"):
    d = _block_config(pre_dir)
    d.shuffle = "rows"
    dataset.make_dataset(d, seed=0)
  with pytest.raises(ValueError, match="data.shuffle_block_rows must be >= 1, got 0"):
    dataset.make_dataset(_block_config(pre_dir, block_rows=0), seed=0)
  d = _block_config(pre_dir)
  d.shuffle_threads = 3
  with pytest.raises(ValueError, match="data.shuffle_threads must be 1 or 2, got 3"):
    dataset.make_dataset(d, seed=0)
  c = ctr.get_config()
  c.data.shuffle_threads = 0
  with pytest.raises(ConfigError, match="data.shuffle_threads: must be an integer in \\[1, 2\\]"):
    config_check.validate(c)
  c = ctr.get_config()
  c.data.format, c.data.train_path, c.data.eval_path = "criteo", "x.tsv", "y.tsv"
  c.data.shuffle = "block"
  with pytest.raises(ConfigError, match="data.shuffle.*format 'criteo' shuffles with the stream"):
    config_check.validate(c)


@pytest.mark.parametrize("make_config", [_binary_config, _block_config])
def test_background_reader_stops_when_the_stream_is_dropped(pre_dir, make_config):
  ds = dataset.make_dataset(make_config(pre_dir), seed=0)
  batches = ds.train_batches(64, seed=0)
  next(batches)
  assert any(t.name == "sfjax-shards-train" for t in threading.enumerate())
  batches.close()
  deadline = time.time() + 5
  while any(t.name == "sfjax-shards-train" for t in threading.enumerate()):
    assert time.time() < deadline, "the reader thread is still running"
    time.sleep(0.01)
  with pytest.raises(ValueError, match="unknown eval split 'valid'"):
    ds.eval_batches("valid", 8)


def test_out_dir_must_be_new_unless_overwritten(criteo_dir, tmp_path):
  cfg = _text_config(criteo_dir, hash_rows=50, test_path="")
  out = tmp_path / "pre"
  preprocessed.preprocess_files(cfg, str(out), rows_per_shard=1000)
  with pytest.raises(FileExistsError, match=f"{out}: output directory is not empty"):
    preprocessed.preprocess_files(cfg, str(out))
  cfg.hash_rows = 60
  meta = preprocessed.preprocess_files(cfg, str(out), rows_per_shard=1000, overwrite=True)
  assert meta["mapping"] == {"kind": "hashing", "num_rows": 60}
  assert set(os.listdir(out)) == {"spec.json", "mapping.json", "train", "eval"}
  (out / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError, match="notes.txt"):
    preprocessed.preprocess_files(cfg, str(out), overwrite=True)
  assert (out / "spec.json").exists()  # nothing was deleted


def test_config_and_directory_errors_name_the_culprit(criteo_dir, pre_dir, tmp_path):
  with pytest.raises(ConfigError, match="data.format"):
    preprocessed.preprocess_files(ctr.get_config().data, str(tmp_path / "x"))
  with pytest.raises(ConfigError, match="data.eval_path"):
    preprocessed.preprocess_files(_text_config(criteo_dir, eval_path=""), str(tmp_path / "x"))
  with pytest.raises(ValueError, match="data.train_path is empty"):
    dataset.make_dataset(_binary_config(""), seed=0)
  with pytest.raises(shards.CorruptShardError, match="spec.json: missing") as info:
    dataset.make_dataset(_binary_config(tmp_path), seed=0)
  assert info.value.path == str(tmp_path / "spec.json")
  broken = tmp_path / "broken"
  os.makedirs(broken)
  spec = json.loads((pre_dir / "spec.json").read_text())
  spec["num_dense"] = 12
  (broken / "spec.json").write_text(json.dumps(spec))
  for name in ("train", "eval", "test"):
    os.symlink(pre_dir / name, broken / name)
  with pytest.raises(shards.CorruptShardError, match="spec.json: says 26 fields / 12 dense, train/split.json 26 / 13"):
    dataset.make_dataset(_binary_config(broken), seed=0)
  spec["num_dense"] = 13
  (broken / "spec.json").write_text(json.dumps(spec))
  os.remove(broken / "eval")
  os.remove(broken / "test")
  with pytest.raises(shards.CorruptShardError, match="eval/split.json: missing"):
    dataset.make_dataset(_binary_config(broken), seed=0)
  del spec["splits"]["eval"], spec["splits"]["test"]
  (broken / "spec.json").write_text(json.dumps(spec))
  with pytest.raises(ValueError, match="eval split is required"):
    dataset.make_dataset(_binary_config(broken), seed=0)



def _parquet_table(n, seed):
  """n rows: a user, an item, a price, a history of items (a sequence sharing the item
  table, often longer than its capacity), weighted tags and unweighted genres (bags)."""
  r = np.random.default_rng(seed)
  tags = [[f"t{v}" for v in r.integers(0, 20, k)] for k in r.integers(0, 5, n)]
  return pa.table({
      "label": pa.array(r.integers(0, 2, n)), "user": pa.array([f"u{v}" for v in r.integers(0, 30, n)]),
      "item_id": pa.array(r.integers(0, 60, n)), "price": pa.array(r.random(n)),
      "history": pa.array([list(r.integers(0, 60, k)) for k in r.integers(0, 7, n)],
                          pa.list_(pa.int64())),
      "tags": pa.array(tags, pa.list_(pa.string())),
      "tw": pa.array([list(r.random(len(t))) for t in tags], pa.list_(pa.float64())),
      "genres": pa.array([list(r.integers(0, 9, k)) for k in r.integers(0, 4, n)],
                         pa.list_(pa.int64()))})


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp("parquet")
  pq.write_table(_parquet_table(700, 0), root / "train.parquet", row_group_size=128)
  pq.write_table(_parquet_table(200, 1), root / "eval.parquet", row_group_size=128)
  return root


def _parquet_config(root, **data):
  c = ctr.get_config("smoke")
  d = c.data
  d.format, d.train_path, d.eval_path = "parquet", f"{root}/train.parquet", f"{root}/eval.parquet"
  d.parquet.dense = "price"
  d.parquet.bags = "history:sequence:4,tags:multi_hot:3:sqrtn:tw,genres:multi_hot:2:mean"
  d.parquet.shared_tables = "history=item_id"
  d.shuffle_buffer = 0  # file order on both paths
  for k, v in data.items():
    d[k] = v
  c.train.steps, c.train.eval_every, c.train.num_devices = 20, 20, 1
  c.train.batch_size, c.model.name, c.model.embed_dim = 128, "fm", 8  # compiles in seconds
  return c


def _from_dir(config, out):
  c = config.copy_and_resolve_references()
  c.data.format, c.data.train_path, c.data.eval_path = "preprocessed", str(out), ""
  return c


@pytest.mark.parametrize("mapping", [{"hash_rows": 40}, {"hash_rows": 0, "min_count": 2}])
def test_parquet_bags_preprocess_to_the_same_batches(parquet_dir, tmp_path, mapping):
  c = _parquet_config(parquet_dir, **mapping)
  meta = preprocessed.preprocess_files(c.data, str(tmp_path / "pre"), rows_per_shard=300)
  assert meta["splits"]["train"]["num_shards"] == 3 and meta["splits"]["train"]["truncated_ids"] > 0
  parquet = dataset.make_dataset(c.data, seed=0)
  binary = dataset.make_dataset(_from_dir(c, tmp_path / "pre").data, seed=0)
  layout = parquet.spec.layout
  assert binary.spec == parquet.spec and binary.spec.layout == layout
  assert layout.features[2].table == "item_id" and layout.features[3].weighted
  # 700 train rows in batches of 96: the batches straddle shards, record batches and epochs.
  n = _assert_same_batches(itertools.islice(parquet.train_batches(96, seed=1), 9),
                           itertools.islice(binary.train_batches(96, seed=1), 9))
  assert n == 9
  assert _assert_same_batches(parquet.eval_batches("eval", 64), binary.eval_batches("eval", 64)) == 4
  assert (next(binary.eval_batches("eval", 64)).ids == -1).any()  # padding survives the trip
  # The ids dropped by truncation (counted by the Parquet reader's full passes) are recorded.
  assert binary.stats["preprocess_truncated_ids_by_split"] == parquet.stats["truncated_ids_by_split"]
  if "min_count" in mapping:  # the vocabulary is stored per TABLE: item_id and history share one
    settings = json.loads((tmp_path / "pre" / "mapping.json").read_text())
    assert [f["name"] for f in settings["fields"]] == ["user", "item_id", "tags", "genres"]


def test_block_shuffle_reads_bags_as_padded_batches(parquet_dir, tmp_path):
  c = _parquet_config(parquet_dir, hash_rows=40)
  preprocessed.preprocess_files(c.data, str(tmp_path / "pre"), rows_per_shard=300)
  d = _from_dir(c, tmp_path / "pre").data
  d.shuffle, d.shuffle_block_rows, d.shuffle_buffer = "block", 64, 256
  ds = dataset.make_dataset(d, seed=0)
  plain = concat_batches(list(ds.split("train").chunks(1000)))  # file order, padded
  epoch = concat_batches(list(itertools.islice(ds.train_batches(100, seed=1), 7)))  # 700 rows

  def rows(b):
    return sorted(map(tuple, np.concatenate([b.ids, b.weights, b.dense, b.labels[:, None]],
                                            1).tolist()))

  assert epoch.weights is not None and (epoch.ids == -1).any()
  assert rows(epoch) == rows(plain) and not np.array_equal(epoch.ids, plain.ids)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_training_from_preprocessed_bags_equals_training_from_parquet(parquet_dir, tmp_path):
  c = _parquet_config(parquet_dir, hash_rows=50)
  preprocessed.preprocess_files(c.data, str(tmp_path / "pre"), rows_per_shard=256)
  from_parquet, _ = loop.train_and_evaluate(c, dataset=dataset.make_dataset(c.data, c.seed))
  b = _from_dir(c, tmp_path / "pre")
  from_shards, _ = loop.train_and_evaluate(b, dataset=dataset.make_dataset(b.data, b.seed))
  assert from_shards["step"] == from_parquet["step"] == 20
  for key in ("loss", "auc", "logloss", "unique_per_batch"):
    assert from_shards[key] == from_parquet[key], key


def test_a_corrupt_bag_values_file_is_named(parquet_dir, tmp_path):
  c = _parquet_config(parquet_dir, hash_rows=50)
  preprocessed.preprocess_files(c.data, str(tmp_path / "pre"), rows_per_shard=300)
  path = tmp_path / "pre" / "eval" / "shard_00000.f2.values.npy"  # the history's ids
  data = bytearray(path.read_bytes())
  data[-3] ^= 0x10
  path.write_bytes(bytes(data))
  binary = dataset.make_dataset(_from_dir(c, tmp_path / "pre").data, seed=0)
  with pytest.raises(shards.CorruptShardError, match="CRC-32") as info:
    list(binary.eval_batches("eval", 64))
  assert info.value.path == str(path)
