"""Streaming text records: path globs, transparent gzip, numbered line chunks.

A `TextReader` streams one or many files (comma-separated globs, each sorted)
chunk by chunk: it never holds more than `chunk_lines` lines of a file. Lines
are read as bytes (no decoding cost; CTR logs are ASCII) and handed to a
format's parser together with their 1-based line number in their own file, so
every error can name `path:line`. A parser returns a `RawChunk`: raw
categorical values, transformed dense features and labels, before any
feature -> row mapping.

Bad-line policy: a parser collects `problems` (row in chunk -> reason); with
`skip_bad_lines=False` the first one raises `DataFormatError(path, line,
reason)`, otherwise the rows are dropped and counted per file. A line holding
a NUL byte is a bad line (text logs never contain one; a crash can leave
NUL-filled blocks in a file).

Broken files always raise `DataFormatError`, whatever `skip_bad_lines` says,
because no later line of the file can be trusted:
  * a `.gz` file that is truncated, corrupt (CRC, invalid deflate data) or not
    gzip: the error names the first line that could not be read, after the
    last line read;
  * a line longer than `max_line_bytes` (default `MAX_LINE_BYTES`): the file
    is not line-oriented text (binary data, lost line breaks). Lines are read
    with that bound, so such a file never loads into memory whole.
An empty file (0 bytes, also after decompression) has no lines and no header:
it contributes no examples. A last line without a line break is read as a line.

Reading one chunk (per-process input, issue #24): chunk c of a file is its data lines
`[c*L, (c+1)*L)` (L = `chunk_lines`), the very chunk a pass yields. `read_chunk` reads
it alone: a plain file through its chunk index (`chunk_offsets`: the byte offset of
every L-th data line, one newline scan of the file, kept in memory), a `.gz` file by
reading on from the chunk read before (gzip cannot seek: out of order it reopens and
skips lines). `lines_parsed` counts the data lines this reader handed to a parser.
"""

from __future__ import annotations

import glob
import gzip
import io
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Protocol

import numpy as np

from sfjax.core.errors import DataFormatError

# Longest accepted line (bytes, terminator included). Criteo and Avazu lines are
# < 1 KiB; a longer line means the file is not line-oriented text.
MAX_LINE_BYTES = 1 << 20

# What reading a damaged .gz raises: EOFError (truncated), gzip.BadGzipFile (not
# gzip, CRC or length mismatch; an OSError), zlib.error (invalid deflate data).
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)


class LineChunk(NamedTuple):
  """Consecutive lines of one file.

  Attributes:
    path: the file.
    first_line: 1-based line number of `lines[0]` in `path`.
    lines: raw lines as bytes, line terminators included.
  """

  path: str
  first_line: int
  lines: list[bytes]


class RawChunk(NamedTuple):
  """Parsed examples before feature -> row mapping.

  Attributes:
    values: [n, F] bytes (numpy 'S' dtype), raw categorical values; b'' = missing.
    dense: [n, Nd] float32, already transformed.
    labels: [n] float32 in {0, 1}.
  """

  values: np.ndarray
  dense: np.ndarray
  labels: np.ndarray


ChunkParser = Callable[[LineChunk, bool], tuple[RawChunk, int]]


class LineFormat(Protocol):
  """A line-oriented file format (Criteo TSV, Avazu CSV)."""

  field_names: tuple[str, ...]
  num_dense: int

  def start_file(self, f: io.BufferedIOBase, path: str) -> tuple[ChunkParser, int]:
    """Consumes any header of an open file.

    Returns:
      (parser, first_line): the parser for this file's data lines, which are
      numbered from `first_line`. The parser maps `(chunk, skip_bad_lines)` to
      `(RawChunk, number of bad lines dropped)`.
    """


def expand_paths(spec: str, what: str = "path") -> tuple[str, ...]:
  """Expands comma-separated globs; each glob's matches are sorted.

  Args:
    spec: e.g. "/d/day_0.gz,/d/part-*.tsv".
    what: the config key named in errors, e.g. "data.train_path".

  Returns:
    The files, glob by glob, in sorted order within each glob.

  Raises:
    ValueError: `spec` is empty or a glob matches no file.
  """
  patterns = [p.strip() for p in spec.split(",") if p.strip()]
  if not patterns:
    raise ValueError(f"{what} is empty: give one or more comma-separated files or globs")
  paths = []
  for pattern in patterns:
    matches = sorted(m for m in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(m))
    if not matches:
      raise ValueError(f"{what}: {pattern!r} matches no file")
    paths.extend(matches)
  return tuple(paths)


def _open_binary(path: str) -> io.BufferedReader | gzip.GzipFile:
  """Opens `path` for reading bytes, decompressing it if its name ends in `.gz`.

  Both kinds are buffered: `peek` tells an empty file without consuming a byte.
  """
  if path.endswith(".gz"):
    return gzip.open(path, "rb")
  return open(path, "rb")


def _damaged_gzip_error(path: str, line: int, error: Exception) -> DataFormatError:
  """The error for gzip data that cannot be read at `line` (1-based)."""
  where = f"past line {line - 1}" if line > 1 else "from its start"
  return DataFormatError(path, line, f"cannot read the file {where}: the gzip data is truncated "
                         f"or corrupt ({type(error).__name__}: {error})")


def _iter_line_chunks(f: io.BufferedIOBase, path: str, chunk_lines: int, first_line: int = 1,
                      max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[LineChunk]:
  """Yields the remaining lines of an open file in chunks of `chunk_lines`.

  Raises:
    DataFormatError: a line is longer than `max_line_bytes`, or the gzip data
      is damaged; naming the first line that could not be read.
  """
  line = first_line
  readline = f.readline
  while True:
    lines: list[bytes] = []
    error: DataFormatError | None = None
    cause: BaseException | None = None
    try:
      while len(lines) < chunk_lines:
        text = readline(max_line_bytes + 1)  # Bounded: a file with no line break never loads whole.
        if not text:
          break
        if len(text) > max_line_bytes:
          error = DataFormatError(
              path, line + len(lines), f"line is longer than {max_line_bytes} bytes: not a "
              "line-oriented text file (binary data or missing line breaks?)")
          break
        lines.append(text)
    except _GZIP_ERRORS as e:
      error, cause = _damaged_gzip_error(path, line + len(lines), e), e
    if lines:  # The lines before an unreadable one go first: an earlier bad line is reported first.
      yield LineChunk(path, line, lines)
      line += len(lines)
    if error is not None:
      raise error from cause
    if not lines:
      return


def split_fields(chunk: LineChunk, sep: bytes, num_fields: int,
                 problems: dict[int, str]) -> tuple[np.ndarray, np.ndarray]:
  """Splits each line into fields; lines with the wrong count become problems.

  Args:
    chunk: the lines.
    sep: field separator, e.g. b'\\t'.
    num_fields: expected fields per line.
    problems: updated in place with `row -> reason` for malformed rows.

  Returns:
    (fields, rows): fields [m, num_fields] bytes of the well-formed lines and
    rows [m] their int64 positions in `chunk.lines`.
  """
  split = [line.rstrip(b"\r\n").split(sep) for line in chunk.lines]
  good = [i for i, parts in enumerate(split) if len(parts) == num_fields]
  if b"\0" in b"".join(chunk.lines):  # One scan of the chunk; per line only when found.
    for i, line in enumerate(chunk.lines):
      if b"\0" in line:
        problems.setdefault(i, "line contains a NUL byte (binary data in a text file)")
    good = [i for i in good if i not in problems]
  if len(good) != len(split):
    name = {b"\t": "tab", b",": "comma"}.get(sep, repr(sep))
    for i, parts in enumerate(split):
      if len(parts) != num_fields:
        problems.setdefault(i, f"expected {num_fields} {name}-separated fields, got {len(parts)}")
    split = [split[i] for i in good]
  if not split:
    return np.zeros((0, num_fields), dtype="S1"), np.zeros((0,), np.int64)
  return np.array(split, dtype=bytes), np.asarray(good, dtype=np.int64)


def parse_labels(column: np.ndarray, rows: np.ndarray, name: str,
                 problems: dict[int, str]) -> np.ndarray:
  """[m] bytes in {b'0', b'1'} -> [m] float32; anything else is a problem."""
  ones = column == b"1"
  bad = np.flatnonzero(~(ones | (column == b"0")))
  for i in bad:
    problems.setdefault(int(rows[i]), f"{name} must be 0 or 1, got {_show(column[i])}")
  return ones.astype(np.float32)


def parse_int_columns(columns: np.ndarray, rows: np.ndarray, names: tuple[str, ...],
                      problems: dict[int, str]) -> np.ndarray:
  """[m, k] bytes -> [m, k] int64; b'' (missing) -> 0; non-integers are problems."""
  filled = np.where(columns == b"", b"0", columns)
  try:
    return filled.astype(np.int64)
  except (ValueError, OverflowError):
    pass  # Rare: find the culprits one by one.
  out = np.zeros(filled.shape, dtype=np.int64)
  for (i, j), text in np.ndenumerate(filled):
    try:
      out[i, j] = int(text)
    except (ValueError, OverflowError):
      problems.setdefault(int(rows[i]), f"{names[j]} is not a 64-bit integer: {_show(text)}")
  return out


def signed_log1p(x: np.ndarray) -> np.ndarray:
  """sign(x) * log(1 + |x|) as float32: log(1+x) for x >= 0, odd-symmetric below."""
  x = np.asarray(x, dtype=np.float64)
  return (np.sign(x) * np.log1p(np.abs(x))).astype(np.float32)


def keep_good_rows(problems: dict[int, str], chunk: LineChunk, rows: np.ndarray,
                   skip_bad_lines: bool) -> tuple[np.ndarray, int]:
  """Applies the bad-line policy to one chunk.

  Args:
    problems: row in `chunk.lines` -> reason.
    chunk: the lines, for the error location.
    rows: [m] positions (in `chunk.lines`) of the parsed rows.
    skip_bad_lines: drop and count instead of raising.

  Returns:
    (keep, num_bad): keep [m] bool over `rows`; num_bad = len(problems).

  Raises:
    DataFormatError: for the first bad line, unless `skip_bad_lines`.
  """
  if not problems:
    return np.ones(rows.shape, dtype=bool), 0
  if not skip_bad_lines:
    first = min(problems)
    raise DataFormatError(chunk.path, chunk.first_line + first, problems[first])
  bad = np.fromiter(problems.keys(), dtype=np.int64, count=len(problems))
  return ~np.isin(rows, bad), len(problems)


def chunk_offsets(f: io.BufferedIOBase, chunk_lines: int, block_bytes: int = 1 << 24) -> np.ndarray:
  """Byte offsets of the chunks of an open plain file, from its current position.

  Args:
    f: a seekable binary file, positioned at its first data line.
    chunk_lines: L, lines per chunk.
    block_bytes: bytes scanned at a time.

  Returns:
    [n + 1] int64: where data lines 0, L, 2L, ... start (n chunks), then the file's size.
    A last line without a line break is a line; n = 0 when no data line follows.
  """
  start = f.tell()
  starts, newlines, base = [start], 0, start
  while block := f.read(block_bytes):
    ends = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)  # each newline ends a line
    count = newlines + np.arange(1, ends.size + 1)  # lines ended so far
    starts.extend((base + ends[count % chunk_lines == 0] + 1).tolist())
    newlines += ends.size
    base += len(block)
  if starts[-1] == base:  # a chunk start at the end of the file holds no line
    starts.pop()
  return np.asarray(starts + [base], np.int64)


class _GzipCursor(NamedTuple):
  """An open `.gz` file, read up to chunk `next_chunk` (gzip streams read forward only)."""

  file: gzip.GzipFile
  chunks: Iterator[LineChunk]
  next_chunk: int


class TextReader:
  """Re-iterable stream of `RawChunk`s over files of one `LineFormat`.

  Each iteration is one pass over all files, in order. `bad_lines_by_file`
  holds the lines dropped per file in one pass (repeated epochs do not double
  count).
  """

  def __init__(self, paths: Iterable[str], fmt: LineFormat, skip_bad_lines: bool = False,
               chunk_lines: int = 8192, max_line_bytes: int = MAX_LINE_BYTES):
    if chunk_lines < 1:
      raise ValueError(f"chunk_lines must be >= 1, got {chunk_lines}")
    if max_line_bytes < 1:
      raise ValueError(f"max_line_bytes must be >= 1, got {max_line_bytes}")
    self.paths = tuple(paths)
    self.format = fmt
    self.skip_bad_lines = bool(skip_bad_lines)
    self.chunk_lines = int(chunk_lines)
    self.max_line_bytes = int(max_line_bytes)
    self.bad_lines_by_file: dict[str, int] = {}
    self.lines_parsed = 0  # data lines handed to a parser (`__iter__` and `read_chunk`)
    self._files: dict[str, tuple[ChunkParser | None, int, np.ndarray | None]] = {}
    self._gzip: dict[str, _GzipCursor] = {}

  @property
  def bad_lines(self) -> int:
    """Lines dropped as malformed, summed over files (latest pass of each)."""
    return sum(self.bad_lines_by_file.values())

  def __iter__(self) -> Iterator[RawChunk]:
    for path in self.paths:
      bad = 0
      with _open_binary(path) as f:
        parse, first_line = self._start(f, path)
        if parse is not None:  # None: an empty file, no line to parse.
          for chunk in _iter_line_chunks(f, path, self.chunk_lines, first_line,
                                         self.max_line_bytes):
            raw, num_bad = parse(chunk, self.skip_bad_lines)
            self.lines_parsed += len(chunk.lines)
            if num_bad:
              bad += num_bad
              self.record_bad(path, bad)
            if raw.labels.shape[0]:
              yield raw
      self.record_bad(path, bad)

  def num_chunks(self, path: str) -> int | None:
    """Chunks of a plain file (indexed on first use); None for a `.gz` file (unknown)."""
    offsets = self._file(path)[2]
    return None if offsets is None else int(offsets.size - 1)

  def read_chunk(self, path: str, chunk: int) -> tuple[RawChunk, int] | None:
    """Chunk `chunk` of `path` parsed alone, as a pass parses it: (raw, bad lines dropped),
    None past the file's end. Raises `DataFormatError` as a pass would."""
    lines = self.read_lines(path, chunk)
    return None if lines is None else self.parse_lines(lines)

  def read_lines(self, path: str, chunk: int) -> LineChunk | None:
    """The lines of chunk `chunk` of `path`, unparsed (None past the file's end)."""
    parse, first_line, offsets = self._file(path)
    if parse is None:
      return None
    if offsets is None:
      return self._next_gzip_chunk(path, chunk, first_line)
    if chunk >= offsets.size - 1:
      return None
    with _open_binary(path) as f:
      f.seek(int(offsets[chunk]))
      return next(_iter_line_chunks(f, path, self.chunk_lines, first_line +
                                    chunk * self.chunk_lines, self.max_line_bytes), None)

  def parse_lines(self, lines: LineChunk, skip_bad_lines: bool | None = None
                  ) -> tuple[RawChunk, int]:
    """Parses lines of `lines.path` (`skip_bad_lines`: the reader's unless given)."""
    parse = self._file(lines.path)[0]
    assert parse is not None  # a file with lines has a parser
    self.lines_parsed += len(lines.lines)
    return parse(lines, self.skip_bad_lines if skip_bad_lines is None else skip_bad_lines)

  def _file(self, path: str) -> tuple[ChunkParser | None, int, np.ndarray | None]:
    """(parser, first data line, chunk offsets or None for .gz) of a file, read once."""
    if path not in self._files:
      with _open_binary(path) as f:
        parse, first_line = self._start(f, path)
        offsets = (None if path.endswith(".gz") else
                   np.zeros(1, np.int64) if parse is None else chunk_offsets(f, self.chunk_lines))
      self._files[path] = (parse, first_line, offsets)
    return self._files[path]

  def _next_gzip_chunk(self, path: str, chunk: int, first_line: int) -> LineChunk | None:
    """Chunk `chunk` of a .gz file: read on (skipping forward), reopened to go back."""
    cursor = self._gzip.pop(path, None)
    if cursor is None or cursor.next_chunk > chunk:
      if cursor is not None:
        cursor.file.close()
      f = gzip.open(path, "rb")
      self._start(f, path)  # the header again
      cursor = _GzipCursor(f, _iter_line_chunks(f, path, self.chunk_lines, first_line,
                                                self.max_line_bytes), 0)
    lines = None
    for _ in range(chunk - cursor.next_chunk + 1):  # the earlier ones skipped unparsed
      if (lines := next(cursor.chunks, None)) is None:
        cursor.file.close()
        return None
    self._gzip[path] = cursor._replace(next_chunk=chunk + 1)
    return lines

  def has_data_lines(self) -> bool:
    """Whether any file has a line after its header (reads at most one line per file)."""
    for path in self.paths:
      with _open_binary(path) as f:
        _, first_line = self._start(f, path)
        if next(_iter_line_chunks(f, path, 1, first_line, self.max_line_bytes), None):
          return True
    return False

  def _start(self, f: io.BufferedReader | gzip.GzipFile, path: str) -> tuple[ChunkParser | None, int]:
    """The format's (parser, first data line) for an open file.

    An empty file (0 bytes, also after decompression) has no header to read and
    no line to parse: (None, 1).
    """
    try:
      if not f.peek(1):
        return None, 1
      return self.format.start_file(f, path)
    except _GZIP_ERRORS as e:
      raise _damaged_gzip_error(path, 1, e) from e

  def record_bad(self, path: str, count: int) -> None:
    """Records `count` bad lines of `path` in the current pass (the max over passes)."""
    # Every pass drops the same lines: the max is the count of a full pass,
    # already visible while the first pass is still running.
    self.bad_lines_by_file[path] = max(count, self.bad_lines_by_file.get(path, 0))


def _show(text: bytes) -> str:
  """A short, printable rendering of a raw field for error messages."""
  s = text.decode("utf-8", errors="replace")
  return repr(s if len(s) <= 40 else s[:37] + "...")
