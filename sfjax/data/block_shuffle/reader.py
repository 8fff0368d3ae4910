"""The block shuffle's reader: whole blocks copied from the shards' maps, rows gathered in memory.

Gathering examples one by one from memory-mapped shards touches a page (and misses the
caches) per example; copying a whole block is a sequential read at memory speed, after
which the window's rows are gathered from a buffer the caches hold. `BlockReader.read`
serves any indices (the per-process reader by index, `sfjax.train.input_feed`), keeping
the blocks it copied; `BlockReader.batches` streams a `BlockOrder` window by window.

Where an example's time goes (`experiments/bench_input.py`'s `block_stage_ns_per_example`,
one thread, 2048-row blocks, windows of 65536, batches of 4096; 2-core Xeon, 2026-12-06,
~52 ns/example): the block copy ~19 ns, the window's permutation ~9-10 (numpy's
Fisher-Yates: fixed by the order), the gathers and batch assembly ~23. A window's arrays
are reused (fresh ones fault their pages in: ~+10 ns), rows are gathered `_GATHER_ROWS` at
a time (a whole window at once misses the caches: ~+12 ns), the ids stay in the shards'
dtype (int32 unless a field has more than 2**31 rows), also in the batches: making them
int64 cost ~10 ns of the gathers' ~33, and the one consumer that needs them wide
(`vsi.global_row_ids`) widens them in the offsets' sum it does anyway; the columns stay
separate arrays (one record per row: ~+15 ns). With `ahead`, a second thread copies the
next window's blocks while this one gathers, and the permutations are split between the
two threads (every other window each): the copies plus all the permutations outweighed the
gathers. `batch_groups` hands a window's batches over at once (one thread hand-off per
window of up to `GROUP_ROWS` rows, not per batch).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any, NamedTuple

import numpy as np

from sfjax.data import bag_shards, shards
from sfjax.data.block_shuffle.order import BlockOrder
from sfjax.data.types import Batch

_Columns = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None"]
_GATHER_ROWS = 8192  # rows per gather in `batches` (fewer calls: less GIL traffic per batch)
# Rows of batches handed over at once by `batch_groups` (a window's, up to this many: the
# groups a background reader holds stay ~10 MB each however large the window).
GROUP_ROWS = 1 << 16


class Window(NamedTuple):
  """A window of a `BlockOrder` in memory (`BlockReader.windows`).

  Attributes:
    arrays: ids, dense, labels, weights (None without a feature layout): the window's
      blocks, in order, in rows `[0, rows)` (a slot's arrays: reused by a later window).
    rows: n_w, examples of the window.
    permutation: [n_w] the window's stream is `arrays[permutation]` (`BlockOrder.permutation`).
  """

  arrays: list
  rows: int
  permutation: np.ndarray


class BlockReader:
  """Reads training examples by index through a cache of whole blocks (`data.shuffle=block`).

  Block k (`BlockOrder`'s: examples `[k*block_rows, (k+1)*block_rows)` of the
  split, maybe straddling shards) is copied from the shards' maps once, in contiguous
  slices, into a slot of the cache's arrays (ids in the shards' dtype, also in the batches
  read; with a feature layout padded, with their weights: `bag_shards.to_batch`'s
  form); the rows of a read are then gathered from the slots (memory, not the maps: one
  `np.take` per array; separate arrays gather faster than packed rows). The least
  recently read blocks are replaced; a read that needs more blocks than the cache holds
  grows it. Holding two windows of `BlockOrder` (`capacity`), each block of a shuffled
  epoch is copied once.

  Args:
    split: the opened train split.
    shard: shard index -> its `shards.ShardArrays` (opened and checked once).
    block_rows: examples per block.
    capacity: blocks the cache starts with.

  Attributes:
    blocks_loaded: blocks copied from the maps so far.
  """

  def __init__(self, split: shards.ShardSplit, shard: Callable[[int], shards.ShardArrays],
               block_rows: int, capacity: int):
    if int(block_rows) < 1:
      raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    self._shard, self.block_rows, self._layout = shard, int(block_rows), split.info.layout
    sizes = [s.num_examples for s in split.info.shards]
    self._starts = [0] + list(itertools.accumulate(sizes))  # [S + 1] each shard's first example
    self.num_rows = self._starts[-1]
    self._slot_of = np.full(-(-self.num_rows // self.block_rows), -1, np.int64)  # block -> slot
    self._block_in = np.full(max(1, int(capacity)), -1, np.int64)  # slot -> block
    self._used = np.zeros(self._block_in.size, np.int64)  # slot -> the read that last used it
    self._clock = 0
    self._arrays: list[Any] = [None] * 4  # ids, dense, labels, weights (on the first copy)
    self.blocks_loaded = 0

  def _pieces(self, block: int) -> Iterator[tuple[int, _Columns]]:
    """(row in the block, its examples' (ids, dense, labels, weights): map views, or
    `bag_shards.to_batch`'s padded arrays with a layout), shard by shard, of `block`."""
    lo = block * self.block_rows
    hi = min(lo + self.block_rows, self.num_rows)
    s = bisect.bisect_right(self._starts, lo) - 1
    while lo < hi:
      stop = min(hi, self._starts[s + 1])
      arrays, a, b = self._shard(s), lo - self._starts[s], stop - self._starts[s]
      if self._layout is None:  # views of the maps (the hot path: no per-block objects)
        columns: _Columns = (arrays.ids[a:b], arrays.dense[a:b], arrays.labels[a:b], None)
      else:
        batch = bag_shards.to_batch(arrays.rows(a, b), self._layout)
        columns = (batch.ids, batch.dense, batch.labels, batch.weights)
      yield lo - block * self.block_rows, columns
      lo, s = stop, s + 1


  @property
  def num_slots(self) -> int:
    """Blocks the cache can hold now (it grows only for a read needing more)."""
    return int(self._block_in.size)

  @property
  def _capacity_rows(self) -> int:
    return self._block_in.size * self.block_rows

  def _load(self, blocks: np.ndarray) -> None:
    """Copies `blocks` into the least recently used slots not read by the current read."""
    free = np.flatnonzero(self._used < self._clock)
    if free.size < blocks.size:  # grow: the new slots come first among the free ones
      grow = max(blocks.size - free.size, self._block_in.size)
      start = self._block_in.size
      self._block_in = np.concatenate([self._block_in, np.full(grow, -1, np.int64)])
      self._used = np.concatenate([self._used, np.zeros(grow, np.int64)])
      if self._arrays[0] is not None:  # larger arrays, keeping the blocks they hold
        held, self._arrays = self._arrays, _empty(self._arrays, self._capacity_rows)
        for new, kept in zip(self._arrays, held, strict=True):
          if new is not None:
            new[:kept.shape[0]] = kept
      free = np.concatenate([np.arange(start, start + grow), free])
    else:
      free = free[np.argsort(self._used[free], kind="stable")]
    for block, slot in zip(blocks.tolist(), free[:blocks.size].tolist(), strict=True):
      evicted = int(self._block_in[slot])
      if evicted >= 0:
        self._slot_of[evicted] = -1
      self._copy(block, self._arrays, slot * self.block_rows, self._capacity_rows)
      self._block_in[slot], self._slot_of[block] = block, slot
      self._used[slot] = self._clock

  def _copy(self, block: int, arrays: list, row: int, rows: int) -> int:
    """Copies `block` into `arrays` from `row` on, first making them arrays of `rows`
    examples if they are None; returns the block's examples."""
    n = 0
    for at, piece in self._pieces(block):
      if arrays[0] is None:
        arrays[:] = _empty(piece, rows)
      for dst, src in zip(arrays, piece, strict=True):
        if dst is not None and src is not None:
          dst[row + at:row + at + src.shape[0]] = src
      n = at + piece[2].shape[0]
    self.blocks_loaded += 1
    return n

  def read(self, indices: np.ndarray) -> Batch:
    """The examples `indices` [n] of the split, in that order (fresh arrays, mask ones)."""
    indices = np.asarray(indices, np.int64)
    self._clock += 1
    blocks = indices // self.block_rows
    slots = self._slot_of[blocks]
    missing = slots < 0
    if missing.any():
      self._used[slots[~missing]] = self._clock  # kept: this read needs them
      self._load(np.unique(blocks[missing]))
      slots = self._slot_of[blocks]
    else:
      self._used[slots] = self._clock
    local = slots * self.block_rows + (indices - blocks * self.block_rows)
    return _batch(_gather(self._arrays, local))

  def window(self, order: BlockOrder, epoch: int, w: int, arrays: list) -> Window:
    """Window `w` of `epoch` of `order`: its blocks copied, in order, into `arrays` (ids,
    dense, labels, weights: all None at first, then allocated, and reused by the caller for
    a later window: no page faults per window), and its permutation."""
    rows = self._fill(order, epoch, w, arrays)
    return Window(arrays, rows, order.permutation(epoch, w, rows))

  def _fill(self, order: BlockOrder, epoch: int, w: int, arrays: list) -> int:
    """Copies window `w` of `epoch`'s blocks, in order, into `arrays`; its examples."""
    rows = 0
    for block in order.window_blocks_of(epoch, w).tolist():
      rows += self._copy(block, arrays, rows, order.window_blocks * self.block_rows)
    return rows

  def windows(self, order: BlockOrder, ahead: bool = False) -> Iterator[Window]:
    """`window` after window of `order`, epoch after epoch; each is the caller's until it
    asks for the next one.

    Args:
      order: a `BlockOrder` (its windows are read here only).
      ahead: copy the next window's blocks on a second thread while the caller reads this
        one (two sets of arrays, in turns); the second thread also draws the permutations
        of windows 0, 2, 4, ..., the caller's thread those of windows 1, 3, 5, ...
    """
    numbers = ((epoch, w) for epoch in itertools.count() for w in range(order.num_windows))
    slots: list[list[Any]] = [[None] * 4, [None] * 4]
    if not ahead:
      for epoch, w in numbers:
        yield self.window(order, epoch, w, slots[0])
      return

    def prepare(k: int, epoch: int, w: int) -> tuple[int, np.ndarray | None]:  # 2nd thread
      rows = self._fill(order, epoch, w, slots[k % 2])
      return rows, None if k % 2 else order.permutation(epoch, w, rows)

    with futures.ThreadPoolExecutor(1, thread_name_prefix="sfjax-block-window") as pool:
      current = next(numbers)
      pending = pool.submit(prepare, 0, *current)
      for k, following in enumerate(numbers, 1):
        rows, permutation = pending.result()
        # The caller is done with window k - 2, whose arrays window k now takes.
        pending = pool.submit(prepare, k, *following)
        if permutation is None:  # every other window's permutation: drawn here
          permutation = order.permutation(*current, rows)
        yield Window(slots[(k - 1) % 2], rows, permutation)
        current = following

  def batches(self, order: BlockOrder, ahead: bool = False) -> Iterator[Batch]:
    """`order`'s batches from its start, each equal to `read(order.next_batch())`: the
    batches of `batch_groups`, one by one. `order` is this generator's alone."""
    for group in self.batch_groups(order, ahead):
      yield from group

  def batch_groups(self, order: BlockOrder, ahead: bool = False,
                   group_rows: int = GROUP_ROWS) -> Iterator[list[Batch]]:
    """`order`'s batches from its start, in lists: the batches completed while reading a
    window, in lists of at most `max(1, group_rows // batch_size)` batches (a window's last
    list at its end; a batch that straddles two windows is in the second one's; a window
    smaller than a batch may give an empty list). Window by window (`windows`), rows are
    gathered from the window's arrays by its permutation, `_GATHER_ROWS` at a time (they
    stay in the caches), whole batches as views of one gather. A thread that hands the
    batches to another one hands a list at once: one hand-off per window (of up to
    `group_rows`), not per batch (`PreprocessedDataset`'s background reader). `order` is
    this generator's alone.

    Args:
      order: a `BlockOrder` at its start.
      ahead: copy the next window (and draw every other window's permutation) on a
        second thread while this one gathers (numpy releases the GIL while it copies,
        permutes and gathers: a second free core takes that share; without one, the
        switches cost more than they save).
      group_rows: rows of batches per list at most (at least one batch).
    """
    size, carry, count = order.batch_size, [], 0  # rows of the next batch gathered so far
    most = max(1, int(group_rows) // size)
    for arrays, filled, permutation in self.windows(order, ahead):
      start, group = 0, list[Batch]()
      while start < filled:
        if len(group) >= most:
          yield group
          group = []
        if count == 0 and filled - start >= size:  # whole batches, several per gather
          whole = min(max(1, _GATHER_ROWS // size), (filled - start) // size, most - len(group))
          take = whole * size
          columns = _gather(arrays, permutation[start:start + take])
          start += take
          group.extend(_batch(columns, slice(lo, lo + size)) for lo in range(0, take, size))
          continue  # (views of this gather's fresh arrays)
        take = min(size - count, filled - start)
        carry.append(_gather(arrays, permutation[start:start + take]))
        start += take
        count += take
        if count == size:
          group.append(_batch([None if parts[0] is None else np.concatenate(parts)
                               for parts in zip(*carry, strict=True)]))
          carry, count = [], 0
      yield group


def _empty(like: Sequence[np.ndarray | None], rows: int) -> list[np.ndarray | None]:
  """Arrays of `rows` examples shaped and typed like `like`'s (None stays None)."""
  return [None if a is None else np.empty((rows,) + a.shape[1:], a.dtype) for a in like]


def _gather(arrays, local: np.ndarray) -> _Columns:
  """The rows `local` [n] of `arrays` (ids, dense, labels, weights), fresh, in their
  dtypes (ids as the shards store them: `Batch.ids` may be int32)."""
  ids, dense, labels, weights = (None if a is None else np.take(a, local, axis=0)
                                 for a in arrays)
  assert ids is not None and dense is not None and labels is not None
  return ids, dense, labels, weights


def _batch(columns: Sequence[np.ndarray | None], rows: slice | None = None) -> Batch:
  """A `Batch` of the gathered (ids, dense, labels, weights) (their `rows`), mask ones."""
  ids, dense, labels, weights = (a if a is None or rows is None else a[rows] for a in columns)
  assert ids is not None and dense is not None and labels is not None
  return Batch(ids, dense, labels, np.ones(labels.shape[0], np.float32), weights)
