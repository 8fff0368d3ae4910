"""Tests for sfjax.data.text_io: globs, gzip, line numbering, bad-line policy."""


import numpy as np
import pytest

from sfjax.data import text_io
from sfjax.core.errors import DataFormatError


class _TwoColumns:
  """A tiny format: `label,value`, no header."""

  field_names = ("v",)
  num_dense = 0

  def start_file(self, f, path):
    del f, path

    def parse(chunk, skip):
      problems = {}
      fields, rows = text_io.split_fields(chunk, b",", 2, problems)
      labels = text_io.parse_labels(fields[:, 0], rows, "label", problems)
      keep, bad = text_io.keep_good_rows(problems, chunk, rows, skip)
      raw = text_io.RawChunk(fields[keep][:, 1:], np.zeros((int(keep.sum()), 0), np.float32),
                             labels[keep])
      return raw, bad

    return parse, 1


def test_expand_paths_sorts_each_glob_and_keeps_glob_order(tmp_path, write_file):
  for name in ("b2.txt", "b1.txt", "a.txt"):
    write_file(tmp_path / name, "x\n")
  spec = f"{tmp_path}/b*.txt, {tmp_path}/a.txt"
  assert text_io.expand_paths(spec) == (
      str(tmp_path / "b1.txt"), str(tmp_path / "b2.txt"), str(tmp_path / "a.txt"))


def test_expand_paths_errors_name_the_key_and_pattern(tmp_path):
  with pytest.raises(ValueError, match="data.eval_path is empty"):
    text_io.expand_paths(" , ", "data.eval_path")
  with pytest.raises(ValueError, match=r"data.train_path: .*nothing\*\.tsv.* matches no file"):
    text_io.expand_paths(f"{tmp_path}/nothing*.tsv", "data.train_path")


def test_gzip_is_read_transparently(tmp_path, write_file):
  text = "1,a\n0,b\n"
  plain = write_file(tmp_path / "x.csv", text)
  packed = write_file(tmp_path / "x.csv.gz", text, gz=True)
  with text_io.open_binary(plain) as f1, text_io.open_binary(packed) as f2:
    assert f1.read() == f2.read() == text.encode()


def test_line_chunks_number_lines_from_one_per_file(tmp_path, write_file):
  path = write_file(tmp_path / "x.csv", "".join(f"0,{i}\n" for i in range(5)))
  with text_io.open_binary(path) as f:
    chunks = list(text_io.iter_line_chunks(f, path, chunk_lines=2))
  assert [c.first_line for c in chunks] == [1, 3, 5]
  assert [len(c.lines) for c in chunks] == [2, 2, 1]
  assert chunks[2].lines == [b"0,4\n"]


def test_parse_int_columns_missing_is_zero_and_bad_names_column():
  cols = np.array([[b"3", b""], [b"-2", b"x1"], [b"1.5", b"7"]])
  problems = {}
  out = text_io.parse_int_columns(cols, np.array([10, 11, 12]), ("I1", "I2"), problems)
  np.testing.assert_array_equal(out[0], [3, 0])
  assert out[1, 0] == -2
  assert set(problems) == {11, 12}
  assert "I2" in problems[11] and "'x1'" in problems[11]
  assert "I1" in problems[12] and "'1.5'" in problems[12]


def test_signed_log1p():
  out = text_io.signed_log1p(np.array([0, 1, -1, 3]))
  np.testing.assert_allclose(out, [0.0, np.log(2), -np.log(2), np.log(4)], rtol=1e-6)
  assert out.dtype == np.float32


def test_reader_raises_at_first_bad_line_with_file_and_line(tmp_path, write_file):
  path = write_file(tmp_path / "x.csv", "1,a\n0,b\n0,c\n2,d\n0\n")
  reader = text_io.TextReader([path], _TwoColumns(), chunk_lines=2)
  with pytest.raises(DataFormatError, match=rf"{path}:4: label must be 0 or 1, got '2'") as e:
    list(reader)
  assert (e.value.path, e.value.line) == (path, 4)


def test_reader_skips_and_counts_bad_lines_once_per_file(tmp_path, write_file):
  p1 = write_file(tmp_path / "a.csv", "1,a\nbad\n0,b\n")
  p2 = write_file(tmp_path / "b.csv.gz", "x,c\n1,d\n1,e,f\n", gz=True)
  reader = text_io.TextReader([p1, p2], _TwoColumns(), skip_bad_lines=True, chunk_lines=2)
  for _ in range(3):  # Three epochs must not triple the count.
    values = np.concatenate([raw.values[:, 0] for raw in reader])
  assert values.tolist() == [b"a", b"b", b"d"]
  assert reader.bad_lines_by_file == {p1: 1, p2: 2}
  assert reader.bad_lines == 3
