"""Tests for sfjax.data.shards: .npy shards rolled by count, read back in order or shuffled."""

import json
import os
import re

import numpy as np
import pytest

from sfjax.core import feature_layout as fl
from sfjax.data import shards
from sfjax.data.types import DatasetSpec, FieldSpec, concat_batches, make_batch, map_arrays

SPEC = DatasetSpec((FieldSpec("a", 10), FieldSpec("b", 1000)), num_dense=2)


def _examples(n, start=0, spec=SPEC):
  """n distinct examples: label i % 2, dense (i, -i), ids (i % rows_f)."""
  i = np.arange(start, start + n)
  ids = np.stack([i % r for r in spec.field_rows], axis=1)
  dense = np.stack([i, -i], axis=1)[:, :spec.num_dense]
  return make_batch(ids, dense.reshape(n, spec.num_dense), i % 2)


def _chunks(sizes, spec=SPEC):
  out, start = [], 0
  for n in sizes:
    out.append(_examples(n, start, spec))
    start += n
  return out


def _read_all(split, chunk_size=4, rng=None):
  return concat_batches(list(split.chunks(chunk_size, rng)))


def test_round_trip_rolls_shards_and_keeps_file_order(tmp_path):
  chunks = _chunks([3, 0, 9, 1, 5])  # 18 examples
  padded = chunks[2]._replace(mask=np.array([1] * 8 + [0], np.float32))  # padding is dropped
  chunks[2] = padded
  info = shards.write_split(chunks, str(tmp_path / "s"), SPEC, rows_per_shard=7)
  assert [s.num_examples for s in info.shards] == [7, 7, 3] and info.num_examples == 17
  assert info.ids_dtype == "int32"
  names = sorted(os.listdir(tmp_path / "s"))
  assert names == sorted(["split.json"] + [shards._shard_file(k, a) for k in range(3)
                                           for a in shards._ARRAYS])
  # Plain numpy reads a shard; no sfjax needed.
  ids0 = np.load(tmp_path / "s" / "shard_00000.ids.npy", mmap_mode="r")
  assert ids0.dtype == np.int32 and ids0.shape == (7, 2)
  on_disk = json.loads((tmp_path / "s" / "split.json").read_text())
  assert on_disk["num_examples"] == 17 and len(on_disk["shards"][0]["files"]["ids"]["crc32"]) == 8

  split = shards.ShardSplit(str(tmp_path / "s"))
  expected = concat_batches([c if c.mask.all() else map_arrays(lambda a: a[:8], c) for c in chunks])
  got = _read_all(split, chunk_size=4)
  for a, b in zip(got, expected, strict=True):
    np.testing.assert_array_equal(a, b)
  assert got.ids.dtype == np.int64 and got.dense.dtype == np.float32
  # Chunks never straddle shards: 7 = 4 + 3, 7 = 4 + 3, 3.
  assert [c.size for c in split.chunks(4)] == [4, 3, 4, 3, 3]


def test_shuffle_is_a_seeded_permutation_of_blocks(tmp_path):
  shards.write_split(_chunks([50, 50]), str(tmp_path / "s"), SPEC, rows_per_shard=30)
  split = shards.ShardSplit(str(tmp_path / "s"))
  plain = _read_all(split, 4)
  first = _read_all(split, 4, np.random.default_rng(1))
  again = _read_all(split, 4, np.random.default_rng(1))
  other = _read_all(split, 4, np.random.default_rng(2))
  order = first.dense[:, 0].astype(int)  # dense[:, 0] is the example's position
  assert sorted(order) == list(range(100)) and not np.array_equal(order, np.arange(100))
  np.testing.assert_array_equal(first.ids, again.ids)
  assert not np.array_equal(first.dense, other.dense)
  np.testing.assert_array_equal(first.ids, plain.ids[order])
  # Blocks keep their examples together: each chunk is a contiguous run within one shard.
  for chunk in split.chunks(4, np.random.default_rng(3)):
    pos = chunk.dense[:, 0].astype(int)
    assert (np.diff(pos) == 1).all() and pos[0] // 30 == pos[-1] // 30
  # The generator advances: a second pass in the same stream differs.
  rng = np.random.default_rng(1)
  assert not np.array_equal(_read_all(split, 4, rng).dense, _read_all(split, 4, rng).dense)


def test_ids_fall_back_to_int64_beyond_int32(tmp_path):
  spec = DatasetSpec((FieldSpec("big", 2**31 + 10), FieldSpec("small", 3)), num_dense=0)
  ids = np.array([[2**31 + 9, 2], [0, 0], [2**31, 1]], np.int64)
  batch = make_batch(ids, np.zeros((3, 0)), [1, 0, 1])
  info = shards.write_split([batch], str(tmp_path / "s"), spec, rows_per_shard=2)
  assert info.ids_dtype == "int64" and shards._ids_dtype_for(spec) == np.int64
  got = _read_all(shards.ShardSplit(str(tmp_path / "s")))
  np.testing.assert_array_equal(got.ids, ids)
  assert got.dense.shape == (3, 0)  # no dense features (Avazu) round-trips too
  assert shards._ids_dtype_for(DatasetSpec((FieldSpec("x", 2**31),), 0)) == np.int32


@pytest.fixture
def split_dir(tmp_path):
  shards.write_split(_chunks([20]), str(tmp_path / "s"), SPEC, rows_per_shard=8)
  return tmp_path / "s"


def test_a_truncated_shard_fails_at_open_naming_the_file(split_dir):
  path = split_dir / "shard_00001.dense.npy"
  data = path.read_bytes()
  path.write_bytes(data[:-8])
  with pytest.raises(shards.CorruptShardError, match="truncated") as info:
    shards.ShardSplit(str(split_dir))
  assert info.value.path == str(path) and str(path) in str(info.value)


def test_a_corrupt_shard_fails_its_checksum_naming_the_file(split_dir):
  path = split_dir / "shard_00002.ids.npy"
  data = bytearray(path.read_bytes())
  data[-4] ^= 0x01  # the last id 19 -> 18: same size, header and valid values; only the CRC can tell
  path.write_bytes(bytes(data))
  split = shards.ShardSplit(str(split_dir))  # sizes and headers are fine
  with pytest.raises(shards.CorruptShardError, match="CRC-32") as info:
    list(split.chunks(4))
  assert info.value.path == str(path)
  with pytest.raises(shards.CorruptShardError, match="shard_00002.ids.npy"):
    split.verify()
  unchecked = shards.ShardSplit(str(split_dir), verify_checksums=False)
  assert _read_all(unchecked).size == 20


def test_checksums_are_checked_once_per_shard(split_dir, monkeypatch):
  split = shards.ShardSplit(str(split_dir))
  calls = []
  real = shards.digest.file_digest
  monkeypatch.setattr(shards.digest, "file_digest", lambda p: calls.append(p) or real(p))
  for _ in range(3):
    _read_all(split)
  assert len(calls) == 3 * len(shards._ARRAYS)  # 3 shards x 3 files, the first pass only


def test_a_wrong_header_or_missing_index_names_the_file(split_dir):
  path = split_dir / "shard_00000.labels.npy"
  size = path.stat().st_size
  np.save(path, np.zeros((16,), np.float16))  # another array of exactly the same size
  assert path.stat().st_size == size
  with pytest.raises(shards.CorruptShardError, match=r"float16\[16\], expected float32\[8\]"):
    shards.ShardSplit(str(split_dir), verify_checksums=False)
  os.remove(path)
  with pytest.raises(shards.CorruptShardError, match="missing") as info:
    shards.ShardSplit(str(split_dir))
  assert info.value.path == str(path)
  (split_dir / "split.json").write_text("{not json")
  with pytest.raises(shards.CorruptShardError, match="malformed") as info:
    shards.ShardSplit(str(split_dir))
  assert info.value.path == str(split_dir / "split.json")
  os.remove(split_dir / "split.json")
  with pytest.raises(shards.CorruptShardError, match="did not finish"):
    shards.ShardSplit(str(split_dir))


def test_write_split_rejects_bad_input(tmp_path):
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("")
  with pytest.raises(FileExistsError, match="full: split directory is not empty"):
    shards.write_split(_chunks([3]), str(tmp_path / "full"), SPEC, 4)
  with pytest.raises(ValueError, match="rows_per_shard"):
    shards.write_split(_chunks([3]), str(tmp_path / "a"), SPEC, 0)
  bad = _examples(3)
  bad.ids[1, 1] = 1000  # field 'b' has 1000 rows
  with pytest.raises(ValueError, match="field 'b'"):
    shards.write_split([bad], str(tmp_path / "b"), SPEC, 4)
  wide = make_batch(np.zeros((2, 3)), np.zeros((2, 2)), [0, 1])
  with pytest.raises(ValueError, match="do not match the spec"):
    shards.write_split([wide], str(tmp_path / "c"), SPEC, 4)
  shards.write_split(_chunks([3]), str(tmp_path / "d"), SPEC, 4)
  with pytest.raises(ValueError, match="chunk_size"):
    next(shards.ShardSplit(str(tmp_path / "d")).chunks(0))


def _rewrite_with_valid_crc(split_dir, index, array, mutate):
  """Applies `mutate(values)` to shard `index`'s `array` and records the new size and CRC-32."""
  path = split_dir / shards._shard_file(index, array)
  values = np.array(np.load(path))
  mutate(values)
  os.remove(path)
  written = shards.save_npy(str(path), values)
  index_path = split_dir / shards.SPLIT_FILE
  info = json.loads(index_path.read_text())
  info["shards"][index]["files"][array] = written
  index_path.write_text(json.dumps(info))
  return str(path)


@pytest.mark.parametrize("array,row,value,field,message", [
    ("ids", (5, 1), -7, "b", "id -7 outside the field's rows [0, 1000)"),
    ("ids", (0, 0), 10, "a", "id 10 outside the field's rows [0, 10)"),
    ("ids", (7, 1), 2**31 - 1, "b", "id 2147483647 outside the field's rows [0, 1000)"),
    ("labels", (3,), 7.0, "label", "label 7.0 is not 0 or 1"),
    ("dense", (6, 1), np.nan, "dense[1]", "dense value nan is not finite"),
    ("dense", (2, 0), -np.inf, "dense[0]", "dense value -inf is not finite"),
])
def test_a_wrong_value_under_a_valid_crc_names_file_row_and_field(split_dir, array, row, value,
                                                                   field, message):
  def mutate(values):
    values[row] = value

  path = _rewrite_with_valid_crc(split_dir, 1, array, mutate)
  split = shards.ShardSplit(str(split_dir))
  split.shard(0)  # the other shards are fine
  with pytest.raises(shards.ShardValueError) as info:
    list(split.chunks(4))
  err = info.value
  assert (err.path, err.row, err.field) == (path, row[0], field)
  assert str(err) == f"{path}: row {row[0]}, field {field!r}: {message} (preprocess again)"
  assert isinstance(err, shards.CorruptShardError)
  with pytest.raises(shards.ShardValueError, match=re.escape(f"row {row[0]}, field {field!r}")):
    shards.ShardSplit(str(split_dir), verify_checksums=False).verify()


def test_values_are_checked_once_per_shard(split_dir, monkeypatch):
  split = shards.ShardSplit(str(split_dir), verify_checksums=False)
  calls = []
  real = shards.validate.first_bad_id
  monkeypatch.setattr(shards.validate, "first_bad_id", lambda *a: calls.append(1) or real(*a))
  for _ in range(3):
    _read_all(split)
  assert len(calls) == 3  # one block per shard, the first pass only


def test_split_index_records_fields_and_refuses_the_old_format(split_dir):
  info = json.loads((split_dir / shards.SPLIT_FILE).read_text())
  assert info["fields"] == [{"name": "a", "num_rows": 10}, {"name": "b", "num_rows": 1000}]
  assert info["version"] == 2 and info["dataset"] == {}
  assert shards.read_split_info(str(split_dir)).fields == SPEC.fields
  info["version"] = 1
  (split_dir / shards.SPLIT_FILE).write_text(json.dumps(info))
  with pytest.raises(shards.CorruptShardError, match="older sfjax.*preprocess the data again"):
    shards.ShardSplit(str(split_dir))
  info["version"], info["num_fields"] = 2, 3
  (split_dir / shards.SPLIT_FILE).write_text(json.dumps(info))
  with pytest.raises(shards.CorruptShardError, match="num_fields 3 but 2 fields"):
    shards.ShardSplit(str(split_dir))


def test_write_split_rejects_bad_labels_and_dense(tmp_path):
  bad = _examples(3)
  bad.labels[2] = 7
  with pytest.raises(ValueError, match="label 7.0 of chunk row 2 is not 0 or 1"):
    shards.write_split([bad], str(tmp_path / "l"), SPEC, 4)
  bad = _examples(3)
  bad.dense[1, 1] = np.inf
  with pytest.raises(ValueError, match=r"dense\[1\] of chunk row 1 is inf"):
    shards.write_split([bad], str(tmp_path / "d"), SPEC, 4)
  bad = _examples(3)
  bad.ids[0, 0] = -1
  with pytest.raises(ValueError, match=r"field 'a' outside \[0, 10\): -1 \(chunk row 0\)"):
    shards.write_split([bad], str(tmp_path / "i"), SPEC, 4)


# A feature layout (issue #22): a one-hot user, a sequence of items and a weighted bag of tags.
LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 7), fl.TableSpec("item", 50), fl.TableSpec("tags", 6)),
    (fl.FeatureSpec("user", "user"), fl.FeatureSpec("history", "item", "sequence", 3, "mean"),
     fl.FeatureSpec("tags", "tags", "multi_hot", 2, "sqrtn", weighted=True)))
BAG_SPEC = DatasetSpec((FieldSpec("user", 7), FieldSpec("history", 50), FieldSpec("tags", 6)),
                       num_dense=1, layout=LAYOUT)


def _bag_examples(n, start=0):
  """n examples: history of i % 4 items (i, i+1, ...), i % 3 tags weighing i / 10."""
  i = np.arange(start, start + n)
  ids = np.full((n, 6), -1, np.int64)
  weights = np.zeros((n, 6), np.float32)
  ids[:, 0], weights[:, 0] = i % 7, 1
  for k in range(3):
    used = i % 4 > k
    ids[used, 1 + k], weights[used, 1 + k] = (i[used] + k) % 50, 1
  for k in range(2):
    used = i % 3 > k
    ids[used, 4 + k], weights[used, 4 + k] = (i[used] + k) % 6, i[used] / 10
  return make_batch(ids, i[:, None], i % 2, weights=weights)


@pytest.fixture
def bag_split(tmp_path):
  chunks = [_bag_examples(9), _bag_examples(0, 9), _bag_examples(11, 9)]
  chunks[2] = chunks[2]._replace(mask=np.array([1] * 10 + [0], np.float32))  # dropped
  shards.write_split(chunks, str(tmp_path / "s"), BAG_SPEC, rows_per_shard=8)
  return tmp_path / "s"


def test_a_layout_split_stores_bags_as_values_and_offsets_and_reads_them_back(bag_split):
  info = json.loads((bag_split / shards.SPLIT_FILE).read_text())
  assert info["version"] == 3 and fl.layout_from_json(info["layout"]) == LAYOUT
  assert list(info["shards"][0]["files"]) == ["ids", "dense", "labels", "f1.values", "f1.offsets",
                                              "f2.values", "f2.offsets", "f2.weights"]
  assert len(os.listdir(bag_split)) == 1 + 3 * 8  # 19 examples in shards of 8, 8, 3
  # Plain numpy reads the ragged form: shard 0 holds examples 0..7.
  offsets = np.load(bag_split / "shard_00000.f1.offsets.npy")
  np.testing.assert_array_equal(offsets, np.cumsum([0] + [i % 4 for i in range(8)]))
  assert np.load(bag_split / "shard_00000.ids.npy").shape == (8, 1)
  np.testing.assert_array_equal(np.load(bag_split / "shard_00001.f2.weights.npy")[:2],
                                np.float32([0.8, 0.8]))  # example 8: two tags weighing 0.8
  split = shards.ShardSplit(str(bag_split))
  assert split.info.layout == LAYOUT
  want = _bag_examples(19)
  for chunk_size in (3, 8):  # chunks inside a shard, and whole shards
    got = _read_all(split, chunk_size)
    for a, b in zip(got, want, strict=True):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(a, b)
  shuffled = _read_all(split, 3, np.random.default_rng(0))
  order = shuffled.dense[:, 0].astype(int)
  assert sorted(order) == list(range(19)) and not np.array_equal(order, np.arange(19))
  np.testing.assert_array_equal(shuffled.ids, want.ids[order])
  np.testing.assert_array_equal(shuffled.weights, want.weights[order])


def test_a_corrupt_bag_file_is_named(bag_split):
  path = bag_split / "shard_00001.f1.values.npy"
  data = bytearray(path.read_bytes())
  data[-4] ^= 0x01  # a valid id under a wrong CRC
  path.write_bytes(bytes(data))
  with pytest.raises(shards.CorruptShardError, match="CRC-32") as info:
    list(shards.ShardSplit(str(bag_split)).chunks(4))
  assert info.value.path == str(path)
  weights = bag_split / "shard_00002.f2.weights.npy"
  weights.write_bytes(weights.read_bytes()[:-4])
  with pytest.raises(shards.CorruptShardError, match="truncated") as info:
    shards.ShardSplit(str(bag_split))
  assert info.value.path == str(weights)


@pytest.mark.parametrize("array,index,value,row,field,message", [
    ("f1.values", 0, 50, 1, "history", "id 50 outside the table's rows [0, 50)"),
    ("f1.offsets", 3, 9, 2, "history", "8 ids, not in [0, capacity 3]"),
    ("f2.weights", 1, np.inf, 2, "tags", "weight inf is not finite"),
])
def test_a_wrong_bag_value_under_a_valid_crc_names_file_row_and_feature(bag_split, array, index,
                                                                       value, row, field, message):
  def mutate(values):
    values[index] = value

  path = _rewrite_with_valid_crc(bag_split, 0, array, mutate)
  with pytest.raises(shards.ShardValueError) as info:
    shards.ShardSplit(str(bag_split), verify_checksums=False).verify()
  assert (info.value.path, info.value.row, info.value.field) == (path, row, field)
  assert message in str(info.value)


def test_a_layout_split_refuses_chunks_it_could_not_rebuild(tmp_path):
  bad = _bag_examples(4)
  with pytest.raises(ValueError, match="yields weights"):
    shards.write_split([bad._replace(weights=None)], str(tmp_path / "a"), BAG_SPEC, 4)
  bad.ids[3, 2] = -1  # example 3's history (3 ids) gets a hole
  with pytest.raises(ValueError, match=r"feature 'history' \(chunk row 3\)"):
    shards.write_split([bad], str(tmp_path / "b"), BAG_SPEC, 4)
  bad = _bag_examples(4)
  bad.ids[2, 0] = 7
  with pytest.raises(ValueError, match=r"field 'user' outside \[0, 7\): 7 \(chunk row 2\)"):
    shards.write_split([bad], str(tmp_path / "c"), BAG_SPEC, 4)
  with pytest.raises(ValueError, match=r"do not match the spec \(6 id columns, 1 dense\)"):
    shards.write_split([_examples(3)], str(tmp_path / "d"), BAG_SPEC, 4)


def test_a_bag_file_with_a_wrong_header_is_named(bag_split):
  offsets = bag_split / "shard_00000.f1.offsets.npy"
  original = offsets.read_bytes()
  np.save(offsets, np.zeros((18,), np.int32))  # the same size as int64[9]
  with pytest.raises(shards.CorruptShardError, match=r"int32\[18\], expected int64\[9\]") as info:
    shards.ShardSplit(str(bag_split), verify_checksums=False)
  assert info.value.path == str(offsets)
  offsets.write_bytes(original)
  values = bag_split / "shard_00001.f2.values.npy"
  np.save(values, np.load(values).view(np.int64))  # 8 tags of examples 8..15 as 4 int64
  with pytest.raises(shards.CorruptShardError, match=r"int64\[4\], expected int32\[T\]") as info:
    shards.ShardSplit(str(bag_split), verify_checksums=False)
  assert info.value.path == str(values)
