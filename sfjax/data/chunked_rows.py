"""Generated data sets drawn in fixed chunks: epochs, eval passes and the oracle, once.

`SyntheticCTR` (`synthetic.py`) and `MultihotCTR` (`multihot.py`) draw chunk c of split
s from its own seeded stream, so any row range is reproducible without the rest. What
they share lives here: slicing a row range out of chunks, the training epochs (every
epoch the same rows; the chunk order and the rows inside each chunk permuted by
`default_rng([seed, shuffle_stream, epoch])`), the eval pass, and the oracle (the AUC
and logloss of the true click probabilities per eval split, computed once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sfjax.core import metrics
from sfjax.data import batching, index_stream
from sfjax.data.types import Batch, concat_batches


class ChunkedRows:
  """Mixin of a generated data set; subclasses set `chunk_rows`, `shuffle_stream`,
  `eval_splits`, `_oracle = None` and define `chunk(split, index)` (rows with `to_batch`,
  `labels`, `probs`, sliceable field by field) and `split_size(split)`."""

  chunk_rows: int
  shuffle_stream: int
  eval_splits: tuple[str, ...]
  _oracle: dict[str, dict[str, float]] | None
  rows_read: int = 0  # training examples read by index (`read_train`), this process
  # Defined by the subclass: chunk(split, index) -> rows [index * chunk_rows, +chunk_rows),
  # split_size(split) -> rows of an epoch / eval split, generate_rows(split, start, n).
  chunk: Callable[[str, int], Any]
  split_size: Callable[[str], int]
  generate_rows: Callable[[str, int, int], Any]

  def _row_pieces(self, split: str, start: int, stop: int) -> Iterator[Any]:
    """Rows [start, stop) of a split, chunk by chunk."""
    size = self.chunk_rows
    for index in range(start // size, -(-stop // size)):
      base = index * size
      lo, hi = max(start, base) - base, min(stop, base + size) - base
      rows = self.chunk(split, index)
      yield type(rows)(*(a[lo:hi] for a in rows))

  def _train_epochs(self, seed: int, num_train: int) -> Iterator[Batch]:
    """Shuffled chunks of epochs of `num_train` rows, forever."""
    epoch = 0
    while True:
      rng = np.random.default_rng([int(seed), self.shuffle_stream, epoch])
      for index in rng.permutation(-(-num_train // self.chunk_rows)):
        order = rng.permutation(min(self.chunk_rows, num_train - int(index) * self.chunk_rows))
        yield batching.take(self.chunk("train", int(index)).to_batch(), order)
      epoch += 1

  def train_order(self, batch_size: int, seed: int,
                  position: index_stream.Position | None = None) -> index_stream.ChunkedOrder:
    """The training order as example indices (`_train_epochs`'s, index for index), from
    `position` (None: the start); read a batch's rows with `read_train`."""
    return index_stream.ChunkedOrder(seed, self.shuffle_stream, self.split_size("train"),
                                     self.chunk_rows, batch_size, position)

  def read_train(self, indices: np.ndarray) -> Batch:
    """The training examples `indices` [n] (of `train_order`), in that order; the chunks
    they fall in are drawn (the last two are kept; no indices: no rows, chunk 0's columns).
    Counts `rows_read`."""
    indices = np.asarray(indices, np.int64)
    cache = self.__dict__.setdefault("_train_chunks", {})
    chunk_of = indices // self.chunk_rows
    pieces, where = [], []
    for index in np.unique(chunk_of).tolist():
      if index not in cache:
        if len(cache) >= 2:
          cache.pop(next(iter(cache)))
        cache[index] = self.chunk("train", index).to_batch()
      at = np.flatnonzero(chunk_of == index)
      pieces.append(batching.take(cache[index], indices[at] - index * self.chunk_rows))
      where.append(at)
    self.rows_read += int(indices.size)
    if not pieces:  # no rows: chunk 0's columns, none of its rows
      return batching.take(self.chunk("train", 0).to_batch(), indices)
    merged = concat_batches(pieces)
    return batching.take(merged, np.argsort(np.concatenate(where), kind="stable"))

  def _eval_pass(self, split: str, batch_size: int) -> Iterator[Batch]:
    """The split's rows in order; the last batch padded (mask 0), never dropped."""
    pieces = self._row_pieces(split, 0, self.split_size(split))
    return batching.eval_batches((rows.to_batch() for rows in pieces), int(batch_size))

  @property
  def oracle(self) -> dict[str, dict[str, float]]:
    """{split: {'auc', 'logloss'}} of the true probabilities per eval split (computed once)."""
    if self._oracle is None:
      oracle = {}
      for split in self.eval_splits:
        rows = self.generate_rows(split, 0, self.split_size(split))
        oracle[split] = {"auc": metrics.auc(rows.labels, rows.probs),
                         "logloss": metrics.logloss(rows.labels, rows.probs)}
      self._oracle = oracle
    return self._oracle
