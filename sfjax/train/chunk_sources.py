"""What a chunked training feed (`chunk_feed.ChunkFeed`) reads: a data set's training
files as numbered chunks, each parsed alone, and given rows of a chunk parsed again.

A source lists its files (`paths`); chunk c of file f is parsed alone by `parse(f, c)`
(exactly as a pass over the files parses it: the same rows, the same drops); `rows(f, c,
size, at)` parses only the examples `at` of a chunk that held `size` in a pass (a resume
re-reads the rows still waiting, not the chunk). Counts per chunk (`COUNTS` of them: bad
rows dropped, ...) go back to the data set's stats through `record(f, totals)`.

  * `TextChunks`: Criteo / Avazu files (`text_io.TextReader`): chunk c is data lines
    `[c*L, (c+1)*L)`, L = `chunk_lines`; a `.gz` file is read in order only (`in_order`).
  * `ParquetChunks`: Parquet files (`parquet.reader.ParquetReader`): chunk c is the file's c-th
    record batch (row groups cut into `chunk_rows` rows).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from sfjax.data import batching, text_io
from sfjax.data.types import Batch, make_batch


class ChunkSource(Protocol):
  """A data set's training files as chunks (see the module docstring).

  Attributes:
    kind: the input position's kind ('text', 'parquet').
    paths: the files, in reading order.
    counts: names of the per-chunk counts `parse` returns (e.g. ('bad_lines',)).
  """

  kind: str
  paths: tuple[str, ...]
  counts: tuple[str, ...]

  def in_order(self, f: int) -> bool:
    """True when file f can only be read from its start (one process parses all of it)."""

  def num_chunks(self, f: int) -> int | None:
    """Chunks of file f (None: unknown before reading to its end)."""

  def parse(self, f: int, c: int) -> tuple[Batch | None, np.ndarray]:
    """Chunk c of file f: (its rows, [counts] int64), rows None past the file's end."""

  def rows(self, f: int, c: int, size: int, at: np.ndarray) -> Batch:
    """Examples `at` [m] (sorted) of chunk c of file f, which held `size` when saved.

    Raises:
      ValueError: the chunk no longer holds `size` examples (the files changed).
    """

  def record(self, f: int, totals: np.ndarray) -> None:
    """File f's counts so far in this epoch, into the data set's stats."""

  def no_examples(self) -> ValueError:
    """The error of an epoch without examples (naming the config key)."""


class TextChunks:
  """`ChunkSource` of a `FileCTRDataset` (its `train_reader` and `mapper`)."""

  kind: str = "text"
  counts: tuple[str, ...] = ("bad_lines",)

  def __init__(self, reader: text_io.TextReader, mapper):
    self.reader, self.map = reader, mapper
    self.paths: tuple[str, ...] = reader.paths

  def in_order(self, f: int) -> bool:
    """A `.gz` file: no random access."""
    return self.paths[f].endswith(".gz")

  def num_chunks(self, f: int) -> int | None:
    """Chunks of a plain file (its chunk index); None for a `.gz` file."""
    return self.reader.num_chunks(self.paths[f])

  def parse(self, f: int, c: int) -> tuple[Batch | None, np.ndarray]:
    """Chunk c parsed and mapped: (rows, [bad lines])."""
    got = self.reader.read_chunk(self.paths[f], c)
    if got is None:
      return None, np.zeros(1, np.int64)
    raw, bad = got
    return self._batch(raw), np.asarray([bad], np.int64)

  def rows(self, f: int, c: int, size: int, at: np.ndarray) -> Batch:
    """Lines `at` of the chunk when no line of it was dropped (example r is line r), else
    the whole chunk parsed as the pass parsed it and the examples `at` taken."""
    path = self.paths[f]
    lines = self.reader.read_lines(path, c)
    if lines is not None and len(lines.lines) == size:
      picked = text_io.LineChunk(path, lines.first_line, [lines.lines[i] for i in at])
      raw, bad = self.reader.parse_lines(picked, skip_bad_lines=True)
      if not bad:
        return self._batch(raw)
    whole = self.reader.parse_lines(lines)[0] if lines is not None else None
    got = 0 if whole is None else whole.labels.shape[0]
    if whole is None or got != size:
      raise ValueError(f"input position: chunk {c} of {path} held {size} examples when "
                       f"saved, now {got}: the training files changed")
    return batching.take(self._batch(whole), at)

  def record(self, f: int, totals: np.ndarray) -> None:
    """Bad lines of file f (the reader keeps the max over passes)."""
    self.reader.record_bad(self.paths[f], int(totals[0]))

  def no_examples(self) -> ValueError:
    """Every line malformed and skipped."""
    return ValueError(f"data.train_path: split 'train' has no examples: all "
                      f"{self.reader.bad_lines} data lines of {', '.join(self.paths)} "
                      "were malformed and skipped")

  def _batch(self, raw: text_io.RawChunk) -> Batch:
    return make_batch(self.map(raw.values), raw.dense, raw.labels)


class ParquetChunks:
  """`ChunkSource` of a `ParquetDataset` (its `train_reader` and `map_chunk`)."""

  kind: str = "parquet"
  counts: tuple[str, ...] = ("bad_lines", "truncated_ids")

  def __init__(self, reader, map_chunk):
    self.reader, self.map = reader, map_chunk
    self.paths: tuple[str, ...] = tuple(reader.paths)

  def in_order(self, f: int) -> bool:
    """Never: every chunk is found from the file's metadata."""
    del f
    return False

  def num_chunks(self, f: int) -> int | None:
    """Record batches of file f."""
    return self.reader.num_chunks(self.paths[f])

  def parse(self, f: int, c: int) -> tuple[Batch | None, np.ndarray]:
    """Chunk c parsed and mapped: (rows, [bad rows, ids truncated])."""
    got = self.reader.read_chunk(self.paths[f], c)
    if got is None:
      return None, np.zeros(2, np.int64)
    chunk, bad, truncated = got
    return self.map(chunk), np.asarray([bad, truncated], np.int64)

  def rows(self, f: int, c: int, size: int, at: np.ndarray) -> Batch:
    """Rows `at` of the chunk (`ParquetReader.read_rows`: only those rows parsed)."""
    return self.map(self.reader.read_rows(self.paths[f], c, size, at))

  def record(self, f: int, totals: np.ndarray) -> None:
    """Bad rows and truncated ids of file f (the reader keeps the max over passes)."""
    self.reader.record(self.paths[f], int(totals[0]), int(totals[1]))

  def no_examples(self) -> ValueError:
    """Every row bad and skipped."""
    return ValueError(f"data.train_path: split 'train' has no examples: all "
                      f"{self.reader.bad_rows} rows of {', '.join(self.paths)} were bad and "
                      "skipped")


def source_of(dataset) -> ChunkSource | None:
  """The chunk source of `dataset`'s training files, or None (not read chunk by chunk)."""
  reader = getattr(dataset, "train_reader", None)
  if isinstance(reader, text_io.TextReader) and callable(getattr(dataset, "mapper", None)):
    return TextChunks(reader, dataset.mapper)
  if getattr(dataset, "format_name", "") == "parquet" and callable(getattr(dataset, "map_chunk", None)):
    return ParquetChunks(reader, dataset.map_chunk)
  return None
