"""Reading host-table checkpoints: every file verified, corrupt ones named, the wrong table refused."""

import json

import numpy as np
import pytest

from sfjax.checkpoint import table_format, table_reader
from sfjax.checkpoint.change_tracking import ChangeTracker
from sfjax.embedding.host_table import CHUNK_ROWS, HostTable

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
