"""Writing host-table checkpoints: chunk bases + row deltas, hard links, copy-on-write capture.

Reading them back (verification, corrupt files, the wrong table) is table_reader_test.py.
"""

import json
import os

import chex
import numpy as np
import pytest

from sfjax.checkpoint import table_format as table_checkpoint
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.checkpoint.table_reader import load_table, verify_table
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable
from sfjax.embedding.initializers import TableInits

ROWS = 3 * CHUNK_ROWS + 5  # three full chunks and a short one


def _table(num_rows=ROWS, seed=1):
  return HostTable.create_ram(num_rows, 3, 2, seed=seed, init_stddev=0.1,
                              initial_slot_row=np.array([0.5, 0.25], np.float32))


def _tracked(table):
  """`table` with the change tracker a checkpointer would register on it."""
  return ChangeTracker(table)


def _write(table, ids, value):
  ids = np.asarray(ids, np.int64)
  table.scatter(ids, np.full((ids.size, 3), value, np.float32),
                np.full((ids.size, 2), -value, np.float32))


def test_round_trip_writes_only_chunks_with_rows(tmp_path):
  src = _table()
  _write(src, [0, 7, 3 * CHUNK_ROWS + 4], 1.5)
  manifest = table_checkpoint.save_table(_tracked(src), str(tmp_path / "c1"), None)
  assert sorted(manifest["chunks"]) == ["0", "3"]  # chunks 1 and 2 hold no written row
  assert sorted(os.listdir(tmp_path / "c1")) == ["chunk_00000000.npy", "chunk_00000003.npy",
                                                 "manifest.json"]
  dst = _table()
  assert load_table(dst, str(tmp_path / "c1")) == 2
  assert dst.num_materialised == 3
  ids = np.array([0, 7, 8, CHUNK_ROWS, 3 * CHUNK_ROWS + 4], np.int64)
  chex.assert_trees_all_equal(dst.gather(ids), src.gather(ids))


def test_unchanged_chunks_are_hard_links_of_the_previous_base(tmp_path):
  table = _table()
  tracker = _tracked(table)
  _write(table, [1, CHUNK_ROWS + 1], 1.0)
  table_checkpoint.save_table(tracker, str(tmp_path / "a"), None)
  _write(table, [CHUNK_ROWS + 2], 2.0)  # only chunk 1 changes
  # compact_ratio=0: any delta is "too big", so this is a base: chunk 1 rewritten, 0 linked
  manifest = table_checkpoint.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"),
                                         compact_ratio=0.0)
  assert manifest["deltas"] == []
  same = os.path.samefile(tmp_path / "a" / "chunk_00000000.npy", tmp_path / "b" / "chunk_00000000.npy")
  changed = os.path.samefile(tmp_path / "a" / "chunk_00000001.npy",
                             tmp_path / "b" / "chunk_00000001.npy")
  assert same and not changed
  for name in os.listdir(tmp_path / "a"):  # b is self-contained: a can be deleted
    os.remove(tmp_path / "a" / name)
  restored = _table()
  load_table(restored, str(tmp_path / "b"))
  ids = np.array([1, CHUNK_ROWS + 1, CHUNK_ROWS + 2, 5], np.int64)
  chex.assert_trees_all_equal(restored.gather(ids), table.gather(ids))


def test_deltas_hold_only_the_rows_written_since_the_previous_checkpoint(tmp_path):
  table = _table()
  tracker = _tracked(table)
  everywhere = np.append(np.arange(0, ROWS, 97), ROWS - 2).astype(np.int64)  # every chunk
  _write(table, everywhere, 1.0)
  base = table_checkpoint.save_table(tracker, str(tmp_path / "a"), None)
  assert len(base["chunks"]) == 4 and base["deltas"] == []
  _write(table, [5, 2 * CHUNK_ROWS + 9], 2.0)  # two rows in two chunks
  d1 = table_checkpoint.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"))
  assert [d["count"] for d in d1["deltas"]] == [2]  # 2 rows, not 2 chunks of 65,536
  ids_file = tmp_path / "b" / d1["deltas"][0]["ids"]["file"]
  np.testing.assert_array_equal(np.load(ids_file), [5, 2 * CHUNK_ROWS + 9])
  for key in base["chunks"]:  # the base is shared, not rewritten
    name = base["chunks"][key]["file"]
    assert os.path.samefile(tmp_path / "a" / name, tmp_path / "b" / name)
  _write(table, [5, ROWS - 1], 3.0)  # row 5 again (newest value wins) + a new row
  d2 = table_checkpoint.save_table(tracker, str(tmp_path / "c"), str(tmp_path / "b"))
  assert [d["count"] for d in d2["deltas"]] == [2, 2] and d2["delta_seq"] == 2
  assert verify_table(str(tmp_path / "c")) == 4 + 2 * 2
  for name in os.listdir(tmp_path / "a"):  # c is self-contained
    os.remove(tmp_path / "a" / name)
  restored = _table()
  restored_tracker = _tracked(restored)
  load_table(restored, str(tmp_path / "c"), restored_tracker)
  probe = np.concatenate([everywhere, [5, 6, 2 * CHUNK_ROWS + 9, ROWS - 1]])
  chex.assert_trees_all_equal(restored.gather(probe), table.gather(probe))
  assert restored.num_materialised == table.num_materialised
  # the chunks the deltas changed differ from the base: the next base must rewrite them
  assert restored_tracker.pop_dirty_chunks().tolist() == [0, 2, 3]
  assert restored_tracker.pop_dirty_rows().tolist() == []


def test_deltas_past_the_ratio_become_a_new_base(tmp_path):
  table = _table()
  tracker = _tracked(table)
  _write(table, [1], 1.0)
  table_checkpoint.save_table(tracker, str(tmp_path / "a"), None)  # base: one chunk
  _write(table, np.arange(10, 40000, dtype=np.int64), 2.0)  # 40k x 28 B > half of 1.57 MB
  manifest = table_checkpoint.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"))
  assert manifest["deltas"] == [] and list(manifest["chunks"]) == ["0"]
  restored = _table()
  load_table(restored, str(tmp_path / "b"))
  ids = np.arange(0, 40100, dtype=np.int64)
  chex.assert_trees_all_equal(restored.gather(ids), table.gather(ids))


def test_a_failed_save_keeps_its_rows_dirty(tmp_path):
  table = _table()
  tracker = _tracked(table)
  _write(table, [1, 2], 1.0)
  (tmp_path / "taken").mkdir()
  with pytest.raises(FileExistsError):
    table_checkpoint.save_table(tracker, str(tmp_path / "taken"), None)
  assert tracker.pop_dirty_rows().tolist() == [1, 2]
  assert tracker.pop_dirty_chunks().tolist() == [0]


def test_snapshot_is_the_table_at_plan_time_while_writes_go_on(tmp_path):
  table = _table()
  tracker = _tracked(table)
  _write(table, [1, CHUNK_ROWS + 1, 2 * CHUNK_ROWS + 1], 1.0)
  plan = table_checkpoint.plan_save(tracker, None)
  snapshot = tracker.begin_snapshot(plan.chunks, budget_bytes=1 << 30)
  before = table.gather(np.array([1, CHUNK_ROWS + 1, 2 * CHUNK_ROWS + 1, 7], np.int64))
  _write(table, [1, 7, CHUNK_ROWS + 1], 9.0)  # training goes on: copy on write
  assert snapshot.copies_made == 2  # chunks 0 and 1, each once
  table_checkpoint.write_table(snapshot, table, str(tmp_path / "s"), plan, None)
  snapshot.close()
  restored = _table()
  load_table(restored, str(tmp_path / "s"))
  chex.assert_trees_all_equal(
      restored.gather(np.array([1, CHUNK_ROWS + 1, 2 * CHUNK_ROWS + 1, 7], np.int64)), before)
  assert restored.num_materialised == 3
  assert tracker.pop_dirty_rows().tolist() == [1, 7, CHUNK_ROWS + 1]  # for the next checkpoint


@pytest.mark.parametrize("rows_fit", [True, False])  # rows copied at capture / copy-on-write
def test_a_captured_delta_is_the_table_at_capture_time(tmp_path, rows_fit):
  table = _table()
  tracker = _tracked(table)
  _write(table, np.arange(0, ROWS, 1000, dtype=np.int64), 1.0)
  table_checkpoint.save_table(tracker, str(tmp_path / "a"), None)
  _write(table, [3, CHUNK_ROWS + 3], 2.0)
  plan = table_checkpoint.plan_save(tracker, str(tmp_path / "a"))
  if rows_fit:
    plan, snapshot = table_checkpoint.capture(tracker, plan, 1 << 20)
  else:  # what `capture` opens for a delta larger than its budget
    snapshot = tracker.begin_snapshot(plan.chunks, budget_bytes=1 << 30)
  assert plan.kind == "delta" and (plan.gathered is not None) == rows_fit
  probe = np.array([3, 4, CHUNK_ROWS + 3, 1000], np.int64)
  before = table.gather(probe)
  _write(table, [3, 4, CHUNK_ROWS + 3], 9.0)  # training goes on
  table_checkpoint.write_table(snapshot, table, str(tmp_path / "b"), plan, str(tmp_path / "a"))
  snapshot.close()
  restored = _table()
  load_table(restored, str(tmp_path / "b"))
  chex.assert_trees_all_equal(restored.gather(probe), before)


def test_the_manifest_records_the_initial_slots_and_refuses_other_ones(tmp_path):
  table = _table()
  _write(table, [2], 1.0)
  manifest = table_checkpoint.save_table(_tracked(table), str(tmp_path / "c"), None)
  assert manifest["initial_slot_row"] == [0.5, 0.25]
  other = HostTable.create_ram(ROWS, 3, 2, seed=1, init_stddev=0.1,
                               initial_slot_row=np.array([0.5, 0.0], np.float32))
  with pytest.raises(ValueError, match=r"manifest.json: table checkpoint has initial_slot_row="):
    load_table(other, str(tmp_path / "c"))
  # A manifest written before the slots were recorded is still compatible.
  path = tmp_path / "c" / "manifest.json"
  old = json.loads(path.read_text())
  del old["initial_slot_row"]
  path.write_text(json.dumps(old))
  assert load_table(other, str(tmp_path / "c")) == 1


# Tables at their own width: 4 latent columns + a first-order one (E = 5); tables of dim 2,
# the model's (0) and 1, the first two straddling chunk boundaries.
_STARTS = np.array([0, CHUNK_ROWS - 3, 2 * CHUNK_ROWS + 10])
_DIMS = np.array([2, 0, 1])
_SLOTS = {"rowwise": [0.1], "adagrad": [0.1] * 5, "adam": [0.0] * 5 + [0.2] * 5}


def _packed_table(slot_row, dims=_DIMS):
  slot_rows = np.tile(np.asarray(slot_row, np.float32), (3, 1))
  slot_rows[1] *= 2  # each table its own initial slots
  tables = TableInits(_STARTS, np.array([0.1, 0.5, 0.02]), slot_rows, dims, 4)
  return HostTable.create_ram(ROWS, 5, len(slot_row), seed=3, init_stddev=0.1,
                              initial_slot_row=slot_row, tables=tables)


def _write_live(table, ids, rng):
  """Random values and slots at `ids`, their unread columns left at their constants."""
  ids = np.asarray(ids, np.int64)
  values, slots = table.gather(ids)
  dims = _DIMS[np.searchsorted(_STARTS, ids, side="right") - 1]
  live = np.ones(values.shape, bool)
  for row, d in enumerate(dims):
    live[row, d:4] = d == 0
  values = np.where(live, rng.normal(size=values.shape), 0.0).astype(np.float32)
  groups = slots.shape[1] // 5
  fresh = rng.random(slots.shape).astype(np.float32)
  slots = fresh if groups == 0 else np.where(np.tile(live, (1, groups)), fresh, slots)
  table.scatter(ids, values, slots)


@pytest.mark.parametrize("slot_row", list(_SLOTS.values()), ids=list(_SLOTS))
def test_a_packed_table_checkpoints_each_tables_own_width(tmp_path, slot_row):
  rng = np.random.default_rng(0)
  table = _packed_table(slot_row)
  tracker = _tracked(table)
  written = np.unique(np.concatenate([rng.choice(ROWS, 3000, replace=False),
                                      _STARTS, _STARTS[1:] - 1, [ROWS - 1]])).astype(np.int64)
  _write_live(table, written, rng)
  base = table_checkpoint.save_table(tracker, str(tmp_path / "a"), None)
  assert base["version"] == 3 and all(e["packed"] for e in base["chunks"].values())
  codec = table_checkpoint.row_codec(table.spec)
  for key, entry in base["chunks"].items():  # m indices + the rows' kept columns
    k = int(key)
    ids = written[written // CHUNK_ROWS == k]
    stored = np.load(tmp_path / "a" / entry["file"])
    assert entry["rows"] == ids.size and stored.shape == (ids.size + codec.size(ids),)
    if k == 3:  # table 2's rows only (dim 1): columns 0 and 4 of 5, slots alike
      per_row = 2 + {1: 1, 5: 2, 10: 4}[len(slot_row)]  # a row-wise accumulator: whole
      assert codec.size(ids) == ids.size * per_row
  # a delta of packed rows, then a base with it folded in
  _write_live(table, [1, CHUNK_ROWS - 4, CHUNK_ROWS - 3, 3 * CHUNK_ROWS + 4], rng)
  delta = table_checkpoint.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"))
  (rows_entry,) = [d["rows"] for d in delta["deltas"]]
  assert rows_entry["packed"]
  ids = np.load(tmp_path / "b" / delta["deltas"][0]["ids"]["file"])
  assert np.load(tmp_path / "b" / rows_entry["file"]).shape == (codec.size(ids),)
  for name, when in (("b", None), ("c", 0.0)):
    if when is not None:
      manifest = table_checkpoint.save_table(tracker, str(tmp_path / name), str(tmp_path / "b"),
                                             compact_ratio=when)
      assert manifest["deltas"] == []
    restored = _packed_table(slot_row)
    load_table(restored, str(tmp_path / name))
    chex.assert_trees_all_equal(restored.read_all(), table.read_all())
    assert restored.num_materialised == table.num_materialised


def test_packed_files_are_smaller_by_the_columns_they_leave_out(tmp_path):
  ids = np.arange(2 * CHUNK_ROWS + 10, 2 * CHUNK_ROWS + 2010, dtype=np.int64)  # table 2 only
  sizes = {}
  for name, dims in (("own", _DIMS), ("full", None)):  # the same rows, stored whole
    table = _packed_table(_SLOTS["adagrad"], dims)
    _write_live(table, ids, np.random.default_rng(1))
    manifest = table_checkpoint.save_table(_tracked(table), str(tmp_path / name), None)
    sizes[name] = manifest["chunks"]["2"]["bytes"]
  # 2000 rows: 2 of 5 value and 2 of 5 slot columns + the index, against 5 + 5 + 1.
  assert sizes["own"] < 2000 * 4 * 5 + 256 and sizes["full"] > 2000 * 4 * 11


def test_a_full_width_base_of_a_packed_table_reads_and_takes_packed_deltas(tmp_path, monkeypatch):
  rng = np.random.default_rng(2)
  table = _packed_table(_SLOTS["adam"])
  tracker = _tracked(table)
  _write_live(table, np.arange(0, ROWS, 101), rng)
  with monkeypatch.context() as m:  # the writer before packed files: full rows
    m.setattr(table_checkpoint, "row_codec", lambda spec: None)
    old = table_checkpoint.save_table(tracker, str(tmp_path / "a"), None)
  assert not any(e.get("packed") for e in old["chunks"].values())
  _write_live(table, [2, CHUNK_ROWS + 7], rng)
  new = table_checkpoint.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"))
  assert new["deltas"][0]["rows"]["packed"] and not new["chunks"]["0"].get("packed")
  restored = _packed_table(_SLOTS["adam"])
  load_table(restored, str(tmp_path / "b"))
  chex.assert_trees_all_equal(restored.read_all(), table.read_all())


@pytest.mark.parametrize("dims", [_DIMS, None], ids=["packed", "full"])
def test_a_delta_is_priced_at_the_bytes_it_stores(tmp_path, dims):
  rng = np.random.default_rng(4)
  table = _packed_table(_SLOTS["adagrad"], dims)
  tracker = _tracked(table)
  _write_live(table, np.arange(0, 3000, dtype=np.int64), rng)
  base = table_checkpoint.save_table(tracker, str(tmp_path / "a"), None)
  base_bytes = sum(e["bytes"] for e in base["chunks"].values())
  dirty = np.arange(3 * CHUNK_ROWS, 3 * CHUNK_ROWS + 5, dtype=np.int64)  # table 2: 4 of 10
  codec = table_checkpoint.row_codec(table.spec)
  assert (codec is None) == (dims is None)
  stored = 4 * 5 * 10 if codec is None else 4 * codec.size(dirty)
  assert codec is None or stored == 4 * 5 * 4
  for ratio, kind in (((8 * 5 + stored + 0.5), "delta"), ((8 * 5 + stored - 0.5), "base")):
    _write_live(table, dirty, rng)
    plan = table_checkpoint.plan_save(tracker, str(tmp_path / "a"), ratio / base_bytes)
    assert plan.kind == kind
    table_checkpoint.unplan_save(tracker, plan)


def test_encoding_a_dropped_value_names_the_file_and_row():
  table = _packed_table(_SLOTS["adagrad"])
  codec = table_checkpoint.row_codec(table.spec)
  ids = np.array([3, 5], np.int64)
  values, slots = table.gather(ids)
  codec.encode(ids, values, slots, "c/chunk_00000000.npy")
  values[1, 3] = 1.0  # table 0 has dim 2: column 3 is not stored
  with pytest.raises(ValueError, match=r"c/chunk_00000000.npy: row id 5 \(table 0\) holds 1.0 "
                                       r"in column 3"):
    codec.encode(ids, values, slots, "c/chunk_00000000.npy")
  values[1, 3] = 0.0
  slots[0, 2] = 7.0
  with pytest.raises(ValueError, match=r"c/d.rows.npy: row id 3 \(table 0\) holds 7.0 "
                                       r"in column 2"):
    codec.encode(ids, values, slots, "c/d.rows.npy")


def test_a_packed_half_width_table_round_trips_its_dtype(tmp_path):
  tables = TableInits(np.array([0, 100]), np.array([0.1, 0.1]), np.full((2, 5), 0.1, np.float32),
                      np.array([2, 0]), 4)

  def make():
    return HostTable.create_ram(300, 5, 5, seed=0, init_stddev=0.1, tables=tables,
                                initial_slot_row=np.full(5, 0.1, np.float32), dtype="bfloat16")

  table = make()
  ids = np.arange(0, 300, 7)
  values, slots = table.gather(ids)
  table.scatter(ids, values.astype(np.float32) * 3, slots + (values != 0).astype(np.float32))
  manifest = table_checkpoint.save_table(_tracked(table), str(tmp_path / "c"), None)
  assert manifest["dtype"] == "bfloat16" and all(e["packed"] for e in manifest["chunks"].values())
  restored = make()
  load_table(restored, str(tmp_path / "c"))
  assert restored.read_all()[0].dtype == table.read_all()[0].dtype != np.float32
  chex.assert_trees_all_equal(tuple(np.asarray(x, np.float32) for x in restored.read_all()),
                              tuple(np.asarray(x, np.float32) for x in table.read_all()))
