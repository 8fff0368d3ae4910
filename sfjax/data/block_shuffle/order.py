"""The block shuffle's order (`data.shuffle=block`): whole blocks, rows mixed in a window.

Row-level shuffling of memory-mapped shards reads one example at a time from anywhere
(~4-7M examples/s here); sequential reading runs at tens of millions. The block shuffle
(Grain's window shuffle over a block permutation; tf.data's shuffle buffer over
interleaved files) reads whole blocks of `block_rows` consecutive examples, in a random
order per epoch, and permutes the examples of each window of consecutive blocks, so a
batch mixes rows of `window_blocks` places in the split. Every example is read exactly
once per epoch, and the order is a pure function of (seed, epoch): a position is the
count of examples taken, and seeking to it costs one epoch's block permutation (resume by
seeking, issue #24; per-process input reads rows `[p*B/P, (p+1)*B/P)` of each global
batch, `sfjax.train.input_feed`). `reader.BlockReader` reads the examples.
"""

from __future__ import annotations

import numpy as np

from sfjax.data.index_stream import Position

BLOCK_STREAM = 0xB10C  # the block shuffle's rng stream (beside the seed, the epoch, the window)


class BlockOrder:
  """The block shuffle of a preprocessed split (`data.shuffle=block`), a pure function of
  (seed, epoch): whole blocks are read, rows are mixed within a window (Grain's window
  shuffle over a block permutation; tf.data's shuffle of interleaved files).

  Block k holds examples `[k*block_rows, (k+1)*block_rows)` of the split (the last one
  may be shorter; blocks may straddle shards). Epoch e permutes the blocks with
  `default_rng([seed, BLOCK_STREAM, e])`; consecutive runs of `window_blocks` of them
  form windows, and window w's examples (its blocks' in that order) are permuted with
  `default_rng([seed, BLOCK_STREAM, e, w])`. The stream is the epochs one after another,
  so global batch b is stream examples `[b*B, (b+1)*B)` (batches straddle epochs), and a
  position is just the examples taken: seeking costs one epoch's block permutation.

  Args:
    num_rows: N, examples of an epoch.
    block_rows: examples per block.
    window_rows: examples mixed together (rounded up to whole blocks, at least one).
    seed: the run seed.
    batch_size: B.
    position: a `position()` to start at (None: the beginning).
  """

  kind = "blocks"

  def __init__(self, num_rows: int, block_rows: int, window_rows: int, seed: int,
               batch_size: int, position: Position | None = None):
    if int(num_rows) < 1:
      raise ValueError(f"training data has no examples (num_rows={num_rows})")
    if int(block_rows) < 1 or int(batch_size) < 1:
      raise ValueError(f"block_rows and batch_size must be >= 1, got {block_rows}, {batch_size}")
    self.num_rows, self.block_rows, self.seed = int(num_rows), int(block_rows), int(seed)
    self.batch_size = int(batch_size)
    self.window_blocks = max(1, -(-int(window_rows) // self.block_rows))
    self.num_blocks = -(-self.num_rows // self.block_rows)
    self._batches, self._taken = 0, 0  # global batches and stream examples taken
    self._epoch: int | None = None
    self._window: tuple[int, int] | None = None
    if position is not None:
      if not isinstance(position, dict) or position.get("kind") != self.kind:
        got = position.get("kind") if isinstance(position, dict) else type(position).__name__
        raise ValueError(f"input position: expected kind {self.kind!r}, got {got!r}")
      for key in ("num_rows", "block_rows", "window_blocks"):
        if int(position[key]) != getattr(self, key):
          raise ValueError(f"input position: field {key!r} is {position[key]}, this run's "
                           f"block shuffle has {getattr(self, key)}")
      self._batches, self._taken = int(position["batches"]), int(position["examples"])

  def _load_epoch(self, epoch: int) -> None:
    """The block permutation of `epoch` and its windows' end offsets in the epoch."""
    rng = np.random.default_rng([self.seed, BLOCK_STREAM, epoch])
    self._blocks = rng.permutation(self.num_blocks).astype(np.int64)
    sizes = np.full(self.num_blocks, self.block_rows, np.int64)
    sizes[-1] = self.num_rows - (self.num_blocks - 1) * self.block_rows
    ends = np.cumsum(sizes[self._blocks])[self.window_blocks - 1::self.window_blocks]
    self._window_ends = np.unique(np.append(ends, self.num_rows))  # the last may be partial
    self._epoch, self._window = epoch, None

  @property
  def num_windows(self) -> int:
    """Windows of an epoch (the last may hold fewer blocks)."""
    return -(-self.num_blocks // self.window_blocks)

  def window_blocks_of(self, epoch: int, w: int) -> np.ndarray:
    """The blocks [k] of window `w` of `epoch`, in order (their examples, block after block,
    are the window's rows)."""
    if self._epoch != epoch:
      self._load_epoch(epoch)
    return self._blocks[w * self.window_blocks:(w + 1) * self.window_blocks]

  def permutation(self, epoch: int, w: int, rows: int) -> np.ndarray:
    """The permutation [rows] of window `w`'s rows: its stream is `rows[permutation]`
    (stateless: another thread may draw it while this order reads on)."""
    return np.random.default_rng([self.seed, BLOCK_STREAM, epoch, w]).permutation(rows)

  def window(self, epoch: int, w: int) -> np.ndarray:
    """Example indices [n_w] of window `w` of `epoch`, in stream order."""
    if self._window != (epoch, w):
      blocks = self.window_blocks_of(epoch, w)
      rows = (blocks[:, None] * self.block_rows + np.arange(self.block_rows)).reshape(-1)
      rows = rows[rows < self.num_rows] if blocks.max() == self.num_blocks - 1 else rows
      self._rows = rows[self.permutation(epoch, w, rows.size)]
      self._window = (epoch, w)
    return self._rows

  def next_batch(self) -> np.ndarray:
    """Example indices [B] of the next global batch."""
    pieces, need = [], self.batch_size
    while need:
      epoch, offset = divmod(self._taken, self.num_rows)
      if self._epoch != epoch:
        self._load_epoch(epoch)
      w = int(np.searchsorted(self._window_ends, offset, side="right"))
      start = int(self._window_ends[w - 1]) if w else 0
      rows = self.window(epoch, w)
      piece = rows[offset - start:offset - start + need]
      pieces.append(piece)
      need -= piece.size
      self._taken += piece.size
    self._batches += 1
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

  def position(self) -> Position:
    """Where the next batch starts (JSON-able)."""
    epoch, offset = divmod(self._taken, self.num_rows)
    return {"kind": self.kind, "batches": self._batches, "examples": self._taken,
            "epoch": epoch, "offset": offset, "num_rows": self.num_rows,
            "block_rows": self.block_rows, "window_blocks": self.window_blocks}
