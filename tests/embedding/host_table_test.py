"""Tests for sfjax.embedding.host_table."""

import json
import os
import re

import chex
import numpy as np
import pytest

from sfjax.embedding import device_table, row_dtype, row_optimizers
from sfjax.embedding.host_table import HostTable
from sfjax.embedding.initializers import init_rows

SEED, STD = 7, 0.05


def _kwargs(slot_width=3):
  return dict(seed=SEED, init_stddev=STD, initial_slot_row=np.arange(slot_width, dtype=np.float32) + 0.5)


def _tables(tmp_path, num_rows=50, width=4, slot_width=3):
  ram = HostTable.create_ram(num_rows, width, slot_width, **_kwargs(slot_width))
  mm = HostTable.create_mmap(str(tmp_path / "t"), num_rows, width, slot_width, **_kwargs(slot_width))
  return ram, mm


def test_untouched_rows_equal_init_rows_and_initial_slots(tmp_path):
  for table in _tables(tmp_path):
    ids = np.array([3, 0, 49, 3], np.int64)
    values, slots = table.gather(ids)
    chex.assert_trees_all_equal(values, init_rows(SEED, 0, ids, 4, STD))
    chex.assert_trees_all_equal(slots, np.tile(np.arange(3, dtype=np.float32) + 0.5, (4, 1)))
    assert values.dtype == np.float32 and slots.dtype == np.float32
    assert table.num_materialised == 0


def test_matches_reference_device_table_init(tmp_path):
  # The reference trainer initialises its device table with init_rows(seed, 0, arange(V), E, std).
  opt = row_optimizers.adagrad(0.1, 0.25)
  table = HostTable.create_ram(20, 5, opt.slot_width(5), seed=SEED, init_stddev=STD,
                               initial_slot_row=opt.initial_slot_row(5))
  values, slots = table.read_all()
  chex.assert_trees_all_equal(values, init_rows(SEED, 0, np.arange(20), 5, STD))
  chex.assert_trees_all_equal(slots, np.full((20, 5), 0.25, np.float32))


def test_scatter_gather_round_trip_ram_equals_mmap(tmp_path):
  rng = np.random.default_rng(0)
  ram, mm = _tables(tmp_path)
  for _ in range(3):
    ids = rng.choice(50, 12, replace=False).astype(np.int64)
    values = rng.normal(size=(12, 4)).astype(np.float32)
    slots = rng.normal(size=(12, 3)).astype(np.float32)
    for table in (ram, mm):
      table.scatter(ids, values, slots)
      got_v, got_s = table.gather(ids)
      chex.assert_trees_all_equal((got_v, got_s), (values, slots))
  chex.assert_trees_all_equal(ram.read_all(), mm.read_all())
  assert ram.num_materialised == mm.num_materialised > 12


def test_gather_returns_copies(tmp_path):
  for table in _tables(tmp_path):
    table.scatter(np.array([1]), np.ones((1, 4), np.float32), np.ones((1, 3), np.float32))
    values, _ = table.gather(np.array([1]))
    values[:] = 5.0
    assert (table.gather(np.array([1]))[0] == 1.0).all()


def test_out_of_range_ids_name_the_method_id_and_size(tmp_path):
  for table in _tables(tmp_path):
    with pytest.raises(ValueError, match=r"^gather: row id 50 out of range \[0, 50\) \(V = 50\)$"):
      table.gather(np.array([1, 50]))
    with pytest.raises(ValueError, match=r"^scatter: row id -1 out of range \[0, 50\) \(V = 50\)$"):
      table.scatter(np.array([-1]), np.zeros((1, 4), np.float32), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match=r"^load_rows: row id 50 out of range \[0, 50\) "):
      table.load_rows(np.array([50]), np.zeros((1, 4), np.float32), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="^gather: ids must be integers, got dtype float64$"):
      table.gather(np.array([1.0]))
    with pytest.raises(ValueError, match=r"^gather: ids must be 1-D \[N\], got shape \(2, 1\)$"):
      table.gather(np.array([[1], [2]]))


def test_unsigned_ids_read_like_signed_ones_up_to_the_int64_range(tmp_path):
  table, _ = _tables(tmp_path)
  table.scatter(np.array([3], np.uint64), np.ones((1, 4), np.float32), np.ones((1, 3), np.float32))
  got = table.gather(np.array([3, 1], np.uint64))
  chex.assert_trees_all_equal(got, table.gather(np.array([3, 1], np.int64)))
  assert got[0][0].tolist() == [1.0] * 4
  # Above int64: named as given, not wrapped to a negative id by the int64 cast.
  with pytest.raises(ValueError, match=r"^gather: row id 18446744073709551615 out of range "
                                       r"\[0, 50\)$"):
    table.gather(np.array([1, 2**64 - 1], np.uint64))
  with pytest.raises(ValueError, match=r"^gather: row id 9223372036854775807 out of range "
                                       r"\[0, 50\) \(V = 50\)$"):  # int64 max casts exactly
    table.gather(np.array([2**63 - 1], np.uint64))


def test_empty_ids_read_and_write_nothing(tmp_path):
  for table in _tables(tmp_path):
    values, slots = table.gather(np.zeros((0,), np.int32))
    assert values.shape == (0, 4) and slots.shape == (0, 3)
    assert values.dtype == np.float32 and slots.dtype == np.float32
    table.scatter(np.zeros((0,), np.int32), np.zeros((0, 4), np.float32),
                  np.zeros((0, 3), np.float32))
    table.load_rows(np.zeros((0,), np.uint32), np.zeros((0, 4)), np.zeros((0, 3)))
    assert table.num_materialised == 0 and table.written_ids().shape == (0,)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_bad_writes_leave_table_unchanged(tmp_path):
  for table in _tables(tmp_path):
    before = table.read_all()
    ids = np.array([1, 2], np.int64)
    good_v, good_s = np.ones((2, 4), np.float32), np.ones((2, 3), np.float32)
    nan_v = good_v.copy()
    nan_v[1, 2] = np.nan
    big_v = good_v.astype(np.float64)
    big_v[0, 3] = 1e39  # finite in float64, inf once stored as float32
    ids3, v3, s3 = np.array([5, 2, 5]), np.ones((3, 4), np.float32), np.ones((3, 3), np.float32)
    cases = [
        ((ids, nan_v, good_s), r"^scatter: values\[1, 2\] is nan \(not finite\)$"),
        ((ids, good_v, np.full((2, 3), np.inf, np.float32)),
         r"^scatter: slots\[0, 0\] is inf \(not finite\)$"),
        ((ids, big_v, good_s), r"^scatter: values\[0, 3\] is inf \(not finite\)$"),
        ((ids, good_v[:1], good_s), r"^scatter: values must have shape \(2, 4\), got \(1, 4\)$"),
        ((ids, good_v, good_s[:, :2]), r"^scatter: slots must have shape \(2, 3\), got \(2, 2\)$"),
        ((ids, good_v.astype(np.int32), good_s),
         "^scatter: values must be floating point, got dtype int32$"),
        ((np.array([1, 1]), good_v, good_s), "^scatter: row id 1 appears more than once$"),
        ((ids3, v3, s3), "^scatter: row id 5 appears more than once$"),
        ((np.array([1, 99]), good_v, good_s), "^scatter: row id 99 out of range"),
    ]
    for args, msg in cases:
      with pytest.raises(ValueError, match=msg):
        table.scatter(*args)
    chex.assert_trees_all_equal(table.read_all(), before)
    assert table.num_materialised == 0


def test_huge_mmap_table_is_sparse_and_survives_reopen(tmp_path):
  path = str(tmp_path / "huge")
  num_rows = 10**9
  table = HostTable.create_mmap(path, num_rows, 4, 4, **_kwargs(4))
  ids = np.array([0, 123_456_789, num_rows - 1], np.int64)
  values = np.arange(12, dtype=np.float32).reshape(3, 4)
  table.scatter(ids, values, -values)
  table.close()
  for name, row_bytes in (("values.npy", 4 * 4), ("slots.npy", 4 * 4), ("written.npy", 1 / 8)):
    st = os.stat(os.path.join(path, name))
    assert st.st_size >= num_rows * row_bytes  # Apparent size covers every row ...
    assert st.st_blocks * 512 < 1 << 20, name  # ... but under 1 MiB is allocated.
  reopened = HostTable.open_mmap(path)
  got_v, got_s = reopened.gather(ids)
  chex.assert_trees_all_equal((got_v, got_s), (values, -values))
  assert reopened.num_materialised == 3
  fresh = np.array([5, 999_999_999 - 1], np.int64)
  chex.assert_trees_all_equal(reopened.gather(fresh)[0], init_rows(SEED, 0, fresh, 4, STD))


def test_the_flags_of_rows_far_apart_fill_a_page_per_32768_rows(tmp_path):
  """64 rows 1,000 apart (a spread table's rows) get their flags in 2 pages of bits; version
  1's bytes took 16 pages (4,096 rows a page), and `gather` read each before the write."""
  path = str(tmp_path / "huge")
  table = HostTable.create_mmap(path, 10**9, 4, 1, **_kwargs(1))
  ids = np.arange(64, dtype=np.int64) * 1000 + 10**8
  table.scatter(ids, np.ones((64, 4), np.float32), np.ones((64, 1), np.float32))
  table.close()
  pages = os.stat(os.path.join(path, "written.npy")).st_blocks * 512 // 4096
  assert pages <= 2 + 4, pages  # + the header's page, the file system's extent blocks
  assert HostTable.open_mmap(path).written_ids().tolist() == ids.tolist()


def test_unflushed_table_recounts_materialised_rows(tmp_path):
  path = str(tmp_path / "t")
  table = HostTable.create_mmap(path, 30, 2, 0, seed=1, init_stddev=0.1, initial_slot_row=[])
  table.scatter(np.array([4, 9]), np.ones((2, 2), np.float32), np.zeros((2, 0), np.float32))
  for array in (table._values.buffer, table._flags):
    array.flush()  # Data reached the disk but flush() (metadata) never ran: a crash.
  with open(os.path.join(path, "meta.json")) as f:
    assert json.load(f)["clean"] is False
  reopened = HostTable.open_mmap(path)
  assert reopened.num_materialised == 2
  assert reopened.slot_width == 0 and reopened.gather(np.array([4]))[1].shape == (1, 0)


def test_reopen_validation_errors_name_the_file(tmp_path):
  path = str(tmp_path / "t")
  HostTable.create_mmap(path, 10, 2, 1, **_kwargs(1)).close()
  meta = os.path.join(path, "meta.json")
  original = open(meta).read()

  with open(meta, "w") as f:
    f.write("{not json")
  with pytest.raises(ValueError, match=f"{meta}: corrupt host table metadata"):
    HostTable.open_mmap(path)

  bad = json.loads(original)
  del bad["width"]
  with open(meta, "w") as f:
    json.dump(bad, f)
  with pytest.raises(ValueError, match="missing key 'width'"):
    HostTable.open_mmap(path)

  bad = json.loads(original)
  bad["num_rows"] = 11
  with open(meta, "w") as f:
    json.dump(bad, f)
  with pytest.raises(ValueError, match=r"values.npy: header says shape \(10, 2\)"):
    HostTable.open_mmap(path)

  with open(meta, "w") as f:
    f.write(original)
  np.lib.format.open_memmap(os.path.join(path, "written.npy"), "w+", np.uint8, (3,)).flush()
  with pytest.raises(ValueError, match=r"written.npy: header says shape \(3,\) dtype uint8, "
                     r"metadata expects shape \(2,\)"):
    HostTable.open_mmap(path)
  np.lib.format.open_memmap(os.path.join(path, "written.npy"), "w+", np.uint8, (2,)).flush()
  values = os.path.join(path, "values.npy")
  with open(values, "r+b") as f:
    f.truncate(os.path.getsize(values) - 4)
  with pytest.raises(ValueError, match="values.npy: file is .* bytes, expected"):
    HostTable.open_mmap(path)

  os.remove(values)
  with pytest.raises(FileNotFoundError, match="values.npy"):
    HostTable.open_mmap(path)
  os.remove(meta)
  with pytest.raises(FileNotFoundError, match="meta.json"):
    HostTable.open_mmap(path)


def test_create_refuses_existing_table_and_read_only_refuses_writes(tmp_path):
  path = str(tmp_path / "t")
  HostTable.create_mmap(path, 10, 2, 1, **_kwargs(1)).close()
  refusal = ": refusing to create a host table over an existing non-empty path; use " \
            "HostTable.open_mmap to reopen it"
  with pytest.raises(FileExistsError, match=f"^{re.escape(path + refusal)}$"):
    HostTable.create_mmap(path, 10, 2, 1, **_kwargs(1))
  a_file = str(tmp_path / "a_file")
  open(a_file, "w").close()
  with pytest.raises(FileExistsError, match=f"^{re.escape(a_file + refusal)}$"):
    HostTable.create_mmap(a_file, 10, 2, 1, **_kwargs(1))
  ro = HostTable.open_mmap(path, writable=False)
  with pytest.raises(PermissionError, match=f"^{re.escape(path)}: host table was opened read-only$"):
    ro.scatter(np.array([0]), np.zeros((1, 2), np.float32), np.zeros((1, 1), np.float32))
  ro.close()


def test_create_mmap_fills_an_existing_empty_directory(tmp_path):
  path = tmp_path / "empty"
  path.mkdir()
  with HostTable.create_mmap(str(path), 10, 2, 1, **_kwargs(1)) as table:
    table.scatter(np.array([4]), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))
  assert sorted(os.listdir(path)) == ["meta.json", "slots.npy", "values.npy", "written.npy"]
  assert HostTable.open_mmap(str(path)).written_ids().tolist() == [4]


@pytest.mark.parametrize("existing", [False, True])
def test_failed_create_mmap_removes_what_it_made(tmp_path, monkeypatch, existing):
  # ENOSPC on the second data file (slots.npy): values.npy and the directories it made go.
  real = np.lib.format.open_memmap
  parent = tmp_path / "a"
  path = parent / "b" / "table"
  if existing:
    path.mkdir(parents=True)

  def no_space(filename, *args, **kwargs):
    if os.path.basename(filename) == "slots.npy":
      open(filename, "wb").close()
      raise OSError(28, "No space left on device")
    return real(filename, *args, **kwargs)

  monkeypatch.setattr(np.lib.format, "open_memmap", no_space)
  with pytest.raises(OSError, match=f"^\\[Errno 28\\] {re.escape(str(path))}: cannot create the "
                     r"memory-mapped host table \(10 x 2 \+ 1 slots\): No space left on device; "
                     "removed what was created$"):
    HostTable.create_mmap(str(path), 10, 2, 1, **_kwargs(1))
  if existing:
    assert path.is_dir() and os.listdir(path) == []
  else:
    assert os.listdir(tmp_path) == []
  monkeypatch.setattr(np.lib.format, "open_memmap", real)
  with HostTable.create_mmap(str(path), 10, 2, 1, **_kwargs(1)) as table:  # not blocked
    assert table.num_materialised == 0
  assert parent.is_dir()


def test_failed_create_mmap_metadata_write_keeps_no_files(tmp_path, monkeypatch):
  def no_space(*args):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr("sfjax.embedding.host_table_files.write_meta", no_space)
  with pytest.raises(OSError, match="No space left on device; removed what was created$"):
    HostTable.create_mmap(str(tmp_path / "t"), 10, 2, 1, **_kwargs(1))
  assert os.listdir(tmp_path) == []


def test_rows_are_stored_as_float32(tmp_path):
  for table in _tables(tmp_path):
    table.scatter(np.array([1]), np.full((1, 4), 0.1), np.full((1, 3), 0.2))  # float64 in
    values, slots, flags = table.read_chunk(0)
    assert (values.dtype, slots.dtype, flags.dtype) == (np.float32, np.float32, np.bool_)
    assert values[1].tolist() == [float(np.float32(0.1))] * 4


def test_read_all_refuses_tables_over_max_rows(tmp_path):
  table, _ = _tables(tmp_path)
  chex.assert_trees_all_equal(table.read_all(max_rows=50), table.read_all())
  with pytest.raises(ValueError, match="^read_all: table has 50 rows > max_rows=49$"):
    table.read_all(max_rows=49)


def _recorder(table, seen):
  def observe(ids):
    assert table.lock._is_owned()  # called under the table's lock
    seen.append((ids.tolist(), table.gather(ids)[0].copy()))  # the rows before the write
  return observe


def test_write_observers_see_each_write_before_it_lands(tmp_path):
  for table in _tables(tmp_path, num_rows=20, width=2, slot_width=1):
    seen = []
    observe = _recorder(table, seen)
    table.add_write_observer(observe)
    ids = np.array([4, 2], np.int64)
    before = table.gather(ids)[0]
    table.scatter(ids, np.ones((2, 2), np.float32), np.ones((2, 1), np.float32))
    assert seen[0][0] == [4, 2]
    np.testing.assert_array_equal(seen[0][1], before)
    table.load_rows(np.array([7], np.int64), np.ones((1, 2), np.float32),
                    np.ones((1, 1), np.float32))  # a restore is not a write
    assert len(seen) == 1

    def refuse(ids):
      raise RuntimeError("full")

    table.add_write_observer(refuse)  # an observer that raises: no row changes
    with pytest.raises(RuntimeError, match="full"):
      table.scatter(np.array([9], np.int64), np.ones((1, 2), np.float32),
                    np.ones((1, 1), np.float32))
    assert table.num_materialised == 3
    table.remove_write_observer(refuse)
    table.remove_write_observer(observe)
    table.scatter(np.array([9], np.int64), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))
    assert len(seen) == 2 and table.written_ids().tolist() == [2, 4, 7, 9]


def test_written_ids_are_sorted_int64_from_row_zero(tmp_path):
  for table in _tables(tmp_path):
    table.scatter(np.array([49, 0, 17]), np.ones((3, 4), np.float32), np.ones((3, 3), np.float32))
    ids = table.written_ids()
    assert ids.dtype == np.int64 and ids.tolist() == [0, 17, 49]


def test_read_chunk_copies_one_chunk(tmp_path):
  from sfjax.embedding.host_table import CHUNK_ROWS
  src, _ = _tables(tmp_path, num_rows=CHUNK_ROWS + 10, width=2, slot_width=3)
  ids = np.array([1, CHUNK_ROWS + 9], np.int64)
  src.scatter(ids, np.full((2, 2), 3.0, np.float32), np.full((2, 3), 4.0, np.float32))
  assert src.chunk_range(1) == (CHUNK_ROWS, CHUNK_ROWS + 10)
  for k in (0, 1):
    values, slots, flags = src.read_chunk(k)
    assert values.shape == (CHUNK_ROWS if k == 0 else 10, 2) and flags.sum() == 1
    assert slots[flags].tolist() == [[4.0, 4.0, 4.0]]
    values[:] = 0.0  # a copy: the table is unchanged
  assert src.gather(ids)[0].tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_load_rows_restores_rows(tmp_path):
  table = HostTable.create_mmap(str(tmp_path / "t"), 1000, 2, 1, seed=0, init_stddev=0.1,
                                initial_slot_row=np.zeros(1, np.float32))
  table.load_rows(np.array([3, 900], np.int64), np.ones((2, 2), np.float32),
                  np.full((2, 1), 5.0, np.float32))
  values, slots = table.gather(np.array([3, 4, 900], np.int64))
  assert values[0].tolist() == [1.0, 1.0] and slots[2].tolist() == [5.0]
  assert table.num_materialised == 2
  bad_rows = [
      ((np.full((1, 2), np.nan), np.zeros((1, 1))), r"^load_rows: values\[0, 0\] is nan"),
      ((np.zeros((1, 3)), np.zeros((1, 1))),
       r"^load_rows: values must have shape \(1, 2\), got \(1, 3\)$"),
      ((np.zeros((1, 2)), np.zeros((1, 2))),
       r"^load_rows: slots must have shape \(1, 1\), got \(1, 2\)$"),
      ((np.zeros((1, 2)), np.zeros((1, 1), np.int64)),
       "^load_rows: slots must be floating point, got dtype int64$"),
  ]
  for (values, slots), msg in bad_rows:
    with pytest.raises(ValueError, match=msg):
      table.load_rows(np.array([5], np.int64), values, slots)
  assert table.num_materialised == 2 and table.written_ids().tolist() == [3, 900]
  table.close()


def _meta(path):
  with open(os.path.join(path, "meta.json")) as f:
    return json.load(f)


def _one_row(table, row_id):
  table.scatter(np.array([row_id]), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))


def test_meta_is_clean_exactly_when_every_write_is_flushed(tmp_path):
  path = str(tmp_path / "t")
  table = HostTable.create_mmap(path, 10, 2, 1, **_kwargs(1))
  assert _meta(path)["clean"] is True  # a new table is consistent on disk
  _one_row(table, 1)
  assert _meta(path)["clean"] is False
  table.close()
  assert (_meta(path)["clean"], _meta(path)["num_materialised"]) == (True, 1)

  table = HostTable.open_mmap(path)  # writable by default
  assert table.path == path
  _one_row(table, 2)  # the first write after a clean reopen marks the table unclean
  assert _meta(path)["clean"] is False
  table.flush()
  assert (_meta(path)["clean"], _meta(path)["num_materialised"]) == (True, 2)
  table.load_rows(np.array([3]), np.ones((1, 2), np.float32), np.ones((1, 1), np.float32))
  assert _meta(path)["clean"] is False  # a restore is a write too

  ro = HostTable.open_mmap(path, writable=False)  # the writer has not flushed: recount
  assert ro.num_materialised == 3 and ro.written_ids().tolist() == [1, 2, 3]
  ro.close()  # a read-only table never rewrites meta.json
  assert _meta(path)["clean"] is False
  table.close()
  assert (_meta(path)["clean"], _meta(path)["num_materialised"]) == (True, 3)


def test_clean_reopen_takes_the_stored_count_without_scanning(tmp_path):
  # The O(V) flag scan runs only after a crash; a clean table's count is read from meta.json.
  path = str(tmp_path / "t")
  with HostTable.create_mmap(path, 10, 2, 1, **_kwargs(1)) as table:
    _one_row(table, 1)
  meta = _meta(path)
  meta["num_materialised"] = 7
  with open(os.path.join(path, "meta.json"), "w") as f:
    json.dump(meta, f)
  assert HostTable.open_mmap(path, writable=False).num_materialised == 7


def test_ram_table_flush_and_close_are_no_ops():
  table = HostTable.create_ram(10, 2, 1, **_kwargs(1))
  _one_row(table, 1)
  table.flush()
  with table:
    assert table.gather(np.array([1]))[0].tolist() == [[1.0, 1.0]]
  assert table.path is None


def test_reopen_rejects_metadata_that_is_not_a_valid_spec(tmp_path):
  path = str(tmp_path / "t")
  HostTable.create_mmap(path, 10, 2, 1, **_kwargs(1)).close()
  meta_path = os.path.join(path, "meta.json")
  meta = _meta(path)
  meta["num_rows"] = 0
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  with pytest.raises(ValueError, match=f"^{re.escape(meta_path)}: corrupt host table metadata: "
                                       "HostTableSpec.num_rows must be an int >= 1, got 0$"):
    HostTable.open_mmap(path)


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_half_width_rows_halve_bytes_and_survive_reopen(tmp_path, name):
  dtype = row_dtype.row_dtype(name)
  opt = row_optimizers.sgd(0.1)  # no slots: the row is its values
  ram32 = HostTable.create_ram(20, 8, 0, seed=SEED, init_stddev=STD, initial_slot_row=[])
  ram = HostTable.create_ram(20, 8, 0, seed=SEED, init_stddev=STD, initial_slot_row=[],
                             dtype=name)
  assert ram.dtype == dtype and ram.nbytes - 20 == (ram32.nbytes - 20) // 2  # flags: 20 bytes
  values, _ = ram.read_all()  # initial rows: the device table's, rounded alike
  device, _ = device_table.init_table_host(20, 8, opt, seed=SEED, stddev=STD, dtype=dtype)
  assert values.dtype == dtype
  np.testing.assert_array_equal(values, device)
  mm = HostTable.create_mmap(str(tmp_path / "t"), 20, 8, 0, seed=SEED, init_stddev=STD,
                             initial_slot_row=[], dtype=name)
  assert isinstance(mm._values.buffer, np.memmap)  # a view of the file's bits that flush() reaches
  rows = np.full((2, 8), 0.1 + 1e-4, np.float32)  # float32 writes round to nearest
  for table in (ram, mm):
    table.scatter(np.array([3, 11]), rows, np.zeros((2, 0), np.float32))
  mm.close()
  assert _meta(tmp_path / "t")["dtype"] == name
  assert np.load(tmp_path / "t" / "values.npy").dtype == row_dtype.storage_dtype(dtype)
  reopened = HostTable.open_mmap(str(tmp_path / "t"))
  assert reopened.spec.dtype == name
  np.testing.assert_array_equal(reopened.read_all()[0], ram.read_all()[0])
  np.testing.assert_array_equal(reopened.gather([11])[0], rows[:1].astype(dtype))
  if name == "float16":  # finite in float32, beyond float16: refused, nothing written
    with pytest.raises(ValueError, match=r"scatter: values\[0, 0\] is inf"):
      reopened.scatter([4], np.full((1, 8), 1e5, np.float32), np.zeros((1, 0), np.float32))


@pytest.mark.parametrize("slot_row", [[0.1], [0.1] * 5, [0.0] * 5 + [0.1] * 5],
                         ids=["rowwise", "adagrad", "adam"])
def test_a_table_of_a_smaller_dim_stores_its_own_width_and_reads_like_a_full_one(tmp_path,
                                                                                 slot_row):
  # 4 latent columns + 1 first-order (E = 5); tables of dim 2, the model's (0) and 1.
  from sfjax.embedding.initializers import TableInits, init_table_rows  # pylint: disable=import-outside-toplevel
  e, s = 5, len(slot_row)
  slot_rows = np.tile(np.asarray(slot_row, np.float32), (3, 1))
  tables = TableInits(np.array([0, 10, 30]), np.array([0.1, 0.5, 0.02]), slot_rows,
                      np.array([2, 0, 1]), 4)
  kw = dict(seed=3, init_stddev=0.1, initial_slot_row=slot_row)
  plain = HostTable.create_ram(50, e, s, **kw, tables=tables._replace(dims=None))  # its size
  ram = HostTable.create_ram(50, e, s, **kw, tables=tables)
  mm = HostTable.create_mmap(str(tmp_path / "t"), 50, e, s, **kw, tables=tables)
  assert ram.spec.packed and mm.spec.packed and not plain.spec.packed
  kept = 10 * 3 + 20 * 5 + 20 * 2  # columns stored per table: dim + the first-order column
  slots_kept = kept * (s // e) if s > 1 else 50  # per-element slots pack alike, group by group
  assert ram.nbytes == kept * 4 + slots_kept * 4 + 50 < plain.nbytes
  ids = np.arange(50, dtype=np.int64)
  initial = init_table_rows(3, ids, e, tables)
  for table in (ram, mm):
    chex.assert_trees_all_equal(table.gather(ids), initial)
  assert (initial[0][:10, 2:4] == 0).all() and (initial[0][30:, 1:4] == 0).all()
  rng = np.random.default_rng(0)
  live = initial[0] != 0
  dense_values, dense_slots = initial[0].copy(), initial[1].copy()  # the reference: dense rows
  written = np.zeros(50, bool)
  for _ in range(3):
    at = rng.choice(50, 17, replace=False).astype(np.int64)
    values = np.where(live, rng.normal(size=(50, e)), 0.0).astype(np.float32)[at]
    slots = rng.random((50, s)).astype(np.float32)
    if s > 1:  # per-element slots: unread columns keep their initial value
      slots = np.where(np.tile(live, (1, s // e)), slots, initial[1])
    for table in (ram, mm):
      table.scatter(at, values, slots[at])
    dense_values[at], dense_slots[at], written[at] = values, slots[at], True
    order = rng.permutation(50).astype(np.int64)
    for table in (ram, mm):
      chex.assert_trees_all_equal(table.gather(order), (dense_values[order], dense_slots[order]))
      chunk_values, chunk_slots, flags = table.read_chunk(0)  # stored rows: the written ones
      chex.assert_trees_all_equal((chunk_values[written], chunk_slots[written], flags),
                                  (dense_values[written], dense_slots[written], written))
  assert ram.num_materialised == mm.num_materialised == written.sum()
  # A write that would drop a value is refused, naming it, and changes nothing.
  before = ram.read_all()
  bad = ram.gather(np.array([12, 4]))[0]
  bad[1, 3] = 0.25
  with pytest.raises(ValueError, match=r"scatter: values\[1, 3\] \(row id 4, table 0\) is 0.25"):
    ram.scatter(np.array([12, 4]), bad, ram.gather(np.array([12, 4]))[1])
  with pytest.raises(ValueError, match=r"load_rows: values\[1, 3\] \(row id 4, table 0\)"):
    ram.load_rows(np.array([12, 4]), bad, ram.gather(np.array([12, 4]))[1])
  chex.assert_trees_all_equal(ram.read_all(), before)
  if s > 1:
    bad_slots = ram.gather(np.array([33]))[1]
    bad_slots[0, 2] = 9.0  # table 2 keeps column 0 and the first-order column only
    with pytest.raises(ValueError, match=r"scatter: slots\[0, 2\] \(row id 33, table 2\) is 9.0"):
      ram.scatter(np.array([33]), ram.gather(np.array([33]))[0], bad_slots)
  # Reopened from its files, the packed table reads the same.
  mm.close()
  again = HostTable.open_mmap(str(tmp_path / "t"))
  assert again.spec == mm.spec
  chex.assert_trees_all_equal(again.read_all(), (dense_values, dense_slots))
  assert np.load(str(tmp_path / "t" / "values.npy")).shape == (kept,)
  meta = json.loads((tmp_path / "t" / "meta.json").read_text())
  assert meta["tables"]["dims"] == [2, 0, 1] and meta["tables"]["latent_dim"] == 4


def test_a_packed_half_width_table_keeps_its_dtype_in_ram_and_in_its_files(tmp_path):
  from sfjax.embedding.initializers import TableInits  # pylint: disable=import-outside-toplevel
  tables = TableInits(np.array([0, 10]), np.array([0.1, 0.1]), np.full((2, 1), 0.1, np.float32),
                      np.array([2, 0]), 4)
  kw = dict(seed=1, init_stddev=0.1, initial_slot_row=[0.1], tables=tables, dtype="bfloat16")
  ids = np.arange(20, dtype=np.int64)
  for table in (HostTable.create_ram(20, 5, 1, **kw),
                HostTable.create_mmap(str(tmp_path / "h"), 20, 5, 1, **kw)):
    values, slots = table.gather(ids)
    assert values.dtype == row_dtype.ROW_DTYPES["bfloat16"] and (values[:10, 2:4] == 0).all()
    flag_bytes = 20 if table.path is None else 3  # a bool each in RAM, a bit each in the file
    assert table.nbytes == (10 * 3 + 10 * 5) * 2 + 20 * 4 + flag_bytes  # 2-byte values, f32 slots
    values[3, 0] = 0.75
    table.scatter(ids, values, slots)
    chex.assert_trees_all_equal(table.gather(ids)[0].astype(np.float32), values.astype(np.float32))
  table.close()
  again = HostTable.open_mmap(str(tmp_path / "h"))
  chex.assert_trees_all_equal(again.gather(ids)[0].astype(np.float32), values.astype(np.float32))


def test_a_packed_load_refuses_a_dropped_slot():
  from sfjax.embedding.initializers import TableInits  # pylint: disable=import-outside-toplevel
  inits = TableInits(np.array([0, 10]), np.array([0.1, 0.1]), np.full((2, 5), 0.1, np.float32),
                     np.array([2, 0]), 4)
  table = HostTable.create_ram(20, 5, 5, seed=0, init_stddev=0.1, initial_slot_row=[0.1] * 5,
                               tables=inits)
  assert table.spec.table_inits().slot_rows.dtype == np.float32
  values, slots = table.gather(np.array([3]))
  slots[0, 2] = 0.5  # table 0 keeps slot columns 0, 1 and 4 only
  with pytest.raises(ValueError, match=r"^load_rows: slots\[0, 2\] \(row id 3, table 0\) is 0.5"):
    table.load_rows(np.array([3]), values, slots)
  assert table.num_materialised == 0
