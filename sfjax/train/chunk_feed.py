"""Chunked training input (text and Parquet files) parsed per process and resumed by seeking.

The training stream of a data set read chunk by chunk (`chunk_sources`: Criteo / Avazu
text, Parquet) is, epoch after epoch, its files' chunks (chunk c of file f: L lines or
rows, bad ones dropped) through a seeded streaming shuffle buffer
(`batching._shuffle_stream`), cut into batches of B. `ChunkFeed` yields that very
sequence, batch for batch (so 1 process gives what it always gave, and P processes give
what 1 gives), while

  * each process parses only its own chunks: chunk c of file f is process `(f + c) % P`'s,
    a file read in order only (`.gz`) process `f % P`'s whole. The owner parses and maps a
    chunk and publishes it in the coordination service's key-value store; the others read
    it there (`host_exchange`'s encoding), so every process holds the same chunks in the
    same order and shuffles them alike. A process parses its chunks of the next `2P` ahead
    before it waits for another's, so the P processes parse at once; a `.gz` file is
    parsed at its owner's pace.
  * the shuffle runs on example ids (`index_stream.IndexShuffler`, which draws from the rng
    exactly as `_shuffle_stream`), the rows waiting in pieces of the chunks they came from.
    The position after a batch (`position`: the next chunk, the rng state, the ids in the
    buffer and in the batch being cut, and the chunks they came from) is small; a restart
    re-parses those rows (each chunk's by its owner; the whole chunk only when the pass
    dropped bad rows of it) and nothing else: resume by seeking, in time bounded by the
    buffer (~`shuffle_buffer` rows), not by the step (issue #24).

Example ids count the examples the run has taken in (0, 1, ...), so they are unique
across epochs and grow with the stream.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np

from sfjax.data import batching, index_stream
from sfjax.data.types import Batch, concat_batches, make_batch
from sfjax.parallel import barriers, host_exchange
from sfjax.train import chunk_sources

_PREFIX = "sfjax/chunks"
_streams = {"count": 0}  # chunked streams begun by this process (the same on every process)


def reads_chunks(dataset) -> bool:
  """True when `dataset`'s training files are read chunk by chunk (text, Parquet)."""
  return chunk_sources.source_of(dataset) is not None


class _Piece(NamedTuple):
  """Examples of one chunk still waiting (in the shuffle buffer or the batch being cut).

  Attributes:
    first_id: the id of the chunk's first example (its examples are first_id + [0, n)).
    size: n, the chunk's examples.
    epoch, file, chunk: where the chunk is.
    ids: [m] int64 sorted ids of rows kept (waiting ones and some taken).
    rows: their rows (a `Batch` of m examples).
    alive: [m] bool, the rows still waiting.
  """

  first_id: int
  size: int
  epoch: int
  file: int
  chunk: int
  ids: np.ndarray
  rows: Batch
  alive: np.ndarray


class ChunkFeed:
  """Global training batches of a chunked data set, from the start or from a `position`.

  Args:
    dataset: a data set with a chunk source (`chunk_sources.source_of`: a
      `FileCTRDataset` or a `ParquetDataset`) and `shuffle_buffer`.
    batch_size: B.
    seed: the run seed (the shuffle's).
    position: a `position()` to start at (None: the beginning).

  Raises:
    ValueError: a position of another kind, or whose chunks no longer hold what they held.
  """

  def __init__(self, dataset, batch_size: int, seed: int,
               position: index_stream.Position | None = None):
    if int(batch_size) < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    source = chunk_sources.source_of(dataset)
    if source is None:
      raise ValueError(f"{type(dataset).__name__} is not read chunk by chunk (text or Parquet)")
    self._source: chunk_sources.ChunkSource = source
    self._paths = source.paths
    self._batch_size = int(batch_size)
    buffer = int(dataset.shuffle_buffer)
    self._shuffler = (index_stream.IndexShuffler(buffer, np.random.default_rng(seed))
                      if buffer > 1 else None)
    self._count, self._me = jax.process_count(), jax.process_index()
    _streams["count"] += 1
    self._stream = _streams["count"]
    if self._count > 1 and self._stream > 1:
      # The previous stream's chunks: read by all, as long as no process begins a stream
      # before every process is done with the last (runs end in a collective; a caller
      # taking two feeds in a row puts a barrier between them).
      _delete(f"{_PREFIX}/{self._stream - 1}")
    self._local: dict[tuple[int, int, int], tuple[Batch | None, np.ndarray]] = {}
    self._published: list[tuple[int, int, int]] = []  # not yet deleted
    self._high = (-1, -1, -1)  # the last chunk published
    self._ends: dict[tuple[int, int], int] = {}  # (epoch, in-order file) -> its end, once found
    self._pieces: list[_Piece] = []
    self._cut = np.zeros(0, np.int64)  # ids of the batch being cut
    self._epoch = self._file = self._chunk = self._next_id = self._epoch_examples = 0
    self._batches = 0
    self._counts: dict[int, np.ndarray] = {}  # file -> its counts (bad rows...) this epoch
    if position is not None:
      self._restore(position)

  # -- the stream -------------------------------------------------------------------------

  def next_batch(self) -> Batch:
    """The next global batch [B] (mask all ones)."""
    while self._cut.size < self._batch_size:
      self._cut = np.concatenate([self._cut, self._pull()])
    ids, self._cut = self._cut[:self._batch_size], self._cut[self._batch_size:]
    self._batches += 1
    return self._take(ids)

  def _pull(self) -> np.ndarray:
    """The ids the next chunk lets out of the shuffle buffer (at an epoch's end: the rest)."""
    if self._file == len(self._paths):
      if self._epoch_examples == 0:
        raise self._source.no_examples()
      rest = self._shuffler.finish() if self._shuffler is not None else np.zeros(0, np.int64)
      self._epoch, self._file, self._chunk, self._epoch_examples = self._epoch + 1, 0, 0, 0
      self._counts = {}
      return rest
    key = (self._epoch, self._file, self._chunk)
    rows, counts = self._chunk_rows(key)
    if rows is None:  # past the file's last chunk
      self._file, self._chunk = self._file + 1, 0
      return np.zeros(0, np.int64)
    self._chunk += 1
    if counts.any():
      self._counts[key[1]] = self._counts.get(key[1], 0) + counts
      self._source.record(key[1], self._counts[key[1]])
    ids = self._next_id + np.arange(rows.size, dtype=np.int64)
    self._next_id += rows.size
    self._epoch_examples += rows.size
    if rows.size:
      self._pieces.append(_Piece(int(ids[0]), rows.size, *key, ids, rows,
                                  np.ones(rows.size, bool)))
    return self._shuffler.push(ids) if self._shuffler is not None else ids

  def _take(self, ids: np.ndarray) -> Batch:
    """The rows of `ids` [B], in that order; they leave their pieces."""
    firsts = np.asarray([p.first_id for p in self._pieces], np.int64)
    which = np.searchsorted(firsts, ids, side="right") - 1
    order = np.argsort(which, kind="stable")  # the batch's positions, piece by piece
    bounds = np.searchsorted(which[order], np.arange(len(self._pieces) + 1))
    parts, kept = [], []
    for k, piece in enumerate(self._pieces):
      wanted = ids[order[bounds[k]:bounds[k + 1]]]
      if wanted.size:
        rows = (wanted - piece.first_id if piece.ids.size == piece.size  # not compacted yet
                else np.searchsorted(piece.ids, wanted))
        parts.append(batching.take(piece.rows, rows))
        piece.alive[rows] = False
        left = int(piece.alive.sum())
        if not left:
          continue
        if left * 2 < piece.alive.size:  # compact when half is gone: amortised copies
          piece = piece._replace(ids=piece.ids[piece.alive],
                                 rows=batching.take(piece.rows, piece.alive),
                                 alive=np.ones(left, bool))
      kept.append(piece)
    self._pieces = kept
    return batching.take(concat_batches(parts), np.argsort(order))

  # -- chunks: parsed by their owner, read by everyone -----------------------------------

  def _owner(self, key: tuple[int, int, int]) -> int:
    _, f, c = key
    return (f if self._source.in_order(f) else f + c) % self._count

  def _parse(self, key: tuple[int, int, int]) -> tuple[Batch | None, np.ndarray]:
    """Chunk `key` parsed and mapped here: (rows, counts), rows None past the file's end."""
    return self._source.parse(key[1], key[2])

  def _chunk_rows(self, key: tuple[int, int, int]) -> tuple[Batch | None, np.ndarray]:
    """Chunk `key`'s rows (None past the end of its file) and its counts."""
    if self._count == 1:
      return self._parse(key)
    self._publish_ahead(key)
    owner = self._owner(key)
    got = self._local.pop(key) if owner == self._me else self._fetch(key, owner)
    _client().key_value_set(f"{_PREFIX}/{self._stream}/progress/{self._me}",
                            " ".join(map(str, key)), allow_overwrite=True)
    return got

  def _publish_ahead(self, key: tuple[int, int, int]) -> None:
    """Parses and publishes this process's chunks among the next 2P of `key`'s file."""
    epoch, f, c = key
    known = self._source.num_chunks(f)
    known = self._ends.get((epoch, f), known)
    for k in range(c, c + 2 * self._count):
      ahead = (epoch, f, k)
      if known is not None and k > known:  # past the end (chunk `known`: the end's marker)
        break
      if self._owner(ahead) != self._me or ahead <= self._high:
        continue
      rows, counts = self._parse(ahead)
      self._publish(ahead, rows, counts)
      if rows is None:
        break

  def _publish(self, key: tuple[int, int, int], rows: Batch | None, counts: np.ndarray,
               keep: bool = True) -> None:
    if rows is None:
      self._ends[key[:2]] = key[2]
    meta = np.concatenate([[rows is None], counts]).astype(np.int64)
    arrays = ((None,) * 4 if rows is None
              else (rows.ids, rows.dense, rows.labels, rows.weights)) + (meta,)
    client = _client()
    client.key_value_set_bytes(self._key(key), host_exchange.rows_to_bytes(arrays))
    if keep:
      self._local[key] = (rows, counts)
    self._published.append(key)
    self._high = max(self._high, key)
    self._drop_read()

  def _fetch(self, key: tuple[int, int, int], owner: int) -> tuple[Batch | None, np.ndarray]:
    seconds = barriers.timeout_s()
    try:
      data = _client().blocking_key_value_get_bytes(self._key(key), int(seconds * 1000))
    except Exception as err:  # pylint: disable=broad-except  (timeout or a lost coordinator)
      barriers.record_peer_failure()
      raise barriers.PeerFailureError(
          f"process {owner} did not publish {self._source.kind} chunk {key[2]} of "
          f"{self._paths[key[1]]} "
          f"(epoch {key[0]}) within {seconds:g} s (this is process {self._me}): "
          f"{str(err).splitlines()[0]}") from err
    like: tuple[Any, ...] = (None,) * 5
    ids, dense, labels, weights, meta = host_exchange.rows_from_bytes(data, like)
    if meta[0]:
      return None, meta[1:]
    return make_batch(ids, dense, labels, weights=weights), meta[1:]

  def _drop_read(self) -> None:
    """Deletes this process's published chunks that every process has read."""
    client, done = _client(), []
    for p in range(self._count):
      if p != self._me:
        try:
          done.append(tuple(int(x) for x in client.key_value_try_get(
              f"{_PREFIX}/{self._stream}/progress/{p}").split()))
        except Exception:  # pylint: disable=broad-except  (not set yet: nothing read)
          return
    read = min(done)
    while self._published and self._published[0] <= read:
      try:
        client.key_value_delete(self._key(self._published.pop(0)))
      except Exception:  # pylint: disable=broad-except  (housekeeping only)
        pass

  def _key(self, key: tuple[int, int, int]) -> str:
    return f"{_PREFIX}/{self._stream}/chunk/{key[0]}/{key[1]}/{key[2]}"

  # -- position -------------------------------------------------------------------------

  def position(self) -> index_stream.Position:
    """Where the next batch starts (JSON-able)."""
    enc = index_stream.encode_indices
    out: index_stream.Position = {
        "kind": self._source.kind, "batches": self._batches, "epoch": self._epoch,
        "file": self._file, "chunk": self._chunk, "next_id": self._next_id,
        "epoch_examples": self._epoch_examples,
        "bad": {str(f): n.tolist() for f, n in self._counts.items()},  # per file: counts
        "pending": enc(self._cut),
        "pieces": [[p.first_id, p.size, p.epoch, p.file, p.chunk] for p in self._pieces]}
    if self._shuffler is not None:
      out.update(rng=self._shuffler.rng.bit_generator.state,
                 buffer=enc(self._shuffler.buffer), shuffle_pending=enc(self._shuffler.pending))
    return out

  def _restore(self, position: index_stream.Position) -> None:
    """Starts at `position`: re-parses (each process its own) the chunks of waiting rows."""
    kind = self._source.kind
    if not isinstance(position, dict) or position.get("kind") != kind:
      got = position.get("kind") if isinstance(position, dict) else type(position).__name__
      raise ValueError(f"input position: expected kind {kind!r}, got {got!r}")
    def dec(key: str) -> np.ndarray:
      value = index_stream.decode_indices(position.get(key))
      if value is None:
        raise ValueError(f"input position: field {key!r} is missing")
      return value

    self._batches, self._epoch, self._file, self._chunk = (
        int(position[k]) for k in ("batches", "epoch", "file", "chunk"))
    self._next_id, self._epoch_examples = int(position["next_id"]), int(position["epoch_examples"])
    width = len(self._source.counts)  # (a text position of before saved one int per file)
    self._counts = {int(f): np.resize(np.asarray(n, np.int64), width)
                    for f, n in position.get("bad", {}).items()}
    for f, n in self._counts.items():
      self._source.record(f, n)
    self._cut = dec("pending")
    waiting = [self._cut]
    if self._shuffler is not None:
      self._shuffler.rng.bit_generator.state = position["rng"]
      self._shuffler.buffer = index_stream.decode_indices(position.get("buffer"))
      self._shuffler.pending = dec("shuffle_pending")
      waiting += [a for a in (self._shuffler.buffer, self._shuffler.pending) if a is not None]
    live = np.sort(np.concatenate(waiting))
    pieces = [tuple(int(x) for x in p) for p in position["pieces"]]
    wanted = []  # per piece: (key, its examples, the positions of its waiting rows)
    for first, size, epoch, f, c in pieces:
      at = live[(live >= first) & (live < first + size)] - first
      wanted.append(((epoch, f, c), size, at))
    if self._count > 1:  # each chunk parsed by its owner, then read by all
      for key, size, at in wanted:
        if self._owner(key) == self._me:
          self._publish(key, self._waiting_rows(key, size, at), np.zeros(0, np.int64),
                        keep=False)
    for (first, size, *_), (key, _, at) in zip(pieces, wanted, strict=True):
      rows = (self._waiting_rows(key, size, at) if self._count == 1
              else self._fetch(key, self._owner(key))[0])
      assert rows is not None
      self._pieces.append(_Piece(first, size, *key, first + at, rows, np.ones(at.size, bool)))

  def _waiting_rows(self, key: tuple[int, int, int], size: int, at: np.ndarray) -> Batch:
    """Examples `at` [m] (sorted) of chunk `key`, which held `size` examples."""
    return self._source.rows(key[1], key[2], size, at)


def _client() -> Any:
  return barriers.coordination_client()


def _delete(prefix: str) -> None:
  try:
    _client().key_value_delete(prefix)
  except Exception:  # pylint: disable=broad-except  (housekeeping only)
    pass
