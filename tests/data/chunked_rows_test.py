"""ChunkedRows: row ranges across chunks, shuffled epochs of whole chunks, the oracle once."""

import itertools
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


def test_row_ranges_start_and_stop_on_chunk_edges():
  toy = _Toy()
  np.testing.assert_array_equal(toy.generate_rows("train", 4, 4).ids, np.arange(4, 8))
  np.testing.assert_array_equal(toy.generate_rows("train", 0, 10).ids, np.arange(10))
  np.testing.assert_array_equal(toy.generate_rows("eval", 5, 1).ids, [1005])
  calls = toy.chunk_calls
  toy.generate_rows("train", 4, 4)
  assert toy.chunk_calls == calls + 1  # only the chunk the range lies in


def test_epochs_permute_the_chunk_order_with_the_seed_and_stream():
  def first_epoch_chunks(seed):  # one chunk per batch: its first row tells which
    stream = _Toy()._train_epochs(seed, 10)
    return tuple(int(next(stream).ids[0, 0]) // 4 for _ in range(3))

  orders = {first_epoch_chunks(seed) for seed in range(12)}
  assert len(orders) > 1 and all(sorted(o) == [0, 1, 2] for o in orders)
  epoch = np.concatenate([b.ids[:, 0] for b in itertools.islice(_Toy()._train_epochs(3, 10), 3)])
  rng = np.random.default_rng([3, _Toy.shuffle_stream, 0])
  want = []
  for index in rng.permutation(3):
    order = rng.permutation(min(4, 10 - 4 * int(index)))
    want.extend(4 * int(index) + order)
  np.testing.assert_array_equal(epoch, want)


def test_the_training_order_reads_the_epochs_index_for_index():
  for seed, batch in ((0, 3), (5, 4), (9, 7)):
    stream = _Toy()._train_epochs(seed, 10)
    want = np.concatenate([next(stream).ids[:, 0] for _ in range(9)])  # three epochs
    toy = _Toy()
    order = toy.train_order(batch, seed)
    got = np.concatenate([toy.read_train(order.next_batch()).ids[:, 0]
                          for _ in range(-(-30 // batch))])
    np.testing.assert_array_equal(got[:30], want)


def test_read_train_keeps_the_order_asked_and_the_last_two_chunks():
  toy = _Toy()
  got = toy.read_train(np.array([9, 0, 5, 1, 8]))
  np.testing.assert_array_equal(got.ids[:, 0], [9, 0, 5, 1, 8])
  np.testing.assert_array_equal(got.labels, np.float32([9 % 3 == 0, 1, 0, 0, 0]))
  assert toy.rows_read == 5 and toy.chunk_calls == 3
  toy.read_train(np.array([8, 9]))  # chunk 2: the last one drawn, kept
  assert toy.chunk_calls == 3
  toy.read_train(np.array([4]))  # chunk 1: kept with chunk 2 (chunk 0 was dropped first)
  assert toy.chunk_calls == 3
  toy.read_train(np.array([0]))  # chunk 0: drawn again
  assert toy.chunk_calls == 4 and toy.rows_read == 9
  assert toy.read_train(np.array([], np.int64)).ids.shape == (0, 1)


def test_the_oracle_holds_auc_and_logloss_per_split():
  toy = _Toy()
  toy.eval_splits = ("eval", "train")
  oracle = toy.oracle
  assert set(oracle) == {"eval", "train"}
  for split, n in (("eval", 6), ("train", 10)):
    rows = toy.generate_rows(split, 0, n)
    assert oracle[split] == {"auc": metrics.auc(rows.labels, rows.probs),
                             "logloss": metrics.logloss(rows.labels, rows.probs)}
  assert oracle["eval"] != oracle["train"]


def test_the_training_order_resumes_from_a_position():
  toy = _Toy()
  order = toy.train_order(3, 4)
  for _ in range(5):
    order.next_batch()
  resumed = toy.train_order(3, 4, order.position())
  for _ in range(6):
    np.testing.assert_array_equal(resumed.next_batch(), order.next_batch())
  assert not np.array_equal(toy.train_order(3, 4, order.position()).next_batch(),
                            toy.train_order(3, 4).next_batch())
