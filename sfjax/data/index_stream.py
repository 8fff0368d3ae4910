"""The training order as a stream of example indices, resumable from a saved position.

A random-access data set's training stream is a deterministic sequence of example
indices (a function of the seed): global batch b is indices `[b*B, (b+1)*B)` of it. The
index streams here reproduce, index for index, the order the data sets' example
streams have always produced (so a run reading by index trains exactly as one reading
the stream), and they can say where they are (`position`) and start there again
(`position=`) in time independent of the step: resume by seeking (issue #24).

  ChunkedOrder  generated data sets (`chunked_rows.ChunkedRows`: synthetic, multihot):
                per epoch `default_rng([seed, stream, epoch])` permutes the chunks, then
                the rows of each chunk as it is reached.
  ShardOrder    preprocessed shards (`shards.ShardSplit.chunks` + `batching`'s streaming
                shuffle buffer): the shard order, then each shard's block order, drawn
                from one order rng; blocks mixed by the buffer's rng (`IndexShuffler`).

A position is a JSON-able dict (arrays as base64 int64): `kind`, `batches` (global
batches taken so far) and the order's own state (epoch, chunk / shard and offset, rng
states, the shuffle buffer's indices and the examples cut but not yet batched).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

Position = dict[str, Any]


def encode_indices(a: np.ndarray | None) -> str | None:
  """int64 indices as base64 text (None stays None)."""
  return None if a is None else base64.b64encode(np.asarray(a, "<i8").tobytes()).decode()


def decode_indices(text: str | None) -> np.ndarray | None:
  """`encode_indices`'s inverse."""
  return None if text is None else np.frombuffer(base64.b64decode(text), "<i8").astype(np.int64)


def _required(position: Position, key: str) -> np.ndarray:
  """The indices saved under `key` (an array that is never absent)."""
  value = decode_indices(position.get(key))
  if value is None:
    raise ValueError(f"input position: field {key!r} is missing")
  return value


def _check_kind(position: Position, kind: str) -> None:
  if not isinstance(position, dict) or position.get("kind") != kind:
    got = position.get("kind") if isinstance(position, dict) else type(position).__name__
    raise ValueError(f"input position: expected kind {kind!r}, got {got!r}")


class _Batcher:
  """Cuts a stream of index arrays into batches of B (`batching.rebatch`'s cut), pulling
  a piece from `pull()` only when fewer than B indices wait."""

  def __init__(self, batch_size: int, pull, pending: np.ndarray | None = None):
    if int(batch_size) < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    self.batch_size, self._pull = int(batch_size), pull
    self.pending = np.zeros(0, np.int64) if pending is None else pending
    self.batches = 0

  def next_batch(self) -> np.ndarray:
    pieces, count = [self.pending], self.pending.size
    while count < self.batch_size:
      piece = self._pull()
      pieces.append(piece)
      count += piece.size
    merged = np.concatenate(pieces)
    self.pending = merged[self.batch_size:]
    self.batches += 1
    return merged[:self.batch_size]


class ChunkedOrder:
  """The training order of a generated data set (`chunked_rows.ChunkedRows._train_epochs`).

  Row r of chunk c is example `c * chunk_rows + r`.

  Args:
    seed: the run seed.
    stream: the data set's `shuffle_stream`.
    num_rows: rows of an epoch.
    chunk_rows: rows per chunk.
    batch_size: B.
    position: a `position()` to start at (None: the beginning).
  """

  kind = "chunked"

  def __init__(self, seed: int, stream: int, num_rows: int, chunk_rows: int, batch_size: int,
               position: Position | None = None):
    if int(num_rows) < 1:
      raise ValueError(f"training data has no examples (num_rows={num_rows})")
    self.seed, self.stream = int(seed), int(stream)
    self.num_rows, self.chunk_rows = int(num_rows), int(chunk_rows)
    self._batcher = _Batcher(batch_size, self._pull)
    if position is None:
      self._start_epoch(0)
      return
    _check_kind(position, self.kind)
    self._start_epoch(int(position["epoch"]), draw_chunk=False)
    self._k = int(position["chunk"])
    self._rng.bit_generator.state = position["rng"]
    self._load_chunk()
    self._j = int(position["offset"])
    self._batcher.pending = _required(position, "pending")
    self._batcher.batches = int(position["batches"])

  def _start_epoch(self, epoch: int, draw_chunk: bool = True) -> None:
    self._epoch = epoch
    self._rng = np.random.default_rng([self.seed, self.stream, epoch])
    self._perm = self._rng.permutation(-(-self.num_rows // self.chunk_rows))
    self._k = 0
    if draw_chunk:
      self._load_chunk()

  def _load_chunk(self) -> None:
    self._rng_before = self._rng.bit_generator.state  # to redraw this chunk's order on resume
    index = int(self._perm[self._k])
    size = min(self.chunk_rows, self.num_rows - index * self.chunk_rows)
    self._order = index * self.chunk_rows + self._rng.permutation(size)
    self._j = 0

  def _pull(self) -> np.ndarray:
    piece = self._order[self._j:]
    self._k += 1
    if self._k == self._perm.size:
      self._start_epoch(self._epoch + 1)
    else:
      self._load_chunk()
    return piece

  def next_batch(self) -> np.ndarray:
    """Example indices [B] of the next global batch."""
    return self._batcher.next_batch()

  def position(self) -> Position:
    """Where the next batch starts (JSON-able)."""
    return {"kind": self.kind, "batches": self._batcher.batches, "epoch": self._epoch,
            "chunk": self._k, "offset": self._j, "rng": self._rng_before,
            "pending": encode_indices(self._batcher.pending)}


class IndexShuffler:
  """`batching._shuffle_stream` over index arrays, as an explicit state (`buffer`,
  `pending`) so it can be saved and restored; draws from `rng` exactly as it does."""

  def __init__(self, buffer_size: int, rng: np.random.Generator,
               buffer: np.ndarray | None = None, pending: np.ndarray | None = None):
    self.buffer_size, self.rng = int(buffer_size), rng
    self.buffer = buffer
    self.pending = np.zeros(0, np.int64) if pending is None else pending

  def push(self, chunk: np.ndarray) -> np.ndarray:
    """The indices emitted for one incoming chunk (maybe none)."""
    size = self.buffer_size
    if chunk.size == 0:
      return chunk
    if self.buffer is None or chunk.size >= size:
      parts = [self.pending, chunk] + ([self.buffer] if self.buffer is not None else [])
      self.pending, self.buffer = np.concatenate(parts), None
      if self.pending.size < size:
        return np.zeros(0, np.int64)
      union = self.pending
      order = self.rng.permutation(union.size)
      excess = union.size - size
      self.buffer, self.pending = union[order[excess:]], np.zeros(0, np.int64)
      return union[order[:excess]]
    slots = self.rng.choice(size, size=chunk.size, replace=False)
    out = self.buffer[slots]
    self.buffer[slots] = chunk
    return out

  def finish(self) -> np.ndarray:
    """The end of an epoch: what is left, in random order; the shuffler is empty after."""
    rest = np.concatenate([self.pending] + ([self.buffer] if self.buffer is not None else []))
    self.pending, self.buffer = np.zeros(0, np.int64), None
    return rest[self.rng.permutation(rest.size)] if rest.size else rest


class ShardOrder:
  """The training order of a preprocessed split (`PreprocessedDataset.train_batches`).

  Example i is row `i - starts[s]` of shard s. Without shuffling (`shuffle_buffer <= 1`)
  the order is the files'.

  Args:
    shard_sizes: examples of each shard.
    block_rows: examples per block (the data set's `read_chunk`).
    shuffle_buffer: the streaming buffer's examples (<= 1: no shuffling at all).
    seed: the run seed.
    batch_size: B.
    position: a `position()` to start at (None: the beginning).
  """

  kind = "shards"

  def __init__(self, shard_sizes, block_rows: int, shuffle_buffer: int, seed: int,
               batch_size: int, position: Position | None = None):
    self.sizes = np.asarray(shard_sizes, np.int64)
    if int(self.sizes.sum()) == 0:
      raise ValueError("training data has no examples (epoch 0 was empty)")
    self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
    self.block_rows = int(block_rows)
    self.shuffle = int(shuffle_buffer) > 1
    self._order_rng = np.random.default_rng([int(seed), 0x5EED]) if self.shuffle else None
    self._shuffler = (IndexShuffler(shuffle_buffer, np.random.default_rng(seed))
                      if self.shuffle else None)
    self._batcher = _Batcher(batch_size, self._pull)
    if position is None:
      self._start_epoch(0)
      return
    _check_kind(position, self.kind)
    self._epoch, self._s, self._t = (int(position[k]) for k in ("epoch", "shard", "block"))
    self._shards = _required(position, "shards")
    self._blocks = _required(position, "blocks")
    if self.shuffle:
      assert self._order_rng is not None and self._shuffler is not None
      self._order_rng.bit_generator.state = position["order_rng"]
      self._shuffler.rng.bit_generator.state = position["shuffle_rng"]
      self._shuffler.buffer = decode_indices(position["buffer"])
      self._shuffler.pending = _required(position, "shuffle_pending")
    self._batcher.pending = _required(position, "pending")
    self._batcher.batches = int(position["batches"])

  def _start_epoch(self, epoch: int) -> None:
    self._epoch, self._s = epoch, 0
    n = self.sizes.size
    self._shards = (self._order_rng.permutation(n) if self._order_rng is not None
                    else np.arange(n)).astype(np.int64)
    self._load_shard()

  def _load_shard(self) -> None:
    self._t = 0
    if self._s == self._shards.size:
      self._blocks = np.zeros(0, np.int64)
      return
    blocks = np.arange(0, int(self.sizes[self._shards[self._s]]), self.block_rows)
    self._blocks = (self._order_rng.permutation(blocks) if self._order_rng is not None
                    else blocks).astype(np.int64)

  def _next_block(self) -> np.ndarray | None:
    """The next block's example indices, None at the end of the epoch."""
    while self._t == self._blocks.size:
      if self._s == self._shards.size:
        return None
      self._s += 1
      self._load_shard()
    shard = int(self._shards[self._s])
    lo = int(self._blocks[self._t])
    hi = min(lo + self.block_rows, int(self.sizes[shard]))
    self._t += 1
    return self.starts[shard] + np.arange(lo, hi, dtype=np.int64)

  def _pull(self) -> np.ndarray:
    block = self._next_block()
    if block is None:  # the epoch ends: the buffer's rest, then a new epoch
      rest = self._shuffler.finish() if self._shuffler is not None else np.zeros(0, np.int64)
      self._start_epoch(self._epoch + 1)
      return rest
    return self._shuffler.push(block) if self._shuffler is not None else block

  def next_batch(self) -> np.ndarray:
    """Example indices [B] of the next global batch."""
    return self._batcher.next_batch()

  def position(self) -> Position:
    """Where the next batch starts (JSON-able)."""
    out: Position = {"kind": self.kind, "batches": self._batcher.batches, "epoch": self._epoch,
                     "shard": self._s, "block": self._t, "shards": encode_indices(self._shards),
                     "blocks": encode_indices(self._blocks),
                     "pending": encode_indices(self._batcher.pending)}
    if self._shuffler is not None:
      assert self._order_rng is not None
      out.update(order_rng=self._order_rng.bit_generator.state,
                 shuffle_rng=self._shuffler.rng.bit_generator.state,
                 buffer=encode_indices(self._shuffler.buffer),
                 shuffle_pending=encode_indices(self._shuffler.pending))
    return out
