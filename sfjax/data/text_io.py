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
reason)`, otherwise the rows are dropped and counted per file.
"""

from __future__ import annotations

import glob
import gzip
import itertools
import os
from typing import BinaryIO, Callable, Iterable, Iterator, NamedTuple, Protocol

import numpy as np

from sfjax.core.errors import DataFormatError


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

  def start_file(self, f: BinaryIO, path: str) -> tuple[ChunkParser, int]:
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


def open_binary(path: str) -> BinaryIO:
  """Opens `path` for reading bytes, decompressing it if its name ends in `.gz`."""
  if path.endswith(".gz"):
    return gzip.open(path, "rb")
  return open(path, "rb")


def iter_line_chunks(f: BinaryIO, path: str, chunk_lines: int,
                     first_line: int = 1) -> Iterator[LineChunk]:
  """Yields the remaining lines of an open file in chunks of `chunk_lines`."""
  line = first_line
  while True:
    lines = list(itertools.islice(f, chunk_lines))
    if not lines:
      return
    yield LineChunk(path, line, lines)
    line += len(lines)


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


class TextReader:
  """Re-iterable stream of `RawChunk`s over files of one `LineFormat`.

  Each iteration is one pass over all files, in order. `bad_lines_by_file`
  holds the lines dropped per file in one pass (repeated epochs do not double
  count).
  """

  def __init__(self, paths: Iterable[str], fmt: LineFormat, skip_bad_lines: bool = False,
               chunk_lines: int = 8192):
    if chunk_lines < 1:
      raise ValueError(f"chunk_lines must be >= 1, got {chunk_lines}")
    self.paths = tuple(paths)
    self.format = fmt
    self.skip_bad_lines = bool(skip_bad_lines)
    self.chunk_lines = int(chunk_lines)
    self.bad_lines_by_file: dict[str, int] = {}

  @property
  def bad_lines(self) -> int:
    """Lines dropped as malformed, summed over files (latest pass of each)."""
    return sum(self.bad_lines_by_file.values())

  def __iter__(self) -> Iterator[RawChunk]:
    for path in self.paths:
      bad = 0
      with open_binary(path) as f:
        parse, first_line = self.format.start_file(f, path)
        for chunk in iter_line_chunks(f, path, self.chunk_lines, first_line):
          raw, num_bad = parse(chunk, self.skip_bad_lines)
          if num_bad:
            bad += num_bad
            self._record_bad(path, bad)
          if raw.labels.shape[0]:
            yield raw
      self._record_bad(path, bad)

  def _record_bad(self, path: str, count: int) -> None:
    # Every pass drops the same lines: the max is the count of a full pass,
    # already visible while the first pass is still running.
    self.bad_lines_by_file[path] = max(count, self.bad_lines_by_file.get(path, 0))


def _show(text: bytes) -> str:
  """A short, printable rendering of a raw field for error messages."""
  s = text.decode("utf-8", errors="replace")
  return repr(s if len(s) <= 40 else s[:37] + "...")
