"""Tests for sfjax.data.block_shuffle.order: each epoch a permutation, a pure function of
(seed, epoch), seekable from a JSON position, and mixed (rows, not only blocks)."""

import json

import numpy as np
import pytest

from sfjax.data.block_shuffle import BlockOrder


def _stream(order, batches):
  return np.concatenate([order.next_batch() for _ in range(batches)])


def _ranks(a):
  return np.argsort(np.argsort(a)).astype(np.float64)


@pytest.mark.parametrize("num_rows,block_rows,window_rows,batch_size", [
    (10_000, 100, 1000, 250),  # windows and batches divide the epoch
    (10_007, 128, 1000, 333),  # a short last block; windows of 8 blocks; batches straddle
    (5_000, 64, 10**6, 4096),  # one window holds the epoch; a batch straddles epochs
])
def test_each_epoch_is_a_permutation_and_epochs_differ(num_rows, block_rows, window_rows,
                                                       batch_size):
  order = BlockOrder(num_rows, block_rows, window_rows, seed=7, batch_size=batch_size)
  stream = _stream(order, -(-3 * num_rows // batch_size))
  epochs = [stream[e * num_rows:(e + 1) * num_rows] for e in range(3)]
  for epoch in epochs:
    np.testing.assert_array_equal(np.sort(epoch), np.arange(num_rows))
  assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
  again = _stream(BlockOrder(num_rows, block_rows, window_rows, 7, batch_size), 5)
  n = min(again.size, stream.size)
  np.testing.assert_array_equal(again[:n], stream[:n])  # reproducible from the seed
  other = _stream(BlockOrder(num_rows, block_rows, window_rows, 8, batch_size), 5)
  assert not np.array_equal(other, again)


def test_a_window_is_its_blocks_rows_permuted():
  order = BlockOrder(1000, 100, 300, seed=1, batch_size=10)  # windows of 3 blocks, 4 windows
  assert (order.window_blocks, order.num_windows) == (3, 4)
  blocks = order.window_blocks_of(0, 0)
  rows = (blocks[:, None] * 100 + np.arange(100)).reshape(-1)
  permutation = order.permutation(0, 0, 300)
  np.testing.assert_array_equal(order.window(0, 0), rows[permutation])
  np.testing.assert_array_equal(_stream(order, 30), rows[permutation])  # the stream starts there
  last_blocks = order.window_blocks_of(0, 3)
  assert last_blocks.size == 1 and order.window(0, 3).size == 100


@pytest.mark.parametrize("steps", [0, 1, 7, 40, 41, 95])
def test_seeking_to_a_position_equals_reading_from_the_start(steps):
  order = BlockOrder(4_099, 64, 500, seed=3, batch_size=100)  # ~41 batches an epoch
  for _ in range(steps):
    order.next_batch()
  saved = json.loads(json.dumps(order.position()))  # as a checkpoint's meta holds it
  assert saved["batches"] == steps and saved["examples"] == 100 * steps
  assert (saved["epoch"], saved["offset"]) == divmod(100 * steps, 4_099)
  resumed = BlockOrder(4_099, 64, 500, seed=3, batch_size=100, position=saved)
  for _ in range(60):  # across the next epoch boundary
    np.testing.assert_array_equal(resumed.next_batch(), order.next_batch())
  assert resumed.position() == order.position()


def test_a_position_of_another_order_is_refused():
  order = BlockOrder(1000, 100, 300, seed=0, batch_size=10)
  position = order.position()
  with pytest.raises(ValueError, match="'block_rows' is 100, this run's block shuffle has 50"):
    BlockOrder(1000, 50, 300, seed=0, batch_size=10, position=position)
  with pytest.raises(ValueError, match="field 'window_blocks' is 3"):
    BlockOrder(1000, 100, 600, seed=0, batch_size=10, position=position)
  with pytest.raises(ValueError, match="expected kind 'blocks', got 'shards'"):
    BlockOrder(1000, 100, 300, seed=0, batch_size=10, position={"kind": "shards"})
  with pytest.raises(ValueError, match="no examples"):
    BlockOrder(0, 100, 300, seed=0, batch_size=10)


def test_the_order_mixes_rows_not_only_blocks():
  """At the configured window the stream forgets the file order: the rank correlation of
  position and row is near 0 over the epoch and inside each window, consecutive examples
  are almost never neighbours in the file, and a batch draws on every block of its window."""
  n, block, window, batch = 65_536, 64, 4096, 512  # 1024 blocks, 64 per window
  epoch = _stream(BlockOrder(n, block, window, seed=0, batch_size=batch), n // batch)
  position = np.arange(n, dtype=np.float64)
  # Spearman's rho; its spread is ~1/sqrt(blocks) over the epoch, ~1/sqrt(rows) in a window.
  assert abs(np.corrcoef(position, _ranks(epoch))[0, 1]) < 0.1
  for w in range(0, n // window):
    within = _ranks(epoch[w * window:(w + 1) * window])  # rank among the window's rows
    assert abs(np.corrcoef(position[:window], within)[0, 1]) < 0.06
  adjacent = np.mean(np.abs(np.diff(epoch)) == 1)
  assert adjacent < 0.01, adjacent  # file order: 1.0; blocks shuffled alone: ~1 - 1/64
  per_batch = [np.unique(epoch[i:i + batch] // block).size for i in range(0, n, batch)]
  assert min(per_batch) >= 0.9 * (window // block), per_batch
  # The same statistics catch an order that only permutes blocks (the control).
  blocks_only = (np.random.default_rng(0).permutation(n // block)[:, None] * block
                 + np.arange(block)).reshape(-1)
  assert np.mean(np.abs(np.diff(blocks_only)) == 1) > 0.98


def test_the_smallest_orders_are_accepted_and_bad_sizes_named():
  one = BlockOrder(1, 1, 1, seed=0, batch_size=1)  # one example, blocks and batches of one
  assert [int(one.next_batch()[0]) for _ in range(3)] == [0, 0, 0]  # epoch after epoch
  small_window = BlockOrder(100, 64, 10, seed=0, batch_size=1)  # a window below one block
  assert small_window.window_blocks == 1 and small_window.num_windows == 2
  for block_rows, batch_size in ((0, 10), (10, 0)):
    with pytest.raises(ValueError, match=f"block_rows and batch_size must be >= 1, got "
                                         f"{block_rows}, {batch_size}"):
      BlockOrder(100, block_rows, 10, seed=0, batch_size=batch_size)


def test_a_position_that_is_not_a_mapping_is_named_by_its_type():
  with pytest.raises(ValueError, match="expected kind 'blocks', got 'list'"):
    BlockOrder(1000, 100, 300, seed=0, batch_size=10, position=["blocks"])
