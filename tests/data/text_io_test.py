"""Tests for sfjax.data.text_io: globs, gzip, line numbering, bad-line policy, broken files."""

import gzip

import numpy as np
import pytest

from sfjax.core.errors import DataFormatError
from sfjax.data import text_io


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
  with text_io._open_binary(plain) as f1, text_io._open_binary(packed) as f2:
    assert f1.read() == f2.read() == text.encode()


def test_line_chunks_number_lines_from_one_per_file(tmp_path, write_file):
  path = write_file(tmp_path / "x.csv", "".join(f"0,{i}\n" for i in range(5)))
  with text_io._open_binary(path) as f:
    chunks = list(text_io._iter_line_chunks(f, path, chunk_lines=2))
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


def _gz_bytes(text):
  return gzip.compress(text.encode(), mtime=0)


def test_truncated_gzip_names_the_file_and_the_last_line_read(tmp_path):
  packed = _gz_bytes("".join(f"1,v{i}\n" for i in range(5000)))
  path = tmp_path / "x.csv.gz"
  path.write_bytes(packed[:len(packed) // 2])  # An interrupted download.
  for skip in (False, True):  # A broken file is never a skippable bad line.
    reader = text_io.TextReader([str(path)], _TwoColumns(), skip, chunk_lines=1000)
    seen = []
    with pytest.raises(DataFormatError) as e:
      for raw in reader:
        seen.extend(raw.values[:, 0])
    last = len(seen)  # Every line read before the damage was delivered, in order.
    assert seen == [f"v{i}".encode() for i in range(last)] and 0 < last < 5000
    assert (e.value.path, e.value.line) == (str(path), last + 1)
    assert e.value.reason.startswith(f"cannot read the file past line {last}: the gzip data is "
                                     "truncated or corrupt (EOFError: ")
    assert isinstance(e.value.__cause__, EOFError)


@pytest.mark.parametrize("damage, error", [
    (lambda b: b"not gzip at all\n", "BadGzipFile: Not a gzipped file"),
    (lambda b: b[:-8] + bytes(8), "BadGzipFile: CRC check failed"),
    (lambda b: b[:12] + b"\xff" * 8 + b[20:], "error: Error -3"),  # Invalid deflate data.
    (lambda b: b[:5], "EOFError: Compressed file ended"),
])
def test_damaged_gzip_is_a_data_format_error(tmp_path, damage, error):
  path = tmp_path / "x.csv.gz"
  path.write_bytes(damage(_gz_bytes("1,a\n0,b\n")))
  with pytest.raises(DataFormatError, match=rf"^{path}:\d+: cannot read the file .*\({error}"):
    list(text_io.TextReader([str(path)], _TwoColumns(), skip_bad_lines=True))


def test_an_over_long_line_is_an_error_even_when_skipping(tmp_path, write_file):
  path = write_file(tmp_path / "x.csv", "1,a\nbad\n0," + "z" * 100 + "\n1,b\n")
  reader = text_io.TextReader([path], _TwoColumns(), skip_bad_lines=True, max_line_bytes=50)
  with pytest.raises(DataFormatError, match=rf"^{path}:3: line is longer than 50 bytes"):
    list(reader)
  assert reader.bad_lines == 1  # Line 2, read (and skipped) before line 3.
  strict = text_io.TextReader([path], _TwoColumns(), max_line_bytes=50)
  with pytest.raises(DataFormatError, match=rf"^{path}:2: expected 2"):  # The first bad line.
    list(strict)


def test_a_file_without_line_breaks_is_read_with_bounded_memory(tmp_path):
  path = tmp_path / "blob.csv"
  path.write_bytes(b"\xff" * (3 << 20))  # 3 MiB, no b'\n': stopped after the first MiB.
  with pytest.raises(DataFormatError, match=rf"^{path}:1: line is longer than {1 << 20} bytes"):
    list(text_io.TextReader([str(path)], _TwoColumns()))


def test_a_line_with_a_nul_byte_is_a_bad_line(tmp_path):
  path = tmp_path / "x.csv"
  path.write_bytes(b"1,a\n0,\0\0\0\n1,b\0c\n0,d\n")  # A crash can leave NUL-filled blocks.
  with pytest.raises(DataFormatError, match=rf"^{path}:2: line contains a NUL byte"):
    list(text_io.TextReader([str(path)], _TwoColumns()))
  reader = text_io.TextReader([str(path)], _TwoColumns(), skip_bad_lines=True)
  assert [v for raw in reader for v in raw.values[:, 0]] == [b"a", b"d"]
  assert reader.bad_lines == 2


@pytest.mark.parametrize("name, content", [("e.csv", b""), ("e.csv.gz", _gz_bytes(""))])
def test_an_empty_file_has_no_lines(tmp_path, name, content):
  path = tmp_path / name
  path.write_bytes(content)
  reader = text_io.TextReader([str(path)], _TwoColumns())
  assert list(reader) == [] and reader.bad_lines == 0 and not reader.has_data_lines()


def test_has_data_lines_reads_one_line_of_some_file(tmp_path, write_file):
  empty = write_file(tmp_path / "a.csv", "")
  full = write_file(tmp_path / "b.csv", "not even a good line\n")
  assert text_io.TextReader([empty, full], _TwoColumns()).has_data_lines()
  assert not text_io.TextReader([empty], _TwoColumns()).has_data_lines()


@pytest.mark.parametrize("text", [b"", b"1,a\n", b"1,a", b"1,a\n0,b\n1,c", b"1,a\n0,b\n1,c\n",
                                  b"1,a\n0,b\n1,c\n0,d\n1,e\n0,f"])
@pytest.mark.parametrize("chunk_lines", [1, 2, 5])
def test_chunk_offsets_are_where_every_lth_line_starts(tmp_path, text, chunk_lines):
  path = tmp_path / "x.csv"
  path.write_bytes(b"h\n" + text)
  with open(path, "rb") as f:
    f.readline()  # a header: the index starts at the first data line
    offsets = text_io.chunk_offsets(f, chunk_lines, block_bytes=3)  # lines cross blocks
  lines = text.splitlines(True)
  starts = np.cumsum([2] + [len(line) for line in lines])[:-1]
  np.testing.assert_array_equal(offsets, list(starts[::chunk_lines]) + [2 + len(text)])


def _chunks_of_a_pass(paths, chunk_lines):
  reader = text_io.TextReader(paths, _TwoColumns(), skip_bad_lines=True, chunk_lines=chunk_lines)
  return list(reader), reader


@pytest.mark.parametrize("chunk_lines", [1, 3, 100])
def test_read_chunk_is_the_chunk_a_pass_parses(tmp_path, write_file, chunk_lines):
  text = "".join(f"{i % 2},{i}\n" for i in range(10)) + "x,bad\n1,last"
  paths = [write_file(tmp_path / "a.csv", text), write_file(tmp_path / "b.csv.gz", text, gz=True),
           write_file(tmp_path / "e.csv", "")]
  chunks, full = _chunks_of_a_pass(paths, chunk_lines)
  reader = text_io.TextReader(paths, _TwoColumns(), skip_bad_lines=True, chunk_lines=chunk_lines)
  read = []
  for path in paths:
    k = 0
    while (got := reader.read_chunk(path, k)) is not None:
      read.append(got[0])
      k += 1
    assert k == (reader.num_chunks(path) if not path.endswith(".gz") else k)
  read = [raw for raw in read if raw.labels.size]  # a pass yields no empty chunk
  assert len(read) == len(chunks)
  for a, b in zip(read, chunks, strict=True):
    for x, y in zip(a, b, strict=True):
      np.testing.assert_array_equal(x, y)
  assert reader.lines_parsed == full.lines_parsed == 24  # 12 lines in each of two files
  assert reader.num_chunks(paths[0]) == -(-12 // chunk_lines) and reader.num_chunks(paths[1]) is None
  assert reader.num_chunks(paths[2]) == 0


def test_gzip_chunks_read_out_of_order_and_bad_lines_name_their_line(tmp_path, write_file):
  text = "".join(f"1,{i}\n" for i in range(9)) + "2,bad\n"
  path = write_file(tmp_path / "a.csv.gz", text, gz=True)
  reader = text_io.TextReader([path], _TwoColumns(), chunk_lines=2)
  assert reader.read_chunk(path, 3)[0].values[:, 0].tolist() == [b"6", b"7"]
  assert reader.read_chunk(path, 1)[0].values[:, 0].tolist() == [b"2", b"3"]  # reopened
  assert reader.read_chunk(path, 2)[0].values[:, 0].tolist() == [b"4", b"5"]  # read on
  with pytest.raises(DataFormatError, match=r"a\.csv\.gz:10: label must be 0 or 1"):
    reader.read_chunk(path, 4)
  assert reader.read_chunk(path, 5) is None
  lines = reader.read_lines(path, 0)
  assert (lines.first_line, lines.lines) == (1, [b"1,0\n", b"1,1\n"])
  raw, bad = reader.parse_lines(text_io.LineChunk(path, 9, [b"1,8\n", b"2,bad\n"]), True)
  assert bad == 1 and raw.values[:, 0].tolist() == [b"8"]


class _Header(_TwoColumns):
  """`_TwoColumns` after one header line; records the paths it was started on."""

  def __init__(self):
    self.started = []

  def start_file(self, f, path):
    f.readline()
    self.started.append(path)
    return super().start_file(f, path)[0], 2


def test_split_fields_keeps_empty_fields_and_strips_only_the_line_break():
  lines = [b"1\t\t\n", b"x\ty\t \r\n", b"p\tq\n", b"a\tb\tc"]
  problems = {}
  fields, rows = text_io.split_fields(text_io.LineChunk("f", 1, lines), b"\t", 3, problems)
  assert fields.tolist() == [[b"1", b"", b""], [b"x", b"y", b" "], [b"a", b"b", b"c"]]
  assert fields.dtype.kind == "S" and rows.dtype == np.int64 and rows.tolist() == [0, 1, 3]
  assert problems == {2: "expected 3 tab-separated fields, got 2"}
  for sep, name in ((b",", "comma"), (b";", "b';'")):
    problems = {}
    fields, rows = text_io.split_fields(text_io.LineChunk("f", 1, [b"a\n"]), sep, 2, problems)
    assert problems == {0: f"expected 2 {name}-separated fields, got 1"}
    assert (fields.shape, fields.dtype, rows.shape, rows.dtype) == ((0, 2), "S1", (0,), np.int64)


def test_parsed_columns_have_fixed_dtypes_and_fields_are_shown_short():
  problems = {}
  labels = text_io.parse_labels(np.array([b"1", b"0", b"7" * 41]), np.arange(3), "clk", problems)
  assert labels.dtype == np.float32 and labels.tolist() == [1, 0, 0]
  assert problems == {2: "clk must be 0 or 1, got '" + "7" * 37 + "...'"}
  assert text_io._show(b"7" * 40) == repr("7" * 40)
  assert text_io._show(b"\xff7") == repr("\ufffd7")
  for cols in (np.array([[b"1", b""]]), np.array([[b"1", b"q"]])):  # fast and slow paths
    assert text_io.parse_int_columns(cols, np.arange(1), ("a", "b"), {}).dtype == np.int64
  out = text_io.signed_log1p(np.array([-2**63, 2**63 - 1], np.int64))
  np.testing.assert_allclose(out, [-np.log1p(2.0**63), np.log1p(2.0**63)], rtol=1e-6)


def test_line_reads_are_bounded_and_a_line_of_the_limit_is_kept(tmp_path, write_file):
  asked = []

  class _Lines:
    def readline(self, limit):
      asked.append(limit)
      return b""

  assert list(text_io._iter_line_chunks(_Lines(), "f", 3, max_line_bytes=7)) == []
  assert asked == [8]
  path = write_file(tmp_path / "x.csv", "1,a\n0,bc\n")  # 4 bytes, then 5
  reader = text_io.TextReader([path], _TwoColumns(), max_line_bytes=4)
  with pytest.raises(DataFormatError) as e:
    list(reader)
  assert (e.value.line, e.value.reason) == (2, "line is longer than 4 bytes: not a line-oriented "
                                               "text file (binary data or missing line breaks?)")


def test_reader_settings_are_checked():
  for kwargs, message in (({"chunk_lines": 0}, "chunk_lines must be >= 1, got 0"),
                          ({"max_line_bytes": 0}, "max_line_bytes must be >= 1, got 0")):
    with pytest.raises(ValueError, match=f"^{message}$"):
      text_io.TextReader([], _TwoColumns(), **kwargs)
  assert text_io.TextReader([], _TwoColumns(), max_line_bytes=1).max_line_bytes == 1
  assert text_io.TextReader([], _TwoColumns()).chunk_lines == 8192


def test_damaged_gzip_errors_say_where_reading_stopped(tmp_path):
  error = ValueError("x")
  assert text_io._damaged_gzip_error("f", 1, error).reason.startswith(
      "cannot read the file from its start: the gzip data is truncated or corrupt (ValueError: x)")
  assert text_io._damaged_gzip_error("f", 2, error).reason.startswith(
      "cannot read the file past line 1: ")
  path = tmp_path / "x.csv.gz"
  path.write_bytes(b"not gzip at all\n")
  with pytest.raises(DataFormatError) as e:
    text_io.TextReader([str(path)], _TwoColumns()).has_data_lines()
  assert (e.value.path, e.value.line) == (str(path), 1)
  assert e.value.reason.startswith("cannot read the file from its start: ")


@pytest.mark.parametrize("gz", [False, True])
def test_chunks_read_by_index_number_their_lines_after_a_header(tmp_path, write_file, gz):
  text = "h\n" + "".join(f"1,{i}\n" for i in range(7)) + "2,bad\n"
  path = write_file(tmp_path / ("a.csv.gz" if gz else "a.csv"), text, gz=gz)
  fmt = _Header()
  reader = text_io.TextReader([path], fmt, chunk_lines=3)
  lines = reader.read_lines(path, 1)
  assert (lines.path, lines.first_line, lines.lines) == (path, 5, [b"1,3\n", b"1,4\n", b"1,5\n"])
  with pytest.raises(DataFormatError, match=r"a\.csv(\.gz)?:9: label must be 0 or 1"):
    reader.read_chunk(path, 2)
  assert reader.read_lines(path, 3) is None and reader.read_lines(path, 4) is None
  assert set(fmt.started) == {path}


def test_gzip_chunks_read_in_order_open_the_file_once(tmp_path, write_file, monkeypatch):
  path = write_file(tmp_path / "a.csv.gz", "".join(f"1,{i}\n" for i in range(6)), gz=True)
  opened = []
  real_open = text_io.gzip.open
  monkeypatch.setattr(text_io.gzip, "open", lambda p, *a: opened.append(p) or real_open(p, *a))
  reader = text_io.TextReader([path], _TwoColumns(), chunk_lines=2)
  assert reader.num_chunks(path) is None
  opened.clear()
  got = [reader.read_lines(path, k).lines[0] for k in range(3)]
  assert got == [b"1,0\n", b"1,2\n", b"1,4\n"] and len(opened) == 1
  reader.read_lines(path, 0)  # back: reopened
  assert len(opened) == 2


@pytest.mark.parametrize("gz", [False, True])
def test_a_chunk_read_by_index_keeps_the_line_limit(tmp_path, write_file, gz):
  path = write_file(tmp_path / ("a.csv.gz" if gz else "a.csv"), "1,a\n0," + "z" * 30 + "\n", gz=gz)
  reader = text_io.TextReader([path], _TwoColumns(), chunk_lines=1, max_line_bytes=10)
  assert reader.read_lines(path, 0).lines == [b"1,a\n"]
  with pytest.raises(DataFormatError, match=r"a\.csv(\.gz)?:2: line is longer than 10 bytes"):
    reader.read_lines(path, 1)


def test_fields_keep_their_own_trailing_characters_and_paths_are_named_by_default():
  problems = {}
  fields, _ = text_io.split_fields(text_io.LineChunk("f", 1, [b"aX\tbX\n", b"r\t\rn\r\n"]),
                                   b"\t", 2, problems)
  assert fields.tolist() == [[b"aX", b"bX"], [b"r", b"\rn"]] and not problems
  with pytest.raises(ValueError, match="^path is empty: give one or more"):
    text_io.expand_paths(" ")


def test_has_data_lines_reads_one_line_after_the_header_with_the_limit(tmp_path, write_file):
  short = write_file(tmp_path / "a.csv", "h\n1,a\n0," + "z" * 30 + "\n")
  assert text_io.TextReader([short], _Header(), max_line_bytes=10).has_data_lines()
  long = write_file(tmp_path / "b.csv", "h\n0," + "z" * 30 + "\n")
  with pytest.raises(DataFormatError) as e:
    text_io.TextReader([long], _Header(), max_line_bytes=10).has_data_lines()
  assert (e.value.path, e.value.line) == (long, 2)


def test_a_second_pass_keeps_the_full_pass_bad_count(tmp_path, write_file):
  path = write_file(tmp_path / "a.csv", "1,a\nbad\n0,b\nbad\n1,c\n")
  reader = text_io.TextReader([path], _TwoColumns(), skip_bad_lines=True, chunk_lines=2)
  list(reader)
  assert reader.bad_lines_by_file == {path: 2}
  next(iter(reader))  # the first chunk of a second pass: one bad line so far
  assert reader.bad_lines_by_file == {path: 2}
