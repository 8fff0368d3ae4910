"""Virtual Sparse Ids."""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sfjax.data.types import make_batch
from sfjax.embedding import vsi


@pytest.fixture
def calls(monkeypatch):
  """One entry per `np.unique` call from here on (the sort path)."""
  made = []
  real_unique = np.unique
  monkeypatch.setattr(np, "unique", lambda *a, **k: made.append(1) or real_unique(*a, **k))
  return made


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=60), st.integers(0, 5))
def test_dedup_reconstructs_ids(values, extra):
  ids = np.array(values, np.int64).reshape(-1, 1)
  out = vsi.dedup_ids(ids, capacity=len(set(values)) + extra, pad_id=-1)
  assert out.num_unique == len(set(values))
  assert out.vids.dtype == np.int32
  np.testing.assert_array_equal(out.uniq[out.vids], ids)  # 64-bit ids survive on the host
  assert (out.uniq[out.num_unique:] == -1).all()
  assert len(set(out.uniq[:out.num_unique].tolist())) == out.num_unique


def test_global_row_ids_and_capacity_error():
  ids = np.array([[0, 1], [2, 1]])
  g = vsi.global_row_ids(ids, np.array([0, 10]))
  np.testing.assert_array_equal(g, [[0, 11], [2, 11]])
  with pytest.raises(ValueError, match="unique_capacity"):
    vsi.dedup_ids(g, capacity=2, pad_id=99)


OFFSETS = np.array([0, 10, 30])  # fields of 10, 20 and (in a table of 35 rows) 5 rows


@pytest.mark.parametrize("bad,where,message", [
    (-7, (1, 1), "batch row 1, field 1: id -7 outside the field's rows [0, 20)"),
    (20, (0, 1), "batch row 0, field 1: id 20 outside the field's rows [0, 20)"),
    (10, (2, 0), "batch row 2, field 0: id 10 outside the field's rows [0, 10)"),
    (5, (1, 2), "batch row 1, field 2: id 5 outside the field's rows [0, 5)"),
])
def test_an_id_outside_its_field_is_never_wrapped_or_dropped(bad, where, message):
  """-7 in field 1 would read field 0's row 3; 20 field 2's row 0; 5 in the last field is
  past the table, which the device table's gathers fill with zeros and scatters drop."""
  ids = np.array([[1, 2, 3], [4, 5, 4], [9, 19, 0]])
  np.testing.assert_array_equal(vsi.global_row_ids(ids, OFFSETS, 35),
                                [[1, 12, 33], [4, 15, 34], [9, 29, 30]])
  ids[where] = bad
  with pytest.raises(vsi.IdRangeError) as info:
    vsi.global_row_ids(ids, OFFSETS, 35)
  assert str(info.value).startswith(message)
  assert (info.value.row, info.value.field, info.value.value) == (*where, bad)
  batch = make_batch(ids, np.zeros((3, 0)), [0, 1, 0])
  with pytest.raises(vsi.IdRangeError, match=re.escape(message)):
    vsi.prepare_batch(batch, OFFSETS, capacity=9, num_rows=35)


def test_without_the_table_size_the_last_field_is_only_bounded_below():
  ids = np.array([[0, 0, 10**12]])
  assert vsi.global_row_ids(ids, OFFSETS)[0, 2] == 10**12 + 30
  with pytest.raises(vsi.IdRangeError, match=r"field 2: id -1 outside the field's rows >= 0"):
    vsi.global_row_ids(np.array([[0, 0, -1]]), OFFSETS)
  np.testing.assert_array_equal(vsi.field_rows(OFFSETS, 35), [10, 20, 5])


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.uint32])
def test_narrow_ids_are_checked_and_widened_past_their_own_range(dtype):
  """int32 ids (as preprocessed shards and the block shuffle's batches hold them) plus
  offsets past 2**31 give int64 rows, never wrapped; other dtypes are made int64 first."""
  top = np.iinfo(dtype).max
  offsets = np.array([0, 2**33 + 5])
  ids = np.array([[top, 7], [0, top]], dtype)
  g = vsi.global_row_ids(ids, offsets)
  assert g.dtype == np.int64
  np.testing.assert_array_equal(g, [[top, 2**33 + 12], [0, 2**33 + 5 + int(top)]])
  if np.dtype(dtype).kind == "i":
    bad = np.array([[0, -1]], dtype)
    with pytest.raises(vsi.IdRangeError, match=r"field 1: id -1 outside"):
      vsi.global_row_ids(bad, offsets)
    np.testing.assert_array_equal(vsi.global_row_ids(bad, offsets, allow_padding=True),
                                  [[0, -1]])
  rows = np.array([int(top), 10])  # the first field ends at the dtype's largest id + 1
  with pytest.raises(vsi.IdRangeError, match=f"field 0: id {top} outside"):
    vsi.global_row_ids(ids, offsets, column_rows=rows)


def test_padding_ids_get_the_spare_entry_and_no_unique_row():
  ids = np.array([[3, -1, 3], [-1, -1, 7]], np.int64)
  out = vsi.dedup_ids(ids, capacity=3, pad_id=99)
  assert out.num_unique == 2 and out.has_padding
  np.testing.assert_array_equal(out.uniq, [3, 7, 99])
  np.testing.assert_array_equal(out.vids, [[0, 2, 0], [2, 2, 1]])
  with pytest.raises(ValueError, match=r"2 unique ids \+ 1 padding entry"):
    vsi.dedup_ids(ids, capacity=2, pad_id=99)  # no spare entry for the padding
  assert not vsi.dedup_ids(np.array([[3, 7]]), capacity=2, pad_id=99).has_padding


def test_global_row_ids_with_shared_tables_and_padding():
  offsets, rows = np.array([0, 4, 4]), np.array([4, 6, 6])  # columns 1, 2 share a table
  g = vsi.global_row_ids(np.array([[3, 5, -1]]), offsets, column_rows=rows, allow_padding=True)
  np.testing.assert_array_equal(g, [[3, 9, -1]])
  with pytest.raises(vsi.IdRangeError, match="field 2: id 6 outside the field's rows"):
    vsi.global_row_ids(np.array([[3, 5, 6]]), offsets, column_rows=rows, allow_padding=True)
  with pytest.raises(vsi.IdRangeError, match="id -1"):  # padding only where allowed
    vsi.global_row_ids(np.array([[3, 5, -1]]), offsets, column_rows=rows)
  with pytest.raises(vsi.IdRangeError, match="id -2"):
    vsi.global_row_ids(np.array([[3, -2, -1]]), offsets, column_rows=rows, allow_padding=True)


def test_prepare_batch_carries_weights_and_allows_padding_only_with_them():
  b = make_batch(np.array([[1, -1]]), np.zeros((1, 0)), [1.0], weights=np.array([[1.0, 0.0]]))
  db, n = vsi.prepare_batch(b, np.array([0, 0]), 3, 5, np.array([5, 5]))
  np.testing.assert_array_equal(db.weights, [[1.0, 0.0]])
  assert n == 1 and db.vids[0, 1] == 1 and db.rows[1] == 5
  with pytest.raises(vsi.IdRangeError):
    vsi.prepare_batch(b._replace(weights=None), np.array([0, 0]), 3, 5, np.array([5, 5]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 199), min_size=1, max_size=80),
       st.sampled_from([200, 257, 5000, 1 << 20]))
def test_unique_inverse_equals_a_sort_on_either_path(values, num_rows):
  ids = np.array(values, np.int64)
  want_u, want_i = np.unique(ids, return_inverse=True)
  uniq, inverse = vsi.unique_inverse(ids, num_rows)
  assert uniq.dtype == np.int64 and inverse.dtype.kind == "i"  # indices, on either path
  np.testing.assert_array_equal(uniq, want_u)
  np.testing.assert_array_equal(inverse, want_i)


def test_the_marker_pass_is_taken_for_small_tables_and_leaves_no_flags(calls):
  ids = np.array([[7, 3, 7], [0, 3, 9]], np.int64)
  out = vsi.dedup_ids(ids, capacity=6, pad_id=10, num_rows=10)
  assert not calls  # 10 rows <= 64 per id: no sort
  np.testing.assert_array_equal(out.uniq, [0, 3, 7, 9, 10, 10])
  np.testing.assert_array_equal(out.vids, [[2, 1, 2], [0, 1, 3]])
  again = vsi.dedup_ids(np.array([[1, 1]], np.int64), capacity=2, pad_id=10, num_rows=10)
  np.testing.assert_array_equal(again.uniq, [1, 10])  # no flag of the first call left behind
  vsi.dedup_ids(ids, capacity=6, pad_id=10)  # no table size: the sort
  big = vsi.dedup_ids(ids, capacity=6, pad_id=-1, num_rows=64 * ids.size + 1)  # too sparse
  assert len(calls) == 2
  np.testing.assert_array_equal(big.uniq[:4], out.uniq[:4])


def test_the_marker_pass_with_padding_and_an_id_past_the_table():
  ids = np.array([[4, -1, 2], [-1, 4, -1]], np.int64)
  out = vsi.dedup_ids(ids, capacity=3, pad_id=8, num_rows=8)
  np.testing.assert_array_equal(out.uniq, [2, 4, 8])
  np.testing.assert_array_equal(out.vids, [[1, 2, 0], [2, 1, 2]])
  assert out.has_padding
  with pytest.raises(IndexError):
    vsi.unique_inverse(np.array([1, 8, 3]), 8)
  uniq, _ = vsi.unique_inverse(np.array([5, 5]), 8)  # the failed call left no flags
  np.testing.assert_array_equal(uniq, [5])


def test_an_id_inside_the_scratch_rounding_is_still_past_the_table():
  for bad in (5, 7):  # 5 rows: the flags are rounded up to 8
    with pytest.raises(IndexError, match=f"index {bad} is out of bounds"):
      vsi.unique_inverse(np.array([1, bad, 3, 4, 0, 2, 1]), 5)
    uniq, inverse = vsi.unique_inverse(np.array([4, 0, 4, 0, 3, 1, 2]), 5)  # no flag left
    np.testing.assert_array_equal(uniq, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(inverse, [4, 0, 4, 0, 3, 1, 2])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.floats(0.0, 1.0), st.integers(0, 2**31))
def test_marked_flags_equal_flatnonzero(words, density, seed):
  flags = np.random.default_rng(seed).random(8 * words) < density
  np.testing.assert_array_equal(vsi._marked(flags), np.flatnonzero(flags))


def test_the_marker_scratch_is_per_thread():
  import threading
  results, errors = {}, []

  def work(k):
    try:
      rng = np.random.default_rng(k)
      for _ in range(50):
        n = 100 + 50 * k
        ids = rng.integers(0, n, 300)
        results.setdefault(k, []).append(
            all(np.array_equal(a, b) for a, b in zip(vsi.unique_inverse(ids, n),
                                                     np.unique(ids, return_inverse=True), strict=True)))
    except Exception as e:  # noqa: BLE001
      errors.append(e)

  threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and all(all(v) for v in results.values()) and len(results) == 4


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 99), min_size=1, max_size=120), st.sampled_from([16, 32, 64]))
def test_the_windowed_marker_pass_equals_a_sort(values, window):
  ids = np.array(values + [0, window - 1, window, 99], np.int64)  # the windows' edges
  uniq, inverse = vsi._windowed_marker_pass(ids, 100, window)
  want_u, want_i = np.unique(ids, return_inverse=True)
  assert uniq.dtype == np.int64 and inverse.dtype == np.int32
  np.testing.assert_array_equal(uniq, want_u)
  np.testing.assert_array_equal(inverse, want_i)


@pytest.mark.parametrize("num_rows,window", [(300 * 16, 16), (70_000, 1)])
def test_the_windowed_pass_with_hundreds_and_tens_of_thousands_of_windows(num_rows, window):
  # > 256 windows: 16-bit window numbers; > 65,536: int64 (a radix sort no longer applies).
  ids = np.random.default_rng(0).integers(0, num_rows, 40_000)
  ids[:3] = [num_rows - 1, 0, num_rows - 1]
  uniq, inverse = vsi._windowed_marker_pass(ids, num_rows, window)
  want_u, want_i = np.unique(ids, return_inverse=True)
  np.testing.assert_array_equal(uniq, want_u)
  np.testing.assert_array_equal(inverse, want_i)


def test_the_windowed_pass_refuses_ids_outside_the_table_and_leaves_no_flags():
  for bad in (100, 163, -1):
    with pytest.raises(IndexError, match=f"^index {bad} is out of bounds for axis 0 with "
                                         "size 100$"):
      vsi._windowed_marker_pass(np.array([3, bad, 40]), 100, 16)
  uniq, inverse = vsi._windowed_marker_pass(np.array([40, 3, 40, 99]), 100, 16)
  np.testing.assert_array_equal(uniq, [3, 40, 99])
  np.testing.assert_array_equal(inverse, [1, 0, 1, 2])


def test_tables_past_one_window_take_the_windowed_pass_up_to_its_rows_per_id(monkeypatch, calls):
  monkeypatch.setattr(vsi, "DENSE_MAX_ROWS", 16)
  ids = np.array([5, 17, 5, 90, 33, 17], np.int64)
  uniq, inverse = vsi.unique_inverse(ids, 100)  # 100 rows, 6 ids: 17 rows per id
  assert not calls
  np.testing.assert_array_equal(uniq, [5, 17, 33, 90])
  np.testing.assert_array_equal(inverse, [0, 1, 0, 3, 2, 1])
  assert inverse.dtype == np.int32
  edge = vsi.WINDOWED_ROWS_PER_ID * ids.size
  vsi.unique_inverse(ids, edge)  # exactly the limit: still the windowed pass
  assert not calls
  sparse_u, sparse_i = vsi.unique_inverse(ids, edge + 1)  # past it: the sort
  assert len(calls) == 1
  np.testing.assert_array_equal(sparse_u, uniq)
  np.testing.assert_array_equal(sparse_i, [0, 1, 0, 3, 2, 1])
  small_u, _ = vsi.unique_inverse(ids % 16, 16)  # one window: the plain marker pass
  assert len(calls) == 1
  np.testing.assert_array_equal(small_u, [1, 5, 10])


def test_unique_inverse_returns_int64_ids_and_flat_indices_for_any_input():
  ids = np.array([[7, 3], [7, 1]], np.int32)  # int32, two axes
  for num_rows in (None, 8):  # the sort and the marker pass
    uniq, inverse = vsi.unique_inverse(ids, num_rows)
    assert uniq.dtype == np.int64 and inverse.shape == (4,)
    np.testing.assert_array_equal(uniq, [1, 3, 7])
    np.testing.assert_array_equal(inverse, [2, 1, 2, 0])


def test_the_marker_pass_applies_up_to_exactly_its_rows_per_id(calls):
  ids = np.array([0, 9, 0], np.int64)
  vsi.unique_inverse(ids, vsi.DENSE_ROWS_PER_ID * ids.size)
  assert not calls
  vsi.unique_inverse(ids, vsi.DENSE_ROWS_PER_ID * ids.size + 1)
  assert len(calls) == 1


def test_the_windowed_pass_names_the_id_past_the_table_even_with_row_zero_present():
  with pytest.raises(IndexError, match="^index 120 is out of bounds"):
    vsi._windowed_marker_pass(np.array([0, 120, 5]), 100, 16)


def test_dedup_ids_types_and_its_capacity_message_in_full():
  plain = vsi.dedup_ids(np.array([[5, 2], [2, 5]], np.int64), capacity=3, pad_id=9, num_rows=10)
  assert plain.uniq.dtype == np.int64 and plain.vids.dtype == np.int32
  np.testing.assert_array_equal(plain.uniq, [2, 5, 9])
  padded = vsi.dedup_ids(np.array([[5, -1]], np.int64), capacity=2, pad_id=9, num_rows=10)
  assert padded.uniq.dtype == np.int64 and padded.vids.dtype == np.int32
  with pytest.raises(ValueError) as err:
    vsi.dedup_ids(np.array([[5, 2, 7]], np.int64), capacity=2, pad_id=9)
  assert str(err.value) == (
      "batch has 3 unique ids but embedding.unique_capacity is 2; raise "
      "embedding.unique_capacity (0 means batch_size * id columns, + 1 with bags)")


def test_padding_in_a_one_row_column_is_not_mistaken_for_an_id():
  g = vsi.global_row_ids(np.array([[0, -1], [-1, 0]]), np.array([0, 1]),
                         column_rows=np.array([1, 1]), allow_padding=True)
  np.testing.assert_array_equal(g, [[0, -1], [-1, 1]])


def test_prepare_batch_carries_the_batch_and_each_rows_table():
  b = make_batch(np.array([[1, 2], [0, 2]]), np.array([[0.5], [1.5]]), [1.0, 0.0])
  b = b._replace(mask=np.array([1.0, 0.0], np.float32))
  db, n = vsi.prepare_batch(b, np.array([0, 3]), 5, 6, table_starts=np.array([0, 3]))
  assert n == 3
  assert db.rows.dtype == np.int32
  np.testing.assert_array_equal(db.rows, [0, 1, 5, 6, 6])  # uniq, then the padding row V
  np.testing.assert_array_equal(db.vids, [[1, 2], [0, 2]])
  np.testing.assert_array_equal(db.dense, b.dense)
  np.testing.assert_array_equal(db.labels, b.labels)
  np.testing.assert_array_equal(db.mask, [1.0, 0.0])
  np.testing.assert_array_equal(db.row_tables, [0, 0, 1, 1, 1])
  assert vsi.prepare_batch(b, np.array([0, 3]), 5, 6)[0].row_tables is None


def test_prepare_batch_refuses_a_table_past_int32_rows(calls):
  b = make_batch(np.array([[1]]), np.zeros((1, 0)), [1.0])
  vsi.prepare_batch(b, np.array([0]), 1, 2**31 - 1)  # the largest that fits
  with pytest.raises(ValueError) as err:
    vsi.prepare_batch(b, np.array([0]), 1, 2**31)
  assert str(err.value) == ("table of 2147483648 rows does not fit int32 device indices; "
                            "use the cache backend, whose slots are int32")
  calls.clear()  # (the 2**31 - 1 row table above was sorted)
  vsi.prepare_batch(b, np.array([0]), 1, 8)  # the table's size reaches the dedup: no sort
  assert not calls


def test_narrow_ids_and_offsets_sum_in_64_bits():
  ids = np.array([[2**31 - 2, 5]], np.int32)
  offsets = np.array([0, 2**31 - 1], np.int32)
  g = vsi.global_row_ids(ids, offsets, column_rows=np.array([2**31 - 1, 10], np.int32))
  assert g.dtype == np.int64
  np.testing.assert_array_equal(g, [[2**31 - 2, 2**31 + 4]])


def test_unique_capacity_holds_every_id_and_the_padding_entry():
  assert vsi.unique_capacity(4096, 26, False) == 106_496
  assert vsi.unique_capacity(4096, 26, True) == 106_497
