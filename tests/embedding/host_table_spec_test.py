"""Tests for sfjax.embedding.host_table_spec: validation, meta.json's spec, the packing."""

import json

import chex
import numpy as np
import pytest

from sfjax.embedding import packed_rows
from sfjax.embedding.host_table import HostTable
from sfjax.embedding.host_table_spec import (
  HostTableSpec,
  array_shapes,
  row_stores,
  spec_from_args,
  spec_from_meta,
)
from sfjax.embedding.initializers import TableInits


@pytest.mark.parametrize("args, msg", [
    ((10, 2, 3, 0.1, [0.0, 1.0]), "initial_slot_row has 2 values, slot_width is 3"),
    ((0, 2, 0, 0.1, []), "num_rows must be an int >= 1, got 0"),
    ((10, 0, 0, 0.1, []), "width must be an int >= 1, got 0"),
    ((10, 2, -1, 0.1, []), "slot_width must be an int >= 0, got -1"),
    ((10, 2, 0, float("inf"), []), "init_stddev must be finite and >= 0, got inf"),
    ((10, 2, 0, -0.5, []), "init_stddev must be finite and >= 0, got -0.5"),
    ((10, 2, 1, 0.1, [np.nan]), r"initial_slot_row must be finite, got \(nan,\)"),
])
def test_bad_spec_rejected(args, msg):
  num_rows, width, slot_width, std, row = args
  with pytest.raises(ValueError, match=f"^HostTableSpec.{msg}$"):
    HostTable.create_ram(num_rows, width, slot_width, seed=0, init_stddev=std, initial_slot_row=row)


def test_smallest_spec_and_zero_stddev_are_accepted():
  table = HostTable.create_ram(1, 1, 0, seed=0, init_stddev=0.0, initial_slot_row=[])
  values, slots = table.read_all()
  chex.assert_trees_all_equal((values, slots), (np.zeros((1, 1), np.float32),
                                                np.zeros((1, 0), np.float32)))


def test_initial_slot_row_is_flattened_and_rounded_to_float32():
  table = HostTable.create_ram(4, 2, 3, seed=0, init_stddev=0.1,
                               initial_slot_row=np.array([[0.1, 0.2, 0.3]]))  # [1, S]
  as_f32 = np.array([0.1, 0.2, 0.3], np.float32)
  assert table.spec.initial_slot_row == tuple(float(v) for v in as_f32) != (0.1, 0.2, 0.3)
  chex.assert_trees_all_equal(table.gather(np.array([2]))[1], as_f32[None])


def test_unknown_row_dtype_is_refused_naming_the_field():
  with pytest.raises(ValueError, match="HostTableSpec.dtype: unknown row dtype 'int8'"):
    HostTable.create_ram(4, 2, 0, seed=0, init_stddev=0.1, initial_slot_row=[], dtype="int8")


def test_table_dims_are_checked():
  tables = ((0, 10), (0.1, 0.1), ((0.1,) * 5, (0.1,) * 5))
  base = dict(num_rows=20, width=5, slot_width=5, seed=0, init_stddev=0.1,
              initial_slot_row=(0.1,) * 5, tables=tables)
  with pytest.raises(ValueError, match=r"^HostTableSpec.table_dims must give one dim per table "
                                       r"of `tables`, got \(2,\)$"):
    HostTableSpec(**base, table_dims=(2,), latent_dim=4)
  with pytest.raises(ValueError, match="one dim per table"):
    HostTableSpec(**{**base, "tables": None}, table_dims=(2, 0), latent_dim=4)
  for dims, latent in (((2, -1), 4), ((2, 0), 0), ((2, 0), 6)):
    with pytest.raises(ValueError, match=r"need dims >= 0 and a latent_dim in \[1, 5\]"):
      HostTableSpec(**base, table_dims=dims, latent_dim=latent)
  assert HostTableSpec(**base, table_dims=(2, 0), latent_dim=4).packed
  assert not HostTableSpec(**base, table_dims=(4, 0), latent_dim=4).packed  # the model's dim


def _inits(dims, slot_width):
  return TableInits(np.array([0, 6, 10]), np.array([0.1, 0.2, 0.3]),
                    np.tile(np.arange(slot_width, dtype=np.float32) + 0.5, (3, 1)),
                    np.array(dims), 4)


def test_make_spec_records_tables_as_tuples_and_the_dtype_by_name():
  spec = spec_from_args(12, 5, 5, 3, 0.1, np.full((1, 5), 0.1), _inits([2, 0, 4], 5),
                        np.dtype("float16"))
  assert spec.tables == ((0, 6, 10), (0.1, 0.2, 0.3), ((0.5, 1.5, 2.5, 3.5, 4.5),) * 3)
  assert (spec.table_dims, spec.latent_dim, spec.dtype) == ((2, 0, 4), 4, "float16")
  assert spec.initial_slot_row == (float(np.float32(0.1)),) * 5
  back = spec.table_inits()
  chex.assert_trees_all_equal((back.starts, back.dims, back.slot_rows.shape, back.latent_dim),
                              (np.array([0, 6, 10]), np.array([2, 0, 4]), (3, 5), 4))
  plain = spec_from_args(12, 5, 0, 3, 0.1, [])
  assert plain.tables is None and plain.table_inits() is None and not plain.packed


@pytest.mark.parametrize("slot_width, per_element", [(1, False), (5, True), (10, True)],
                         ids=["rowwise", "adagrad", "adam"])
def test_a_packed_spec_stores_each_tables_kept_columns_only(slot_width, per_element):
  # rows 0-5: dim 2 (kept: columns 0, 1 and the first-order column 4); 6-9: the model's dim 4
  # (all 5); 10-11: dim 4 again (all 5)
  spec = spec_from_args(12, 5, slot_width, 3, 0.1, [0.1] * slot_width,
                        _inits([2, 0, 4], slot_width))
  assert spec.packed
  values_layout, slots_layout = spec.packing()
  kept_values = 6 * 3 + 6 * 5
  values_shape, slots_shape = array_shapes(spec)
  assert values_layout.size == kept_values and values_shape == (kept_values,)
  if per_element:
    assert slots_layout is not None and slots_shape == (6 * 3 * slot_width // 5 + 6 * slot_width,)
  else:  # a row-wise accumulator keeps its one column for every table
    assert slots_layout is None and slots_shape == (12, slot_width)
  values, slots = row_stores(spec, np.zeros(values_shape, np.float32),
                             np.zeros(slots_shape, np.float32))
  assert isinstance(values, packed_rows.PackedRows)
  assert isinstance(slots, packed_rows.PackedRows if per_element else packed_rows.DenseRows)


def test_an_unpacked_spec_keeps_dense_rows():
  spec = spec_from_args(12, 5, 5, 3, 0.1, [0.1] * 5, _inits([0, 4, 0], 5))  # every dim the model's
  assert not spec.packed and array_shapes(spec) == ((12, 5), (12, 5))
  values, slots = row_stores(spec, np.zeros((12, 5), np.float32), np.zeros((12, 5), np.float32))
  assert isinstance(values, packed_rows.DenseRows) and isinstance(slots, packed_rows.DenseRows)


@pytest.mark.parametrize("tables", [
    ((0, 10), (0.1,), ((0.1,), (0.1,))),  # one stddev for two tables
    ((0, 10), (0.1, 0.1), ((0.1,),)),  # one slot row for two tables
    ((), (), ()),  # no table
    ((1, 10), (0.1, 0.1), ((0.1,), (0.1,))),  # not from row 0
    ((0, 10), (0.1, -0.1), ((0.1,), (0.1,))),  # a negative stddev
    ((0, 10), (0.1, float("nan")), ((0.1,), (0.1,))),  # a stddev that is not finite
    ((0, 10), (0.1, 0.1), ((0.1,), (0.1, 0.2))),  # a slot row of another width
], ids=["stddevs", "slot_rows", "empty", "start", "negative", "nan", "slot_width"])
def test_bad_per_table_rows_are_rejected(tables):
  base = dict(num_rows=20, width=2, slot_width=1, seed=0, init_stddev=0.1,
              initial_slot_row=(0.1,))
  with pytest.raises(ValueError, match=r"^HostTableSpec.tables must be T starts \(from 0\), T "
                                       r"finite stddevs >= 0 and T slot rows of 1, got "):
    HostTableSpec(**base, tables=tables)
  ok = HostTableSpec(**base, tables=((0, 10), (0.1, 0.0), ((0.1,), (0.2,))))  # 0: a zero table
  assert ok.table_inits().stddevs.tolist() == [0.1, 0.0]


def test_the_smallest_latent_dim_and_the_packing_of_a_table_without_dims():
  tables = ((0, 10), (0.1, 0.1), ((0.1,) * 3, (0.1,) * 3))
  base = dict(num_rows=20, width=3, slot_width=3, seed=0, init_stddev=0.1,
              initial_slot_row=(0.1,) * 3, tables=tables)
  spec = HostTableSpec(**base, table_dims=(0, 0), latent_dim=1)  # D = 1: nothing packs
  assert not spec.packed and spec.table_inits().dims.dtype == np.int64
  with pytest.raises(AssertionError):
    HostTableSpec(**base).packing()  # a spec without dims has no packing
  assert spec_from_args(20, 3, 3, 0, 0.1, [0.1] * 3, dtype="bfloat16").dtype == "bfloat16"


def test_spec_from_meta_reads_back_what_meta_json_records(tmp_path):
  tables = TableInits(np.array([0, 10]), np.array([0.1, 0.2]), np.full((2, 5), 0.3, np.float32),
                      np.array([2, 0]), 4)
  table = HostTable.create_mmap(str(tmp_path / "t"), 30, 5, 5, seed=7, init_stddev=0.1,
                                initial_slot_row=np.full(5, 0.3, np.float32), tables=tables,
                                dtype="bfloat16")
  meta = json.loads((tmp_path / "t" / "meta.json").read_text())
  assert spec_from_meta(meta) == table.spec and table.spec.packed
  del meta["initial_slot_row"]
  with pytest.raises(KeyError, match="initial_slot_row"):
    spec_from_meta(meta)
  table.close()
