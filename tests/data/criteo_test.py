"""Tests for sfjax.data.criteo: the Criteo TSV parser through `TextReader`."""


import numpy as np
import pytest

from sfjax.core.errors import DataFormatError
from sfjax.data import criteo, text_io


def _line(label="1", ints=None, cats=None):
  ints = [str(i) for i in range(13)] if ints is None else ints
  cats = [f"{i:08x}" for i in range(26)] if cats is None else cats
  return "\t".join([label] + list(ints) + list(cats)) + "\n"


def _read(paths, skip=False, chunk_lines=3):
  reader = text_io.TextReader(paths, criteo.CriteoFormat(), skip, chunk_lines)
  raws = list(reader)
  values = np.concatenate([r.values for r in raws])
  dense = np.concatenate([r.dense for r in raws])
  labels = np.concatenate([r.labels for r in raws])
  return values, dense, labels, reader


def test_parses_labels_dense_transform_and_hex_values(tmp_path, write_file):
  ints = ["0", "1", "-2", "", "5"] + ["9"] * 8
  cats = ["68fd1e64", ""] + ["0a"] * 24
  path = write_file(tmp_path / "day.tsv", [_line("0", ints, cats), _line("1")])
  values, dense, labels, reader = _read([path])
  np.testing.assert_array_equal(labels, [0.0, 1.0])
  assert dense.shape == (2, 13) and dense.dtype == np.float32
  np.testing.assert_allclose(dense[0, :5], [0, np.log(2), -np.log(3), 0, np.log(6)], rtol=1e-6)
  np.testing.assert_allclose(dense[1], np.log1p(np.arange(13)), rtol=1e-6)
  assert values.shape == (2, 26)
  assert values[0, 0] == b"68fd1e64" and values[0, 1] == b""  # Empty stays the empty value.
  assert values[1, 25] == b"00000019"
  assert reader.bad_lines == 0


def test_all_empty_features_and_windows_line_ends(tmp_path, write_file):
  line = _line("1", [""] * 13, [""] * 26).replace("\n", "\r\n")
  values, dense, labels, _ = _read([write_file(tmp_path / "x.tsv", [line])])
  assert labels.tolist() == [1.0]
  assert not dense.any()
  assert (values == b"").all()


def test_gzip_and_glob_over_several_files(tmp_path, write_file):
  write_file(tmp_path / "part-1.tsv.gz", [_line("1", cats=["bb"] * 26)], gz=True)
  write_file(tmp_path / "part-0.tsv", [_line("0", cats=["aa"] * 26)] * 4)
  values, _, labels, _ = _read([*text_io.expand_paths(f"{tmp_path}/part-*")])
  np.testing.assert_array_equal(labels, [0, 0, 0, 0, 1])  # part-0 first: globs are sorted.
  assert values[:, 0].tolist() == [b"aa"] * 4 + [b"bb"]


@pytest.mark.parametrize("bad_line, reason", [
    (_line("1").replace("\t", "", 1), "expected 40 tab-separated fields, got 39"),
    (_line("1").rstrip("\n") + "\textra\n", "expected 40 tab-separated fields, got 41"),
    (_line("2"), "label must be 0 or 1, got '2'"),
    (_line("yes"), "label must be 0 or 1, got 'yes'"),
    (_line("", ), "label must be 0 or 1, got ''"),
    (_line("0", ["7"] * 12 + ["abc"]), "I13 is not a 64-bit integer: 'abc'"),
    (_line("0", ["1.5"] + ["7"] * 12), "I1 is not a 64-bit integer: '1.5'"),
    # Dense columns are integer counts: NaN/inf text is a parse error, never a NaN feature.
    (_line("0", ["nan"] + ["7"] * 12), "I1 is not a 64-bit integer: 'nan'"),
    (_line("0", ["7"] + ["inf"] + ["7"] * 11), "I2 is not a 64-bit integer: 'inf'"),
    (_line("0", ["-Infinity"] + ["7"] * 12), "I1 is not a 64-bit integer: '-Infinity'"),
    (_line("0", ["9223372036854775808"] + ["7"] * 12),
     "I1 is not a 64-bit integer: '9223372036854775808'"),
    (_line("0").replace("\t0000000a", "\t00\x0000a"), "line contains a NUL byte (binary data in a "
     "text file)"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad_line, reason, write_file):
  good = write_file(tmp_path / "a.tsv", [_line()] * 5)
  # The bad line is line 5 of the second file, in the second chunk of 3.
  bad = write_file(tmp_path / "b.tsv", [_line()] * 4 + [bad_line, _line()])
  with pytest.raises(DataFormatError) as e:
    _read([good, bad])
  assert (e.value.path, e.value.line, e.value.reason) == (bad, 5, reason)
  assert str(e.value).startswith(f"{bad}:5: ")


def test_first_bad_line_of_a_chunk_is_reported(tmp_path, write_file):
  # Line 2 has an int error, line 3 a field-count error: line 2 is reported.
  lines = [_line(), _line("0", ["x"] * 13), _line().replace("\t", ",")]
  path = write_file(tmp_path / "x.tsv", lines)
  with pytest.raises(DataFormatError, match=r"x.tsv:2: I1 is not"):
    _read([path], chunk_lines=10)


def test_skip_bad_lines_drops_and_counts_each_kind(tmp_path, write_file):
  lines = [_line("1"), _line("3"), _line("0", ["q"] * 13), "short\tline\n",
           _line("0", cats=["ok"] * 26), "\n"]
  path = write_file(tmp_path / "x.tsv", lines)
  values, dense, labels, reader = _read([path], skip=True, chunk_lines=2)
  np.testing.assert_array_equal(labels, [1, 0])
  assert values[1, 0] == b"ok" and dense.shape == (2, 13)
  assert reader.bad_lines == 4


def test_extreme_dense_values_stay_finite(tmp_path, write_file):
  big = ["9223372036854775807", "-9223372036854775808"] + ["0"] * 11
  _, dense, _, _ = _read([write_file(tmp_path / "x.tsv", [_line("1", big)])])
  assert np.isfinite(dense).all()
  np.testing.assert_allclose(dense[0, :2], [np.log1p(2.0**63), -np.log1p(2.0**63)], rtol=1e-6)
