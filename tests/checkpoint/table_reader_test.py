"""Reading host-table checkpoints: every file verified, corrupt ones named, the wrong table refused."""

import io
import json

import numpy as np
import pytest

from sfjax.checkpoint import table_format, table_reader
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.core import digest
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable
from sfjax.embedding.initializers import TableInits

ROWS = 2 * CHUNK_ROWS + 5


def _table(num_rows=ROWS, seed=1):
  return HostTable.create_ram(num_rows, 3, 2, seed=seed, init_stddev=0.1,
                              initial_slot_row=np.array([0.5, 0.25], np.float32))


def _saved(directory, ids, value=1.0):
  """A base checkpoint in `directory` of a table with rows `ids` written; returns the table."""
  table = _table()
  ids = np.asarray(ids, np.int64)
  table.scatter(ids, np.full((ids.size, 3), value, np.float32),
                np.full((ids.size, 2), -value, np.float32))
  table_format.save_table(ChangeTracker(table), str(directory), None)
  return table


def test_corrupt_chunk_is_named(tmp_path):
  _saved(tmp_path / "c", [2])
  path = tmp_path / "c" / "chunk_00000000.npy"
  data = bytearray(path.read_bytes())
  data[-1] ^= 0xFF
  path.write_bytes(bytes(data))
  with pytest.raises(ValueError, match="chunk_00000000.npy: table checkpoint file is corrupt"):
    table_reader.load_table(_table(), str(tmp_path / "c"))
  with pytest.raises(ValueError, match="chunk_00000000.npy: table checkpoint file is corrupt"):
    table_reader.verify_table(str(tmp_path / "c"))  # checks without loading
  path.write_bytes(bytes(data[:100]))  # truncated
  with pytest.raises(ValueError, match="chunk_00000000.npy: .*size 100 vs"):
    table_reader.verify_table(str(tmp_path / "c"))
  path.unlink()
  with pytest.raises(ValueError, match="chunk_00000000.npy: unreadable"):
    table_reader.verify_table(str(tmp_path / "c"))


def test_verify_table_counts_good_chunks(tmp_path):
  _saved(tmp_path / "c", [2, CHUNK_ROWS + 1])
  assert table_reader.verify_table(str(tmp_path / "c")) == 2


def test_the_reader_returns_stored_rows_and_flags_per_chunk(tmp_path):
  table = _saved(tmp_path / "c", [2, CHUNK_ROWS + 1, 2 * CHUNK_ROWS + 4], value=3.0)
  reader = table_reader.TableReader(str(tmp_path / "c"))
  assert reader.chunks == (0, 1, 2) and reader.delta_chunks().tolist() == []
  values, slots, flags = reader.read(2)
  assert values.shape == (5, 3) and np.flatnonzero(flags).tolist() == [4]
  np.testing.assert_array_equal(values[4], table.gather(np.array([2 * CHUNK_ROWS + 4]))[0][0])
  assert slots[4].tolist() == [-3.0, -3.0] and not values[:4].any()  # unwritten rows: 0
  with pytest.raises(ValueError, match="chunk 3 is outside a table"):
    reader.read(3)


def test_refuses_another_table_or_a_used_one(tmp_path):
  table = _saved(tmp_path / "c", [2])
  with pytest.raises(ValueError, match="seed=1"):
    table_reader.load_table(_table(seed=2), str(tmp_path / "c"))
  with pytest.raises(ValueError, match="num_rows"):
    table_reader.load_table(_table(num_rows=10), str(tmp_path / "c"))
  with pytest.raises(ValueError, match="freshly created"):
    table_reader.load_table(table, str(tmp_path / "c"))
  manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
  assert manifest["chunks"]["0"]["file"] == "chunk_00000000.npy"
  (tmp_path / "c" / "manifest.json").write_text("{")
  with pytest.raises(ValueError, match="manifest.json: unreadable"):
    table_reader.load_table(_table(), str(tmp_path / "c"))


def _packed_saved(directory, ids):
  """A base checkpoint of a table of two tables of dims 1 and 2 (of 2 latent columns + a
  first-order one, adagrad slots) with rows `ids` written; returns the table."""
  tables = TableInits(np.array([0, 100]), np.array([0.1, 0.1]), np.full((2, 3), 0.5, np.float32),
                      np.array([1, 2]), 2)
  table = HostTable.create_ram(ROWS, 3, 3, seed=1, init_stddev=0.1,
                               initial_slot_row=np.full(3, 0.5, np.float32), tables=tables)
  ids = np.asarray(ids, np.int64)
  values, slots = table.gather(ids)
  table.scatter(ids, values + (values != 0), slots + 1.0 * np.array([1, 0, 1]))
  table_format.save_table(ChangeTracker(table), str(directory), None)
  return table


def _rewrite(directory, entry_of, array):
  """Replaces a checkpoint file with `array`, its manifest entry updated to match (a file
  that verifies but holds the wrong rows)."""
  manifest = json.loads((directory / "manifest.json").read_text())
  entry = entry_of(manifest)
  buf = io.BytesIO()
  np.save(buf, array)
  (directory / entry["file"]).write_bytes(buf.getvalue())
  entry.update(digest.bytes_digest(buf.getvalue()))
  (directory / "manifest.json").write_text(json.dumps(manifest))


def test_packed_rows_of_the_wrong_size_or_without_packed_tables_are_named(tmp_path):
  table = _packed_saved(tmp_path / "c", [3, 150])
  reader = table_reader.TableReader(str(tmp_path / "c"))
  values, slots, flags = reader.read(0)
  assert (values.dtype, slots.dtype, flags.dtype) == (np.float32, np.float32, np.bool_)
  np.testing.assert_array_equal(values[[3, 150]], table.gather(np.array([3, 150]))[0])
  np.testing.assert_array_equal(slots[[3, 150]], table.gather(np.array([3, 150]))[1])
  assert np.flatnonzero(flags).tolist() == [3, 150]
  stored = np.load(tmp_path / "c" / "chunk_00000000.npy")
  assert stored.shape == (2 + (2 + 2) + (3 + 3),)  # indices; dim 1 keeps 2 of 3, dim 2 all
  _rewrite(tmp_path / "c", lambda m: m["chunks"]["0"], stored[:-1])
  with pytest.raises(ValueError, match=r"/c/chunk_00000000.npy: holds 9 values, the packed "
                                       r"rows of its 2 row ids take 10"):
    table_reader.TableReader(str(tmp_path / "c")).read(0)
  _rewrite(tmp_path / "c", lambda m: m["chunks"]["0"], stored[:1])  # fewer than the indices
  with pytest.raises(ValueError, match=r"/c/chunk_00000000.npy: holds \(1,\) float32, expected "
                                       r"float32 \[2 \+ the packed rows\]"):
    table_reader.TableReader(str(tmp_path / "c")).read(0)
  _rewrite(tmp_path / "c", lambda m: m["chunks"]["0"], stored.astype(np.float64))
  with pytest.raises(ValueError, match=r"chunk_00000000.npy: holds \(12,\) float64, expected "):
    table_reader.TableReader(str(tmp_path / "c")).read(0)
  for indices in ([150, 3], [3, 3], [-1, 3], [3, CHUNK_ROWS], [3, 150.5]):
    bad = stored.copy()
    bad[:2] = indices  # out of order, repeated, outside the chunk, not an integer
    _rewrite(tmp_path / "c", lambda m: m["chunks"]["0"], bad)
    with pytest.raises(ValueError, match="/c/chunk_00000000.npy: row indices are not sorted"):
      table_reader.TableReader(str(tmp_path / "c")).read(0)
  _rewrite(tmp_path / "c", lambda m: m["chunks"]["0"], stored)
  manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
  manifest["tables"]["dims"] = [0, 0]  # a manifest whose tables store full rows
  (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=r"/c/manifest.json: holds packed rows, but the manifest's "
                                       r"tables all store full rows"):
    table_reader.TableReader(str(tmp_path / "c")).read(0)
  del manifest["tables"]["starts"]
  (tmp_path / "c" / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match=r"manifest.json: the table of packed rows is not "
                                       r"readable"):
    table_reader.TableReader(str(tmp_path / "c")).read(0)


def test_a_packed_delta_of_the_wrong_size_is_named(tmp_path):
  table = _packed_saved(tmp_path / "a", [3])
  tracker = ChangeTracker(table)
  tracker.pop_dirty_rows()  # saved in "a"
  values, slots = table.gather(np.array([150, 160]))
  table.scatter(np.array([150, 160]), values, slots + 1.0)
  manifest = table_format.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"))
  assert manifest["deltas"][0]["rows"]["packed"]
  stored = np.load(tmp_path / "b" / manifest["deltas"][0]["rows"]["file"])
  reader = table_reader.TableReader(str(tmp_path / "b"))
  got_values, got_slots, flags = reader.read(0)
  np.testing.assert_array_equal(got_slots[[150, 160]], slots + 1.0)
  assert np.flatnonzero(flags).tolist() == [3, 150, 160]
  _rewrite(tmp_path / "b", lambda m: m["deltas"][0]["rows"], stored[:-1])
  with pytest.raises(ValueError, match=r"/b/delta_000000_0000.rows.npy: holds \(11,\) float32, "
                                       r"expected \(12,\) float32"):
    table_reader.TableReader(str(tmp_path / "b")).read(0)


def test_a_chunk_only_deltas_wrote_and_a_version_1_chunk_read(tmp_path):
  table = _table()
  tracker = ChangeTracker(table)
  table.scatter(np.array([1]), np.ones((1, 3), np.float32), np.ones((1, 2), np.float32))
  table_format.save_table(tracker, str(tmp_path / "a"), None)  # a base of chunk 0
  at = np.array([2 * CHUNK_ROWS, 2 * CHUNK_ROWS + 3])  # chunk 2, of 5 rows: only in a delta
  table.scatter(at, np.full((2, 3), 2.0, np.float32), np.full((2, 2), 3.0, np.float32))
  manifest = table_format.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"))
  assert list(manifest["chunks"]) == ["0"] and manifest["deltas"]
  values, slots, flags = table_reader.TableReader(str(tmp_path / "b")).read(2)
  assert values.shape == (5, 3) and slots.shape == (5, 2) and values.dtype == np.float32
  assert flags.dtype == np.bool_ and flags.tolist() == [True, False, False, True, False]
  np.testing.assert_array_equal(values[[0, 3]], 2.0)
  np.testing.assert_array_equal(slots[[0, 3]], 3.0)
  assert not values[[1, 2, 4]].any() and not slots[[1, 2, 4]].any()
  # Version 1 wrote every row of a chunk, the last column the written flag.
  block = np.zeros((5, 3 + 2 + 1), np.float32)
  block[4] = [7, 8, 9, -1, -2, 1]
  _rewrite(tmp_path / "b", lambda m: m["chunks"].setdefault(
      "2", {"file": "chunk_00000002.npy", "bytes": 0, "crc32": 0}), block)
  manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
  manifest["deltas"] = []  # chunk 2 is the version 1 file alone
  (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
  values, slots, flags = table_reader.TableReader(str(tmp_path / "b")).read(2)
  assert flags.tolist() == [False] * 4 + [True]
  np.testing.assert_array_equal(values[4], [7, 8, 9])
  np.testing.assert_array_equal(slots[4], [-1, -2])
  with pytest.raises(ValueError, match=r"chunk 3 is outside a table of 131077 rows"):
    table_reader.TableReader(str(tmp_path / "b")).read(3)
  with pytest.raises(ValueError, match=r"chunk -1 is outside"):
    table_reader.TableReader(str(tmp_path / "b")).read(-1)


@pytest.mark.parametrize("ids", [[150, 160][::-1], [150, 150], [-1, 160], [150, ROWS]],
                         ids=["unsorted", "repeated", "negative", "past_the_table"])
def test_delta_row_ids_out_of_order_or_range_are_named(tmp_path, ids):
  table = _saved(tmp_path / "a", [3])
  tracker = ChangeTracker(table)
  tracker.pop_dirty_rows()
  table.scatter(np.array([150, 160]), np.ones((2, 3), np.float32), np.ones((2, 2), np.float32))
  table_format.save_table(tracker, str(tmp_path / "b"), str(tmp_path / "a"))
  table_reader.TableReader(str(tmp_path / "b"))  # as written: fine
  _rewrite(tmp_path / "b", lambda m: m["deltas"][0]["ids"], np.asarray(ids, np.int64))
  with pytest.raises(ValueError, match=r"/b/delta_000000_0000.ids.npy: row ids are not sorted, "
                                       rf"distinct and in \[0, {ROWS}\)"):
    table_reader.TableReader(str(tmp_path / "b"))
