"""Row-sharded device table: its layout, the move between layouts, per-owner blocks of a
VSI batch, the blocked gather on 8 devices and the exchange bytes."""

import chex
import jax
import numpy as np
import pytest

from sfjax.core.types import DeviceBatch
from sfjax.embedding import cache as cache_lib
from sfjax.embedding import (
  device_table,
  row_optimizers,
  row_sharded_table,
  sharded_cache,
)
from sfjax.parallel import mesh as mesh_lib


def test_layout_pads_rows_that_do_not_split_evenly():
  assert row_sharded_table.table_layout(10, 4) == sharded_cache.SlotLayout(4, 3)  # 2 padding
  assert row_sharded_table.table_layout(8, 8) == sharded_cache.SlotLayout(8, 1)
  assert row_sharded_table.table_layout(5, 1) == sharded_cache.SlotLayout(1, 5)
  with pytest.raises(ValueError, match=r"rows \(0\) and devices \(4\)"):
    row_sharded_table.table_layout(0, 4)
  with pytest.raises(ValueError, match="int32"):
    row_sharded_table.table_layout(2**31, 2)


def test_rows_go_round_robin_and_come_back():
  layout = row_sharded_table.table_layout(10, 4)  # 4 devices x 3 rows
  logical = np.arange(10, dtype=np.float32)[:, None] + 1  # row r holds r + 1
  physical = row_sharded_table.to_physical(logical, layout)
  # device d (rows [3d, 3d+3)) holds rows d, d+4, d+8; padding rows (10, 11) are zeros
  np.testing.assert_array_equal(physical[:, 0], [1, 5, 9, 2, 6, 10, 3, 7, 0, 4, 8, 0])
  np.testing.assert_array_equal(row_sharded_table.to_logical(physical, layout, 10), logical)
  assert row_sharded_table.to_logical(physical, layout).shape == (12, 1)
  with pytest.raises(ValueError, match="13 rows do not fit a layout of 12"):
    row_sharded_table.to_physical(np.zeros((13, 1)), layout)
  with pytest.raises(ValueError, match=r"11 rows are not a layout of 12 \(4 x 3\)"):
    row_sharded_table.to_logical(np.zeros((11, 1)), layout)


def test_relayout_between_device_counts_and_the_replicated_table():
  logical = np.arange(1, 11, dtype=np.float32)[:, None]
  four, eight = row_sharded_table.table_layout(10, 4), row_sharded_table.table_layout(10, 8)
  whole = sharded_cache.SlotLayout(1, 10)
  on_four = row_sharded_table.to_physical(logical, four)
  on_eight = row_sharded_table.relayout(on_four, four, eight)  # 12 -> 16 rows
  np.testing.assert_array_equal(on_eight, row_sharded_table.to_physical(logical, eight))
  np.testing.assert_array_equal(row_sharded_table.relayout(on_eight, eight, whole), logical)
  np.testing.assert_array_equal(row_sharded_table.relayout(logical, whole, four), on_four)
  bad = row_sharded_table.to_physical(np.arange(1, 13, dtype=np.float32)[:, None], four)
  with pytest.raises(ValueError, match="nonzero rows past the 10 rows"):
    row_sharded_table.relayout(bad, four, whole)  # rows 10, 11 are not padding


def test_init_table_holds_the_device_tables_rows_on_their_owners():
  mesh = mesh_lib.make_mesh(8)
  opt = row_optimizers.adagrad(0.1, 0.5)
  layout = row_sharded_table.table_layout(21, 8)  # 3 rows per device, 3 padding rows
  table = row_sharded_table.init_row_sharded_table(21, 2, opt, seed=3, stddev=0.1, layout=layout,
                                       sharding=mesh_lib.rows_on_devices(mesh))
  ref = device_table.init_table(21, 2, opt, seed=3, stddev=0.1)
  for got, want in zip(table, ref, strict=True):
    shards = got.addressable_shards
    assert [s.data.shape[0] for s in shards] == [3] * 8
    for d, shard in enumerate(shards):  # device d: rows d, d + 8, d + 16 (if < 21)
      rows = np.arange(d, 24, 8)
      expected = np.where((rows < 21)[:, None], np.asarray(want)[np.minimum(rows, 20)], 0)
      np.testing.assert_array_equal(np.asarray(shard.data), expected)


def _vsi_batch(rows, vids, row_tables=None):
  n = len(vids)
  return DeviceBatch(np.asarray(rows, np.int32), np.asarray(vids, np.int32)[:, None],
                     np.zeros((n, 0), np.float32), np.zeros(n, np.float32),
                     np.ones(n, np.float32), None, row_tables)


def test_block_batch_puts_each_unique_row_in_its_owners_block():
  layout = row_sharded_table.table_layout(10, 4)  # 4 x 3; row r -> device r % 4, local r // 4
  # unique rows 9, 2, 4 (+ padding 10 10); examples read 2, 9, 4, 2
  db = _vsi_batch([9, 2, 4, 10, 10], [1, 0, 2, 1], row_tables=np.array([2, 0, 1, 0, 0]))
  got = row_sharded_table.block_batch(db, 3, layout, buckets=(1, 2, 3))
  # blocks of 1 row: device 0 holds row 4 (local 1), 1 holds row 9 (local 2), 2 holds row 2
  # (local 0), device 3 none (padding = C = 3)
  np.testing.assert_array_equal(got.rows, [1, 2, 0, 3])
  np.testing.assert_array_equal(got.vids[:, 0], [2, 1, 0, 2])  # rows 2, 9, 4, 2 again
  np.testing.assert_array_equal(got.row_tables, [1, 2, 0, 0])
  # A padding id (vid == U) reads a padding entry of the least busy block.
  padded = row_sharded_table.block_batch(_vsi_batch([9, 2, 4, 10], [1, 3, 0, 2]), 3, layout,
                                         (1, 2, 3))
  assert padded.rows[padded.vids[1, 0]] == 3  # local row C: reads zeros


def test_gather_blocks_reads_each_owners_rows_on_eight_devices():
  mesh = mesh_lib.make_mesh(8)
  layout = row_sharded_table.table_layout(40, 8)
  logical = np.arange(40 * 2, dtype=np.float32).reshape(40, 2)
  values = jax.device_put(row_sharded_table.to_physical(logical, layout),
                          mesh_lib.rows_on_devices(mesh))
  db = row_sharded_table.block_batch(_vsi_batch([5, 17, 33, 40], [0, 1, 2]), 3, layout,
                                     cache_lib.owner_buckets(8, 8))
  got = jax.jit(lambda v, r: row_sharded_table.gather_blocks(v, r, mesh))(values, db.rows)
  chex.assert_shape(got, (db.rows.shape[0], 2))
  np.testing.assert_array_equal(np.asarray(got)[db.vids[:, 0]], logical[[5, 17, 33]])


def test_exchange_bytes_by_hand():
  # 100 unique rows of 64 bytes over 8 devices: replicated all-reduce 2 * 7/8 * 100 * 64;
  # row blocks of ceil(100/8) = 13 rows: all_gather + psum_scatter 2 * 7 * 13 * 64.
  assert row_sharded_table.exchange_bytes(100, 64, 8, "replicated") == 11200
  assert row_sharded_table.exchange_bytes(100, 64, 8, "row") == 11648
  assert row_sharded_table.exchange_bytes(100, 64, 1, "row") == 0
  with pytest.raises(ValueError, match="unknown sharding 'col'"):
    row_sharded_table.exchange_bytes(1, 1, 2, "col")
