"""ChunkedRows: row ranges across chunks, shuffled epochs of whole chunks, the oracle once."""

from typing import NamedTuple

import numpy as np

from sfjax.core import metrics
from sfjax.data.chunked_rows import ChunkedRows
from sfjax.data.types import make_batch


class _Rows(NamedTuple):
  ids: np.ndarray
  labels: np.ndarray
  probs: np.ndarray

  def to_batch(self):
    return make_batch(self.ids[:, None], np.zeros((len(self.ids), 0)), self.labels)


class _Toy(ChunkedRows):
  chunk_rows, shuffle_stream, eval_splits = 4, 7, ("eval",)

  def __init__(self):
    self._oracle, self.chunk_calls = None, 0

  def chunk(self, split, index):
    self.chunk_calls += 1
    base = {"train": 0, "eval": 1000}[split] + 4 * index
    ids = np.arange(base, base + 4)
    return _Rows(ids, (ids % 3 == 0).astype(np.float32), (ids % 5) / 5.0)

  def split_size(self, split):
    return {"train": 10, "eval": 6}[split]

  def generate_rows(self, split, start, num_rows):
    pieces = list(self._row_pieces(split, start, start + num_rows))
    return _Rows(*(np.concatenate(p) for p in zip(*pieces, strict=True)))


def test_row_ranges_cross_chunks():
  rows = _Toy().generate_rows("train", 3, 6)
  np.testing.assert_array_equal(rows.ids, np.arange(3, 9))


def test_epochs_hold_every_row_once_in_seeded_orders():
  toy = _Toy()
  stream = toy._train_epochs(seed=1, num_train=10)
  first = np.concatenate([next(stream).ids[:, 0] for _ in range(3)])  # chunks of 4, 4, 2
  second = np.concatenate([next(stream).ids[:, 0] for _ in range(3)])
  assert sorted(first) == sorted(second) == list(range(10))
  assert list(first) != list(second)  # another permutation each epoch
  again = _Toy()._train_epochs(seed=1, num_train=10)
  np.testing.assert_array_equal(np.concatenate([next(again).ids[:, 0] for _ in range(3)]), first)


def test_eval_pass_pads_and_oracle_is_computed_once():
  toy = _Toy()
  batches = list(toy._eval_pass("eval", 4))
  assert [b.mask.sum() for b in batches] == [4, 2]
  rows = toy.generate_rows("eval", 0, 6)
  want = metrics.auc(rows.labels, rows.probs)
  assert toy.oracle["eval"]["auc"] == want
  calls = toy.chunk_calls
  assert toy.oracle["eval"]["auc"] == want and toy.chunk_calls == calls
