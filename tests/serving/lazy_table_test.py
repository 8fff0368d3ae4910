"""A lazy bundle table reads every row as the trainer's lazily initialised host table does."""

import numpy as np
import pytest

from sfjax.embedding import host_table_files
from sfjax.embedding.host_table import HostTable
from sfjax.embedding.initializers import TableInits
from sfjax.serving import lazy_table, row_source


def _host_table(tmp_path, tables=None, dtype="float32"):
  """A 10,000-row mmap host table (E = 5, S = 2) with 300 rows written."""
  table = HostTable.create_mmap(str(tmp_path / "host"), 10_000, 5, 2, seed=7, init_stddev=0.05,
                                initial_slot_row=[0.1, 0.0], tables=tables, dtype=dtype)
  rng = np.random.default_rng(0)
  ids = np.sort(rng.choice(10_000, 300, replace=False)).astype(np.int64)
  table.scatter(ids, rng.normal(size=(300, 5)), rng.normal(size=(300, 2)))
  return table


def _rule(table):
  meta = {"seed": table.spec.seed, "init_stddev": table.spec.init_stddev,
          "dtype": table.spec.dtype}
  if table.spec.tables is not None:
    meta["tables"] = host_table_files.tables_json(table.spec)
  return lazy_table.init_rule(meta, "host")


def _bundle_table(table, out, dtype="float32", per_block=64):
  ids = table.written_ids()
  blocks = [(ids[i:i + per_block], table.gather(ids[i:i + per_block])[0])
            for i in range(0, ids.size, per_block)]
  return lazy_table.write_lazy_table(str(out), blocks, table.num_rows, table.width, dtype,
                                     _rule(table))


@pytest.mark.parametrize("tables", [None, TableInits(np.asarray([0, 4_000]), np.asarray([0.05, 0.5]),
                                                     np.asarray([[0.1, 0.0], [0.2, 0.0]]))])
def test_lazy_rows_equal_the_host_tables_rows_bit_for_bit(tables, tmp_path, monkeypatch):
  monkeypatch.setattr(lazy_table, "WRITTEN_PER_FILE", 128)  # 300 written rows: 3 files
  host = _host_table(tmp_path, tables)
  entry = _bundle_table(host, tmp_path / "b")
  assert entry["written"]["rows"] == 300 and len(entry["chunks"]) == 3
  assert [c["written"] for c in entry["chunks"]] == [[0, 128], [128, 256], [256, 300]]
  written = host.written_ids()
  rows = np.concatenate([written[::7], np.arange(0, 10_000, 37), [9_999, 0, -1, written[0]]])
  assert np.isin(rows, written).any() and (~np.isin(rows[rows >= 0], written)).any()
  want = host.gather(np.maximum(rows, 0))[0]
  want[rows < 0] = 0.0  # padding reads zeros
  for mmap in (True, False):
    got = lazy_table.LazyRows(str(tmp_path / "b"), entry, mmap=mmap).gather(rows)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
  # Through open_rows, in each row mode (the cache returns device arrays).
  for kind in ("memory", "mmap", "cache"):
    source = row_source.open_rows(str(tmp_path / "b"), entry, kind, unique_capacity=rows.size)
    np.testing.assert_array_equal(np.asarray(source.gather(rows)), want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_lazy_rows_of_a_half_width_table_round_the_computed_rows_as_the_trainer(dtype, tmp_path):
  # A half-width run's table holds its initial rows rounded to that dtype: the rows the
  # bundle computes must be rounded alike (not the float32 init), the written ones as stored.
  host = _host_table(tmp_path, dtype=dtype)
  entry = _bundle_table(host, tmp_path / "b")
  rows = np.arange(0, 10_000, 13)
  want = np.asarray(host.gather(rows)[0], np.float32)
  assert (~np.isin(rows, host.written_ids())).any()
  got = lazy_table.LazyRows(str(tmp_path / "b"), entry, mmap=True).gather(rows)
  np.testing.assert_array_equal(got, want)


def test_int8_stores_written_rows_quantized_and_computes_the_others_exactly(tmp_path):
  host = _host_table(tmp_path)
  entry = _bundle_table(host, tmp_path / "b", dtype="int8")
  assert all("scales" in c for c in entry["chunks"])
  source = lazy_table.LazyRows(str(tmp_path / "b"), entry)
  written = host.written_ids()
  fresh = np.setdiff1d(np.arange(100), written)
  np.testing.assert_array_equal(source.gather(fresh), host.gather(fresh)[0])
  got, want = source.gather(written), host.gather(written)[0]
  assert not np.array_equal(got, want)  # stored as int8 codes
  np.testing.assert_allclose(got, want, atol=np.abs(want).max() / 127)


def test_no_written_rows_and_bad_ids(tmp_path):
  rule = {"rule": "init_rows", "seed": 1, "stddev": 0.1}
  entry = lazy_table.write_lazy_table(str(tmp_path / "a"), [], 50, 3, "float32", rule)
  assert entry["written"]["rows"] == 0 and entry["chunks"] == []
  rows = np.arange(50)
  np.testing.assert_array_equal(lazy_table.LazyRows(str(tmp_path / "a"), entry).gather(rows),
                                lazy_table.initial_rows(rule, rows, 3))
  values = np.zeros((2, 3), np.float32)
  with pytest.raises(ValueError, match="written row ids must ascend within \\[0, 50\\)"):
    lazy_table.write_lazy_table(str(tmp_path / "b"), [(np.asarray([3, 2]), values)], 50, 3,
                                "float32", rule)
  with pytest.raises(ValueError, match="written row ids must ascend"):
    lazy_table.write_lazy_table(str(tmp_path / "c"), [(np.asarray([3, 50]), values)], 50, 3,
                                "float32", rule)
  with pytest.raises(ValueError, match="ckpt/table: the table manifest does not give the "
                                       "initial-row rule"):
    lazy_table.init_rule({"seed": 1}, "ckpt/table")
