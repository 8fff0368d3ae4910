"""Tests for sfjax.embedding.packed_rows: rows stored at each table's own width."""

import chex
import numpy as np
import pytest

from sfjax.embedding import packed_rows as pr


def test_column_ranges_of_values_and_slot_groups():
  # D = 4 latent columns + 1 first-order column (E = 5).
  assert pr.column_ranges(2, 4, 5) == ((0, 2), (4, 5))
  assert pr.column_ranges(1, 4, 4) == ((0, 1),)  # no column past the latent ones
  assert pr.column_ranges(0, 4, 5) == ((0, 5),)  # the model's dim: every column
  assert pr.column_ranges(4, 4, 5) == ((0, 5),)
  assert pr.column_ranges(2, 4, 5, slot_groups=1) == ((0, 2), (4, 5))
  # adam / ftrl slots [m | v]: the value row's kept columns in each group; touching ranges merge.
  assert pr.column_ranges(2, 4, 5, slot_groups=2) == ((0, 2), (4, 7), (9, 10))
  assert pr.column_ranges(0, 4, 5, slot_groups=2) == ((0, 10),)
  assert pr.column_ranges(2, 4, 5, slot_groups=3) == ((0, 2), (4, 7), (9, 12), (14, 15))


def test_layout_sizes_offsets_and_bad_geometry():
  layout = pr.packed_layout([0, 10, 30], 50, 5, (((0, 2), (4, 5)), ((0, 5),), ((0, 1),)))
  chex.assert_trees_all_equal(layout.rows, np.array([10, 20, 20]))
  chex.assert_trees_all_equal(layout.widths, np.array([3, 5, 1]))
  chex.assert_trees_all_equal(layout.offsets, np.array([0, 30, 130]))
  assert layout.size == 150
  with pytest.raises(ValueError, match="ascend from 0"):
    pr.packed_layout([1, 10], 50, 5, (((0, 5),), ((0, 5),)))
  with pytest.raises(ValueError, match="ascend from 0"):
    pr.packed_layout([0, 60], 50, 5, (((0, 5),), ((0, 5),)))
  with pytest.raises(ValueError, match="2 column ranges for 3 tables"):
    pr.packed_layout([0, 10, 30], 50, 5, (((0, 5),), ((0, 5),)))
  with pytest.raises(ValueError, match=r"table 1's columns \(\(0, 6\),\) are outside \[0, 5\)"):
    pr.packed_layout([0, 10], 50, 5, (((0, 5),), ((0, 6),)))
  with pytest.raises(ValueError, match=r"table 0's columns \(\(0, 1\), \(2, 2\)\) are outside"):
    pr.packed_layout([0], 50, 5, (((0, 1), (2, 2)),))  # an empty range
  with pytest.raises(ValueError, match="ascend from 0 below 50"):
    pr.packed_layout([0, 50], 50, 5, (((0, 5),), ((0, 5),)))  # a table past the rows
  with pytest.raises(ValueError, match="ascend from 0 below 1"):
    pr.packed_layout([0, 1], 1, 5, (((0, 5),), ((0, 5),)))
  empty = pr.packed_layout([0, 10, 10], 20, 5, (((0, 1),), ((0, 2),), ((0, 3),)))  # no rows
  chex.assert_trees_all_equal((empty.rows, empty.offsets), (np.array([10, 0, 10]),
                                                            np.array([0, 10, 10])))


def _packed(fill=None):
  layout = pr.packed_layout([0, 10, 30], 50, 5, (((0, 2), (4, 5)), ((0, 5),), ((0, 1),)))
  fill = np.zeros((3, 5), np.float32) if fill is None else fill
  return pr.PackedRows(layout, np.zeros(layout.size, np.float32), fill)


def _dense_rows(fill, rng):
  """[50, 5] rows whose unkept columns hold each table's constant."""
  rows = rng.normal(size=(50, 5)).astype(np.float32)
  rows[:10, 2:4] = fill[0, 2:4]
  rows[30:, 1:] = fill[2, 1:]
  return rows


def test_put_take_round_trip_equals_a_dense_array_in_any_order():
  rng = np.random.default_rng(0)
  fill = np.arange(15, dtype=np.float32).reshape(3, 5)
  packed = _packed(fill)
  # Untouched rows read as zeros in their kept columns and the constant elsewhere.
  want = np.zeros((50, 5), np.float32)
  want[:10, 2:4] = fill[0, 2:4]
  want[30:, 1:] = fill[2, 1:]
  chex.assert_trees_all_equal(packed.read(0, 50), want)
  dense = want.copy()
  for _ in range(4):
    rows = _dense_rows(fill, rng)
    ids = rng.choice(50, 17, replace=False).astype(np.int64)
    packed.check(ids, rows[ids], "put", "values")
    packed.put(ids, rows[ids])
    dense[ids] = rows[ids]
    order = rng.permutation(50).astype(np.int64)
    chex.assert_trees_all_equal(packed.take(order), dense[order])
  chex.assert_trees_all_equal(packed.read(7, 33), dense[7:33])
  out = np.full((3, 5), -1.0, np.float32)
  packed.take(np.array([31, 2, 12]), out=out)
  chex.assert_trees_all_equal(out, dense[[31, 2, 12]])
  assert packed.nbytes == 150 * 4  # against 250 * 4 dense


def test_one_table_packs_too():
  layout = pr.packed_layout([0], 6, 3, (((0, 1), (2, 3)),))
  packed = pr.PackedRows(layout, np.zeros(layout.size, np.float32), np.zeros((1, 3)))
  rows = np.array([[1, 0, 2], [3, 0, 4]], np.float32)
  packed.check(np.array([4, 1]), rows, "put", "values")
  with pytest.raises(ValueError, match=r"put: values\[1, 1\] \(row id 1, table 0\) is 5.0"):
    packed.check(np.array([4, 1]), rows + np.array([0, 5, 0], np.float32) * [[0], [1]], "put",
                 "values")
  packed.put(np.array([4, 1]), rows)
  chex.assert_trees_all_equal(packed.take(np.array([1, 4, 0])),
                              np.array([[3, 0, 4], [1, 0, 2], [0, 0, 0]], np.float32))
  assert packed.nbytes == 12 * 4


def test_check_names_the_row_column_id_and_table_and_changes_nothing():
  rng = np.random.default_rng(1)
  fill = np.ones((3, 5), np.float32)
  packed = _packed(fill)
  rows = _dense_rows(fill, rng)
  ids = np.array([35, 3, 12], np.int64)
  bad = rows[ids].copy()
  bad[1, 3] = 0.5  # row id 3 (table 0) keeps columns 0, 1 and 4 only
  before = packed.buffer.copy()
  with pytest.raises(ValueError, match=r"^scatter: values\[1, 3\] \(row id 3, table 0\) is 0.5, but "
                                       r"that table stores 3 of 5 columns and column 3 must stay "
                                       r"1.0 \(a column past the table's dim\)$"):
    packed.check(ids, bad, "scatter", "values")
  chex.assert_trees_all_equal(packed.buffer, before)
  bad = rows[ids].copy()
  bad[0, 2] = 7.0  # row id 35: table 2 keeps column 0 only
  with pytest.raises(ValueError, match=r"values\[0, 2\] \(row id 35, table 2\) is 7.0"):
    packed.check(ids, bad, "scatter", "values")
  packed.check(ids, rows[ids], "scatter", "values")  # table 1 keeps everything: any values


def test_bad_buffer_or_fill_shapes_are_refused():
  layout = pr.packed_layout([0, 10], 20, 3, (((0, 1),), ((0, 3),)))
  with pytest.raises(ValueError, match="1-D of 40 elements"):
    pr.PackedRows(layout, np.zeros(39, np.float32), np.zeros((2, 3)))
  with pytest.raises(ValueError, match=r"fill must be \[2, 3\]"):
    pr.PackedRows(layout, np.zeros(40, np.float32), np.zeros((3, 3)))


def test_tables_keeping_the_same_columns_with_the_same_constant_share_one_run():
  ranges = (((0, 2),), ((0, 2),), ((0, 3),), ((0, 3),), ((0, 3),))
  layout = pr.packed_layout([0, 4, 6, 9, 10], 12, 3, ranges)
  fill = np.zeros((5, 3), np.float32)
  fill[4, 2] = 0.5  # the last table's constant differs: a run of its own
  packed = pr.PackedRows(layout, np.zeros(layout.size, np.float32), fill)
  chex.assert_trees_all_equal(packed.runs, np.array([0, 2, 4]))
  assert [b.shape for b in packed._blocks] == [(6, 2), (4, 3), (2, 3)]
  rng = np.random.default_rng(2)
  rows = rng.normal(size=(12, 3)).astype(np.float32)
  rows[:6, 2] = 0.0
  ids = rng.permutation(12).astype(np.int64)
  packed.check(ids, rows[ids], "put", "values")
  packed.put(ids, rows[ids])
  chex.assert_trees_all_equal(packed.read(0, 12), rows)
  order = rng.permutation(12).astype(np.int64)
  chex.assert_trees_all_equal(packed.take(order), rows[order])
  same = pr.PackedRows(layout, np.zeros(layout.size, np.float32), np.zeros((5, 3)))
  chex.assert_trees_all_equal(same.runs, np.array([0, 2]))


def test_one_run_checks_its_dropped_columns_too_and_names_the_table_at_its_start():
  layout = pr.packed_layout([0, 4], 8, 3, (((0, 1),), ((0, 1),)))  # one run: both keep column 0
  packed = pr.PackedRows(layout, np.zeros(layout.size, np.float32), np.zeros((2, 3)))
  assert packed.runs.size == 1
  good = np.array([[1.0, 0, 0], [2.0, 0, 0]], np.float32)
  packed.check(np.array([4, 0]), good, "scatter", "values")
  bad = good.copy()
  bad[0, 2] = 3.0
  with pytest.raises(ValueError, match=r"values\[0, 2\] \(row id 4, table 1\) is 3.0, but that "
                                       r"table stores 1 of 3 columns"):
    packed.check(np.array([4, 0]), bad, "scatter", "values")
  bad = good.copy()
  bad[1, 1] = -1.0
  with pytest.raises(ValueError, match=r"values\[1, 1\] \(row id 0, table 0\) is -1.0"):
    packed.check(np.array([4, 0]), bad, "scatter", "values")
  full = pr.packed_layout([0], 8, 3, (((0, 3),),))  # keeps everything: nothing to refuse
  pr.PackedRows(full, np.zeros(24, np.float32), np.zeros((1, 3))).check(
      np.array([1]), np.full((1, 3), 5.0, np.float32), "scatter", "values")


def test_rows_keep_the_buffers_dtype_and_its_rounded_constants():
  # Half-width values: the constant 0.1 becomes float16(0.1), which rows read back and pass.
  layout = pr.packed_layout([0, 3], 6, 2, (((0, 1),), ((0, 2),)))
  packed = pr.PackedRows(layout, np.zeros(layout.size, np.float16), np.full((2, 2), 0.1))
  rows = packed.take(np.array([0, 5, 2]))
  assert rows.dtype == np.float16 and packed.read(0, 6).dtype == np.float16
  assert rows[0, 1] == np.float16(0.1)
  rows[:, 0] = np.float16(0.5)
  packed.check(np.array([0, 5, 2]), rows, "scatter", "values")
  packed.put(np.array([0, 5, 2]), rows)
  chex.assert_trees_all_equal(packed.take(np.array([2, 0])), rows[[2, 0]])


def test_pack_sorted_keeps_each_rows_own_columns_and_unpack_restores_the_rows():
  rng = np.random.default_rng(3)
  fill = np.arange(15, dtype=np.float32).reshape(3, 5)
  layout = _packed(fill).layout  # tables [0, 10) keep 0, 1, 4; [10, 30) all; [30, 50) column 0
  rows = _dense_rows(fill, rng)
  ids = np.array([0, 3, 9, 10, 29, 30, 49], np.int64)  # both edges of every table
  flat = pr.pack_sorted(layout, fill, ids, rows[ids], "w")
  assert pr.packed_size(layout, ids) == flat.size == 3 * 3 + 2 * 5 + 2 * 1
  # Row after row, each row's kept columns in order.
  want = np.concatenate([rows[0, [0, 1, 4]], rows[3, [0, 1, 4]], rows[9, [0, 1, 4]], rows[10],
                         rows[29], rows[30, :1], rows[49, :1]])
  chex.assert_trees_all_equal(flat, want)
  chex.assert_trees_all_equal(pr.unpack_sorted(layout, fill, ids, flat, "r"), rows[ids])
  for chosen in (rng.choice(50, 23, replace=False), np.array([31]), np.arange(50)):
    ids = np.sort(chosen).astype(np.int64)
    flat = pr.pack_sorted(layout, fill, ids, rows[ids], "w")
    chex.assert_trees_all_equal(pr.unpack_sorted(layout, fill, ids, flat, "r"), rows[ids])
  empty = np.zeros((0,), np.int64)
  packed_empty = pr.pack_sorted(layout, fill, empty, rows[empty], "w")
  assert packed_empty.shape == (0,) and packed_empty.dtype == np.float32
  unpacked_empty = pr.unpack_sorted(layout, fill, empty, np.zeros(0, np.float32), "r")
  assert unpacked_empty.shape == (0, 5) and unpacked_empty.dtype == np.float32
  assert pr.unpack_sorted(layout, fill, ids, flat, "r").dtype == np.float32


def test_slot_groups_of_several_ranges_pack_and_store():
  # adam-like slots [m | v] of rows of 5 (4 latent): dim 2 keeps (0, 2), (4, 7), (9, 10).
  ranges = tuple(pr.column_ranges(d, 4, 5, slot_groups=2) for d in (2, 0, 1))
  assert ranges[0] == ((0, 2), (4, 7), (9, 10))
  layout = pr.packed_layout([0, 10, 30], 50, 10, ranges)
  fill = np.arange(30, dtype=np.float32).reshape(3, 10) / 10
  rng = np.random.default_rng(5)
  rows = rng.normal(size=(50, 10)).astype(np.float32)
  for t, (lo, hi) in enumerate(((0, 10), (10, 30), (30, 50))):
    dropped = np.ones(10, bool)
    for a, b in ranges[t]:
      dropped[a:b] = False
    rows[lo:hi, dropped] = fill[t, dropped]
  ids = np.array([1, 4, 9, 11, 31, 40], np.int64)
  flat = pr.pack_sorted(layout, fill, ids, rows[ids], "w")
  assert flat.size == 3 * 6 + 10 + 2 * 4
  chex.assert_trees_all_equal(flat[:6], rows[1, [0, 1, 4, 5, 6, 9]])
  chex.assert_trees_all_equal(pr.unpack_sorted(layout, fill, ids, flat, "r"), rows[ids])
  packed = pr.PackedRows(layout, np.zeros(layout.size, np.float32), fill)  # the same rows stored
  packed.put(ids, rows[ids])
  order = ids[::-1].copy()
  chex.assert_trees_all_equal(packed.take(order), rows[order])


def test_pack_sorted_refuses_a_value_it_would_drop_and_unsorted_or_outside_ids():
  fill = np.zeros((3, 5), np.float32)
  layout = _packed(fill).layout
  rows = np.zeros((3, 5), np.float32)
  rows[2, 3] = 0.5  # row id 12 keeps every column: fine; row id 31 keeps column 0 only
  pr.pack_sorted(layout, fill, np.array([2, 11, 12]), rows, "w")
  with pytest.raises(ValueError, match=r"f.npy: row id 31 \(table 2\) holds 0.5 in column 3, "
                                       r"past the table's 1 stored columns \(must be 0.0\)"):
    pr.pack_sorted(layout, fill, np.array([2, 30, 31]), rows, "f.npy")  # table 2's 2nd row
  for ids in ([12, 2], [2, 2], [-1, 2], [2, 50]):
    with pytest.raises(ValueError, match=r"w: row ids must ascend strictly inside \[0, 50\)"):
      pr.pack_sorted(layout, fill, np.array(ids), np.zeros((2, 5), np.float32), "w")
    with pytest.raises(ValueError, match=r"r: row ids must ascend strictly inside \[0, 50\)"):
      pr.unpack_sorted(layout, fill, np.array(ids), np.zeros(6, np.float32), "r")
  with pytest.raises(ValueError, match=r"f.npy: holds 5 values of shape \(5,\), the 2 rows' tables store 6"):
    pr.unpack_sorted(layout, fill, np.array([2, 5]), np.zeros(5, np.float32), "f.npy")
  with pytest.raises(ValueError, match=r"holds 6 values of shape \(2, 3\)"):
    pr.unpack_sorted(layout, fill, np.array([2, 5]), np.zeros((2, 3), np.float32), "f.npy")
