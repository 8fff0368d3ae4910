"""Tests for sfjax.data.feature_map: stable hashing and streaming vocabularies."""

import os
import subprocess
import sys

import numpy as np
import pytest

from sfjax.data import feature_map

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _values(rows):
  return np.array(rows, dtype=bytes)


def test_keys_depend_only_on_field_and_bytes():
  narrow = _values([[b"68fd1e64", b""], [b"a", b"a"]])
  wide = _values([[b"68fd1e64", b""], [b"a", b"a"], [b"x" * 30, b"y"]])
  k_narrow, k_wide = feature_map.value_keys(narrow), feature_map.value_keys(wide)
  assert k_narrow.dtype == np.uint64 and k_narrow.shape == (2, 2)
  np.testing.assert_array_equal(k_narrow, k_wide[:2])  # Independent of the string width.
  assert k_wide[1, 0] != k_wide[1, 1]  # The same value in two fields: independent keys.
  assert len(np.unique(k_wide[:, 0])) == 3


def test_keys_distinguish_prefixes_and_empty():
  values = _values([[b""], [b"a"], [b"ab"], [b"abcdefgh"], [b"abcdefgh1"], [b"abcdefgh12345678"]])
  assert len(np.unique(feature_map.value_keys(values))) == 6


def test_hashing_is_stable_across_processes():
  code = ("import numpy as np; from sfjax.data import feature_map as m; "
          "v = np.array([[b'68fd1e64', b'', b'Comedy']]); "
          "print(m.HashingMapper(1000003)(v).tolist(), m.value_keys(v).tolist())")
  outs = set()
  for hash_seed in ("1", "2"):  # Python's str hash() would differ between these.
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, JAX_PLATFORMS="cpu")
    outs.add(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                            capture_output=True, text=True).stdout)
  here = feature_map.HashingMapper(1000003)(_values([[b"68fd1e64", b"", b"Comedy"]]))
  assert len(outs) == 1 and str(here.tolist()) in outs.pop()


def test_hashing_rows_in_range_and_spread():
  rng = np.random.default_rng(0)
  values = _values([[f"{x:08x}".encode()] * 2 for x in rng.integers(0, 2**32, 8000)])
  ids = feature_map.HashingMapper(16)(values)
  assert ids.dtype == np.int64 and ids.shape == (8000, 2)
  assert ids.min() >= 0 and ids.max() < 16
  counts = np.bincount(ids[:, 0], minlength=16)
  assert counts.min() > 400 and counts.max() < 600  # Expect 500 each (sd ~22).
  assert (ids[:, 0] != ids[:, 1]).mean() > 0.8  # Fields hash independently.
  spec = feature_map.HashingMapper(16).dataset_spec(("a", "b"), 3)
  assert spec.field_rows == (16, 16) and spec.num_dense == 3


def test_hashing_mapper_rejects_zero_rows():
  with pytest.raises(ValueError, match="hash rows must be >= 1"):
    feature_map.HashingMapper(0)
  with pytest.raises(ValueError, match=r"hash rows must be <= 2\*\*63"):
    feature_map.HashingMapper(2**63 + 1)


@pytest.mark.parametrize("num_rows", [1, 2**31, 2**32 + 15, 2**63 - 1, 2**63])
def test_hashed_ids_lie_in_the_rows_by_construction(num_rows):
  """Key mod rows: never negative, never num_rows, even where the uint64 keys exceed int64."""
  rng = np.random.default_rng(num_rows % 1000)
  values = _values([[f"{x:x}".encode(), b""] for x in rng.integers(0, 2**62, 4000)])
  keys = feature_map.value_keys(values)
  assert (keys >= np.uint64(2**63)).any()  # the top bit is set for about half of them
  ids = feature_map.HashingMapper(num_rows)(values)
  assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < num_rows
  np.testing.assert_array_equal(ids.astype(np.uint64), keys % np.uint64(num_rows))


def test_vocabulary_min_count_and_oov():
  chunks = [_values([[b"a", b"x"], [b"b", b"x"]]), _values([[b"a", b"y"], [b"c", b""]]),
            _values([[b"a", b""]])]
  vocab = feature_map.build_vocabulary(iter(chunks), num_fields=2, min_count=2)
  assert vocab.num_distinct == (3, 3)
  assert vocab.field_rows == (2, 3)  # {a} + OOV; {x, ''} + OOV.
  ids = vocab(_values([[b"a", b"x"], [b"b", b""], [b"new", b"y"], [b"a", b"x"]]))
  assert ids[:, 0].tolist() == [1, 0, 0, 1]
  assert ids[0, 1] != ids[1, 1] and {ids[0, 1], ids[1, 1]} == {1, 2}
  assert ids[2, 1] == 0 and ids[3, 1] == ids[0, 1]
  spec = vocab.dataset_spec(("f0", "f1"), 0)
  assert spec.field_rows == (2, 3) and spec.total_rows == 5


def test_vocabulary_streaming_merge_equals_one_pass():
  rng = np.random.default_rng(1)
  data = _values([[str(x).encode()] for x in rng.zipf(1.3, 90_000) % 100_000])
  in_chunks = feature_map.build_vocabulary((data[i:i + 7000] for i in range(0, 90_000, 7000)), 1, 3)
  at_once = feature_map.build_vocabulary([data], 1, 3)
  np.testing.assert_array_equal(in_chunks.keys[0], at_once.keys[0])
  values, counts = np.unique(data[:, 0], return_counts=True)
  assert in_chunks.field_rows == (int((counts >= 3).sum()) + 1,)
  ids = in_chunks(values[:, None])[:, 0]
  np.testing.assert_array_equal(ids > 0, counts >= 3)
  assert len(np.unique(ids[ids > 0])) == int((counts >= 3).sum())  # Distinct values, distinct rows.


def test_make_mapper_selects_and_validates():
  def chunks():
    return [_values([[b"a"], [b"b"]])]

  assert isinstance(feature_map.make_mapper(8, 1, chunks, 1), feature_map.HashingMapper)
  assert feature_map.make_mapper(0, 1, chunks, 1).field_rows == (3,)
  with pytest.raises(ValueError, match="data.hash_rows must be >= 0"):
    feature_map.make_mapper(-1, 1, chunks, 1)
  with pytest.raises(ValueError, match="data.min_count must be >= 1"):
    feature_map.make_mapper(0, 0, chunks, 1)


def test_value_keys_rejects_non_bytes():
  with pytest.raises(TypeError, match="bytes"):
    feature_map.value_keys(np.array([["a"]]))


def test_value_keys_take_recorded_salts():
  rng = np.random.default_rng(0)
  words = [b"", b"a", b"68fd1e64", b"0123456789abcdef", b"x" * 23, "é€".encode()]
  values = np.asarray(rng.choice(np.asarray(words, dtype=object), size=(50, 7)).astype(bytes))
  own = feature_map._field_salts(7)
  np.testing.assert_array_equal(feature_map.value_keys(values, own), feature_map.value_keys(values))
  other = feature_map.value_keys(values, np.roll(own, 1))  # another field's salt: other keys
  assert (other != feature_map.value_keys(values)).all()


@pytest.mark.parametrize("width", [9, 17, 25])
def test_keys_of_values_just_past_a_word_match_a_wider_array(width):
  value = b"v" * width
  alone = feature_map.value_keys(_values([[value]]))  # an array of exactly this width
  wide = feature_map.value_keys(_values([[value], [b"w" * 40]]))
  assert alone[0, 0] == wide[0, 0]
  assert alone[0, 0] != feature_map.value_keys(_values([[value[:-1]]]))[0, 0]


def test_recorded_salts_may_be_python_integers():
  values = _values([[b"a", b"bc", b""]])
  salts = [int(s) for s in feature_map.field_salts(3)]
  assert max(salts) >= 2**63  # plain ints, some past int64
  np.testing.assert_array_equal(feature_map.value_keys(values, salts),
                                feature_map.value_keys(values))


def test_mappers_describe_their_fields_by_name():
  spec = feature_map.HashingMapper(5).dataset_spec(("a", "b"), 2)
  assert [(f.name, f.num_rows) for f in spec.fields] == [("a", 5), ("b", 5)]
  vocab = feature_map.build_vocabulary([_values([[b"x", b"y"], [b"z", b"y"]])], 2)
  assert vocab.min_count == 1 and vocab.field_rows == (3, 2)  # min_count 1: seen once is kept
  spec = vocab.dataset_spec(("u", "v"), 4)
  assert [(f.name, f.num_rows) for f in spec.fields] == [("u", 3), ("v", 2)]
  assert spec.num_dense == 4 and type(spec.num_dense) is int
  with pytest.raises(ValueError, match=r"^1 field names for 2 vocabulary fields$"):
    vocab.dataset_spec(("u",), 0)
  with pytest.raises(ValueError, match=r"^vocabulary has 2 fields, values have 3$"):
    vocab(_values([[b"x", b"y", b"z"]]))


def test_vocabulary_keys_and_rows_keep_their_integer_types():
  values = _values([[b"a", b"q"], [b"b", b"q"], [b"a", b"r"]])
  vocab = feature_map.build_vocabulary([values[:1], values[1:]], 2, min_count=2)
  assert vocab.min_count == 2 and vocab.num_distinct == (2, 2)
  assert all(k.dtype == np.uint64 for k in vocab.keys)
  np.testing.assert_array_equal(vocab.keys[0], feature_map.value_keys(values)[:1, 0])
  assert vocab.keys[1].tolist() == [feature_map.value_keys(values)[0, 1]]
  ids = vocab(values)
  assert ids.dtype == np.int64 and ids.tolist() == [[1, 1], [0, 1], [1, 0]]
  empty = feature_map.build_vocabulary([values], 2, min_count=9)  # no value is kept
  rows = empty.rows_of_keys(feature_map.value_keys(values)[:, 0], 0)
  assert rows.dtype == np.int64 and rows.tolist() == [0, 0, 0]
  assert vocab.rows_of_keys(np.array([vocab.keys[0][0], 7], np.uint64), 0).dtype == np.int64


def test_vocabulary_inputs_are_checked_with_their_shapes():
  with pytest.raises(ValueError, match=r"^expected \[n, 3\] values, got shape \(2, 2\)$"):
    feature_map.build_vocabulary([_values([[b"a", b"b"], [b"c", b"d"]])], 3)
  with pytest.raises(ValueError, match=r"^expected \[n, 2\] values, got shape \(2,\)$"):
    feature_map.build_vocabulary([_values([b"a", b"b"])], 2)
  with pytest.raises(ValueError, match=r"^min_count must be >= 1, got 0$"):
    feature_map.build_vocabulary_from_keys([], 1, 0)
  with pytest.raises(ValueError, match=r"^expected 2 key arrays, got 1$"):
    feature_map.build_vocabulary_from_keys([[np.zeros(2, np.uint64)]], 2)


def test_make_mapper_hashes_into_one_row_and_builds_from_keys():
  assert feature_map.make_mapper(1, 1, lambda: [], 1) == feature_map.HashingMapper(1)
  values = _values([[b"a", b"x"], [b"a", b"y"], [b"b", b"y"]])
  keys = feature_map.value_keys(values)
  for chunks_are_keys, chunks in ((False, lambda: [values]),
                                  (True, lambda: [[keys[:, 0], keys[:, 1]]])):
    vocab = feature_map.make_mapper(0, 2, chunks, 2, chunks_are_keys=chunks_are_keys)
    assert vocab.min_count == 2 and vocab.field_rows == (2, 2)
    assert vocab(values).tolist() == [[1, 0], [1, 1], [0, 1]]
  ragged = feature_map.make_mapper(  # key chunks: fields of their own lengths, int keys too
      0, 1, lambda: [[keys[:1, 0], [int(k) for k in keys[:, 1]]]], 2, chunks_are_keys=True)
  assert ragged.num_distinct == (1, 2) and all(k.dtype == np.uint64 for k in ragged.keys)
  once = feature_map.build_vocabulary_from_keys([[keys[:, 1]]], 1)  # default: seen once is kept
  assert once.min_count == 1 and once.field_rows == (3,)
