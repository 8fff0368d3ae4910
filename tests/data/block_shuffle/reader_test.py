"""Tests for sfjax.data.block_shuffle.reader: reads by index equal a plain gather, a block
is copied once per epoch of the block shuffle, and the window stream equals the reads."""

import itertools
import threading

import numpy as np
import pytest

from sfjax.data import shards
from sfjax.data.block_shuffle import BlockOrder, BlockReader
from sfjax.data.block_shuffle import reader as reader_module
from sfjax.data.types import Batch, DatasetSpec, FieldSpec, concat_batches

_ROWS = 673  # 3 shards of 250, 250, 173: blocks of 64 straddle the shard boundaries


@pytest.fixture(scope="module")
def split(tmp_path_factory):
  spec = DatasetSpec(tuple(FieldSpec(f"C{i}", 1000) for i in range(3)), num_dense=2)
  rng = np.random.default_rng(0)
  chunk = Batch(rng.integers(0, 1000, (_ROWS, 3)), rng.random((_ROWS, 2), dtype=np.float32),
                (rng.random(_ROWS) < 0.3).astype(np.float32), np.ones(_ROWS, np.float32))
  directory = str(tmp_path_factory.mktemp("blocks") / "train")
  shards.write_split([chunk], directory, spec, rows_per_shard=250)
  return shards.ShardSplit(directory)


def _whole(split):
  """The split in file order, ids in the shards' dtype (int32 here): the reader's."""
  whole = concat_batches(list(split.chunks(1000)))
  return whole._replace(ids=whole.ids.astype(split.shard(0).ids.dtype))


def _same(a, b):
  for x, y in zip(a, b, strict=True):
    if x is None or y is None:
      assert x is y
      continue
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(x, y)


def _take(batch, indices):
  return Batch(*(None if a is None else a[indices] for a in batch))


def test_reads_by_index_equal_a_plain_gather(split):
  whole = _whole(split)
  reader = BlockReader(split, split.shard, block_rows=64, capacity=2)  # grows, evicts
  rng = np.random.default_rng(1)
  for size in (1, 50, 300, _ROWS, 40):
    indices = rng.integers(0, _ROWS, size)
    got = reader.read(indices)
    _same(got, _take(whole, indices))
    assert got.ids.dtype == np.int32 and got.ids.flags.owndata  # fresh, as stored
  assert reader.read(np.zeros(0, np.int64)).size == 0


def test_an_epoch_of_the_block_shuffle_copies_each_block_once(split):
  order = BlockOrder(_ROWS, 64, 192, seed=2, batch_size=50)  # windows of 3 blocks
  reader = BlockReader(split, split.shard, 64, capacity=2 * order.window_blocks + 1)
  whole = _whole(split)
  for step in range(1, 2 * _ROWS // 50 + 1):  # two epochs (less 23 examples)
    indices = order.next_batch()
    _same(reader.read(indices), _take(whole, indices))
    if step == _ROWS // 50:  # most of the first epoch: every block once, the last ones now
      assert order.num_blocks - order.window_blocks <= reader.blocks_loaded <= order.num_blocks
  assert reader.blocks_loaded <= 2 * order.num_blocks
  # Least recently read blocks make room: a read of at most 2 windows never grows it.
  assert reader.num_slots == 2 * order.window_blocks + 1


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("batch_size,window_rows", [(50, 192), (500, 128), (64, 10**6)])
def test_the_window_stream_equals_reading_the_order(split, batch_size, window_rows, ahead):
  stream = BlockReader(split, split.shard, 64, capacity=1).batches(
      BlockOrder(_ROWS, 64, window_rows, seed=4, batch_size=batch_size), ahead=ahead)
  order = BlockOrder(_ROWS, 64, window_rows, seed=4, batch_size=batch_size)
  whole = _whole(split)
  kept = []  # batches stay valid while later windows are read (fresh arrays, not the slots)
  for batch in itertools.islice(stream, -(-3 * _ROWS // batch_size)):  # three epochs
    assert batch.size == batch_size and (batch.mask == 1).all()
    kept.append((batch, order.next_batch()))
  for batch, indices in kept:
    _same(batch, _take(whole, indices))


def test_a_window_is_its_blocks_and_permutation(split):
  order = BlockOrder(_ROWS, 64, 192, seed=3, batch_size=50)  # windows of 3 blocks
  reader = BlockReader(split, split.shard, 64, capacity=1)
  whole = _whole(split)
  last = order.num_windows - 1  # 11 blocks: windows of 3, 3, 3, 2 (one short block)
  for w in (0, last):
    arrays = [None] * 4
    window = reader.window(order, 1, w, arrays)
    blocks = order.window_blocks_of(1, w)
    rows = (blocks[:, None] * 64 + np.arange(64)).reshape(-1)
    rows = rows[rows < _ROWS]
    assert window.arrays is arrays and window.rows == rows.size
    assert arrays[0].shape[0] == 192 and arrays[3] is None  # one window's capacity, no weights
    np.testing.assert_array_equal(arrays[0][:rows.size], whole.ids[rows])
    np.testing.assert_array_equal(arrays[2][:rows.size], whole.labels[rows])
    np.testing.assert_array_equal(rows[window.permutation], order.window(1, w))
  assert reader.window(order, 1, last, arrays).rows < 192  # the same arrays, reused


def test_reading_ahead_stops_its_thread_when_the_stream_is_closed(split):
  before = {t.name for t in threading.enumerate()}
  stream = BlockReader(split, split.shard, 64, capacity=1).batches(
      BlockOrder(_ROWS, 64, 128, seed=0, batch_size=32), ahead=True)
  next(stream)
  assert any(t.name.startswith("sfjax-block-window") for t in threading.enumerate())
  stream.close()
  assert not any(t.name.startswith("sfjax-block-window") and t.name not in before
                 for t in threading.enumerate())


@pytest.mark.parametrize("ahead", [False, True])
def test_a_failing_shard_read_reaches_the_reader_of_the_batches(split, ahead):
  def shard(index):
    if index == 2:
      raise shards.CorruptShardError("shard_00002.ids.npy", "CRC-32 mismatch")
    return split.shard(index)

  stream = BlockReader(split, shard, 64, capacity=1).batches(
      BlockOrder(_ROWS, 64, 128, seed=0, batch_size=32), ahead=ahead)
  with pytest.raises(shards.CorruptShardError, match="shard_00002.ids.npy: CRC-32 mismatch"):
    for _ in range(3 * _ROWS // 32):  # three epochs: shard 2 is read in each
      next(stream)


def test_block_rows_must_be_positive(split):
  with pytest.raises(ValueError, match="block_rows must be >= 1, got 0"):
    BlockReader(split, split.shard, 0, 1)


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("batch_size,window_rows", [(50, 192), (500, 128)])
def test_a_group_holds_the_batches_completed_in_its_window(split, batch_size, window_rows,
                                                           ahead):
  order = BlockOrder(_ROWS, 64, window_rows, seed=4, batch_size=batch_size)
  groups = BlockReader(split, split.shard, 64, capacity=1).batch_groups(
      BlockOrder(_ROWS, 64, window_rows, seed=4, batch_size=batch_size), ahead=ahead)
  stream = BlockReader(split, split.shard, 64, capacity=1).batches(
      BlockOrder(_ROWS, 64, window_rows, seed=4, batch_size=batch_size), ahead=ahead)
  done, rows = 0, 0  # batches completed so far, stream rows read so far
  for epoch, w in itertools.product(range(3), range(order.num_windows)):
    rows += order.window(epoch, w).size
    group = next(groups)
    assert len(group) == rows // batch_size - done  # those the window's rows complete
    done += len(group)
    for batch in group:
      _same(batch, next(stream))
  assert done == 3 * _ROWS // batch_size


@pytest.mark.parametrize("ahead", [False, True])
def test_groups_are_cut_at_group_rows_and_keep_the_stream(split, ahead):
  def order():
    return BlockOrder(_ROWS, 64, 192, seed=4, batch_size=50)

  groups = BlockReader(split, split.shard, 64, capacity=1).batch_groups(order(), ahead=ahead,
                                                                       group_rows=120)
  stream = BlockReader(split, split.shard, 64, capacity=1).batches(order(), ahead=ahead)
  lengths, done = [], 0
  while done < 3 * _ROWS // 50:  # three epochs
    group = next(groups)
    lengths.append(len(group))
    for batch in group:
      _same(batch, next(stream))
    done += len(group)
  assert max(lengths) == 2  # 120 rows: two batches of 50 at most
  # A window of 192 rows completes 3 or 4 batches: cut into a list of 2 and the rest.
  assert lengths.count(2) > len(lengths) // 2


def test_blocks_of_one_row_are_read_and_streamed(split):
  whole = _whole(split)
  reader = BlockReader(split, split.shard, block_rows=1, capacity=1)
  indices = np.random.default_rng(5).integers(0, _ROWS, 30)
  _same(reader.read(indices), _take(whole, indices))
  order = BlockOrder(_ROWS, 1, 16, seed=6, batch_size=7)  # windows of 16 one-row blocks
  stream = BlockReader(split, split.shard, 1, capacity=1).batches(
      BlockOrder(_ROWS, 1, 16, seed=6, batch_size=7))
  for batch in itertools.islice(stream, 2 * _ROWS // 7):  # two epochs
    _same(batch, _take(whole, order.next_batch()))


def test_a_group_holds_one_batch_when_group_rows_is_below_the_batch_size(split):
  groups = BlockReader(split, split.shard, 64, capacity=1).batch_groups(
      BlockOrder(_ROWS, 64, 192, seed=4, batch_size=50), group_rows=10)
  lengths = [len(next(groups)) for _ in range(30)]
  assert max(lengths) == 1 and sum(lengths) >= 20  # windows of 192 rows: 3-4 batches each


def test_gathers_capped_below_a_windows_batches_keep_the_stream(split, monkeypatch):
  # _GATHER_ROWS = 120: two batches of 50 per gather (not a whole number of batches).
  monkeypatch.setattr(reader_module, "_GATHER_ROWS", 120)
  order = BlockOrder(_ROWS, 64, 256, seed=8, batch_size=50)
  stream = BlockReader(split, split.shard, 64, capacity=1).batches(
      BlockOrder(_ROWS, 64, 256, seed=8, batch_size=50))
  whole = _whole(split)
  for batch in itertools.islice(stream, 2 * _ROWS // 50):
    _same(batch, _take(whole, order.next_batch()))


def test_the_default_reads_on_the_callers_thread_alone(split):
  before = threading.active_count()
  stream = BlockReader(split, split.shard, 64, capacity=1).batches(
      BlockOrder(_ROWS, 64, 128, seed=0, batch_size=32))
  for _ in range(3 * _ROWS // 32):  # three epochs
    next(stream)
  assert threading.active_count() == before
  assert not any(t.name.startswith("sfjax-block-window") for t in threading.enumerate())
