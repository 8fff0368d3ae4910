"""The trainer's input: global batches, each process reading only its own rows, and the
input position of every batch (saved in checkpoints: resume by seeking; issue #24).

A data set that can be read by index (`train_order` / `read_train`: synthetic, multihot,
preprocessed shards without bags) defines the training stream as example indices
(`sfjax.data.index_stream`, the same order its `train_batches` gives). Global batch b is
indices `[b*B, (b+1)*B)`; process p reads only rows `[p*B/P, (p+1)*B/P)` of it
(`distributed.process_rows`) and the processes exchange their rows
(`host_exchange.gather_batch`), so every process holds the same global batch as one
process reading everything, while the reading (the parse / disk / generation work) is
split P ways. The position after each batch (epoch, chunk or shard and offset, rng
states, shuffle buffer) is kept for `position_at`; a run restarts from one with no replay.

Text and Parquet files (Criteo, Avazu, `data.format=parquet`: `chunk_feed.ChunkFeed`) are
parsed chunk by chunk, each chunk by one process, and exchanged before the shuffle, which
every process runs alike; their position (kind 'text' or 'parquet': the next chunk, the
shuffle's rng and the ids it holds) restarts them too.

Other data sets (MovieLens, views that select or pool features) are read as a stream: every process reads the whole stream and keeps its rows (the backends'
`put_global`), and a resume replays the stream to the checkpoint's step.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Iterator
from typing import Any

from sfjax.data import index_stream
from sfjax.data.types import Batch
from sfjax.parallel import distributed, host_exchange
from sfjax.train import chunk_feed

POSITION_KEY = "input_position"  # in checkpoint meta
_KEEP_POSITIONS = 1024  # batches the feed may run ahead of the step that saves
_KEEP_CHUNK_POSITIONS = 64  # the same for chunked files (prefetch + look-ahead stay far below)


def reads_by_index(dataset) -> bool:
  """True when `dataset` can be read by index (`train_order`, `read_train`)."""
  return (callable(getattr(dataset, "train_order", None))
          and callable(getattr(dataset, "read_train", None))
          and bool(getattr(dataset, "indexable", True)))


class InputFeed(Iterator[Batch]):
  """Global training batches from step `start` (1-based steps; `start` done already).

  Args:
    dataset: the training data set.
    batch_size: B, the global batch.
    seed: the run seed.
    start: steps already trained (a resumed run's checkpoint step; 0: a new run).
    position: the checkpoint's input position (None: a new run, or a checkpoint without
      one: then the order is replayed to `start`, index only when read by index).

  Raises:
    ValueError: a position that does not belong to step `start`, or of another kind.
  """

  def __init__(self, dataset, batch_size: int, seed: int, start: int = 0,
               position: index_stream.Position | None = None):
    self.by_index = reads_by_index(dataset)
    self._dataset, self._batch_size = dataset, int(batch_size)
    self._positions: collections.OrderedDict[int, index_stream.Position] = (
        collections.OrderedDict())
    self._lock = threading.Lock()
    if position is not None and int(position.get("batches", -1)) != int(start):
      raise ValueError(f"checkpoint meta field {POSITION_KEY}: a position after "
                       f"{position.get('batches')} batches, the checkpoint is at step {start}")
    self.by_chunks = not self.by_index and chunk_feed.reads_chunks(dataset)
    self._chunks: chunk_feed.ChunkFeed | None = None
    self._stream: Iterator[Batch] | None = None
    # A chunked position holds the shuffle buffer's ids: keep fewer of them.
    self._keep = _KEEP_CHUNK_POSITIONS if self.by_chunks else _KEEP_POSITIONS
    if self.by_chunks:
      saved = position if position is not None and position.get("kind") != "replay" else None
      self._chunks = chunk_feed.ChunkFeed(dataset, batch_size, seed, saved)
      if saved is None:
        for _ in range(start):  # an old checkpoint (or a 'replay' position): replay
          self._chunks.next_batch()
    elif self.by_index:
      self._order = dataset.train_order(batch_size, seed, position)
      self._exchange = host_exchange.begin_stream()
      if position is None:
        for _ in range(start):  # an old checkpoint: replay the indices only (no reading)
          self._order.next_batch()
    else:
      if position is not None and position.get("kind") != "replay":
        raise ValueError(f"checkpoint meta field {POSITION_KEY}: kind {position.get('kind')!r} "
                         "but this data set is read as a stream (kind 'replay')")
      self._stream = itertools.islice(dataset.train_batches(batch_size, seed), start, None)
      self._count = int(start)

  def __next__(self) -> Batch:
    if self._chunks is not None:
      batch = self._chunks.next_batch()
      self._remember(self._chunks.position())
      return batch
    if self._stream is not None:
      batch = next(self._stream)
      self._count += 1
      self._remember({"kind": "replay", "batches": self._count})
      return batch
    indices = self._order.next_batch()
    mine = indices[distributed.process_rows(self._batch_size)]
    position = self._order.position()
    batch = host_exchange.gather_batch(position["batches"], self._dataset.read_train(mine),
                                       stream=self._exchange)
    self._remember(position)
    return batch

  def _remember(self, position: index_stream.Position) -> None:
    with self._lock:
      self._positions[int(position["batches"])] = position
      while len(self._positions) > self._keep:
        self._positions.popitem(last=False)

  def position_at(self, step: int) -> index_stream.Position:
    """The input position after `step` batches (those the step loop has trained on).

    Raises:
      KeyError: `step` is not among the positions kept (not yet read, or too old).
    """
    with self._lock:
      if step not in self._positions:
        raise KeyError(f"no input position after {step} batches (kept: "
                       f"{next(iter(self._positions), None)}..{next(reversed(self._positions), None)})")
      return self._positions[step]


def rows_read(dataset) -> dict[str, Any]:
  """{'rows_read': training examples this process read by index} (empty when not)."""
  count = getattr(dataset, "rows_read", None)
  return {} if count is None else {"rows_read": int(count)}
