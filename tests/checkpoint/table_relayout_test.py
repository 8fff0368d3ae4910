"""A dense checkpoint's device table moves between layouts on restore (issue #24 item 3).

A row-sharded table (21 rows over 8 devices: 3 each, 3 padding rows) is saved as its
shards hold it, with its layout in meta.json; it restores exactly onto one device, onto
a replicated table over 8, row-sharded over 4 (6 each) and back, SGD's empty slots
included; the reader returns it in row order.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.checkpoint import reader
from sfjax.embedding import device_table, row_sharded_table
from sfjax.parallel import mesh as mesh_lib
from sfjax.train.state import TrainState

V, E = 21, 2


def _rows(slot_width):
  values = np.arange(V * E, dtype=np.float32).reshape(V, E) + 1
  return values, np.full((V, slot_width), 0.5, np.float32) + values[:, :1]


def _state(layout: str, devices: int, slot_width: int = 2, step: int = 5) -> TrainState:
  """Step `step`, a tiny dense part and the table of `_rows` in `layout` ('row': split over
  `devices`; 'replicated': whole on each)."""
  mesh = mesh_lib.make_mesh(devices)
  values, slots = _rows(slot_width)
  if layout == "row":
    order = row_sharded_table.table_layout(V, devices)
    values, slots = (row_sharded_table.to_physical(x, order) for x in (values, slots))
    sharding = mesh_lib.rows_on_devices(mesh)
  else:
    sharding = mesh_lib.replicated(mesh)
  rep = mesh_lib.replicated(mesh)
  return TrainState(jax.device_put(jnp.int32(step), rep), {"w": jax.device_put(jnp.ones(3), rep)},
                    {"m": jax.device_put(jnp.zeros(2), rep)},
                    device_table.TableState(jax.device_put(values, sharding),
                                            jax.device_put(slots, sharding)))


def _logical(state: TrainState, layout: str, devices: int):
  values, slots = (np.asarray(x) for x in state.table)
  if layout == "row":
    order = row_sharded_table.table_layout(V, devices)
    values, slots = (row_sharded_table.to_logical(x, order, V) for x in (values, slots))
  return values, slots


@pytest.mark.parametrize("saved,target", [
    (("row", 8), ("replicated", 1)),
    (("row", 8), ("replicated", 8)),
    (("row", 8), ("row", 4)),
    (("replicated", 1), ("row", 8)),
    (("row", 8), ("row", 8)),  # same layout: restored in place, shard by shard
])
def test_table_restores_onto_another_layout(tmp_path, saved, target):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1)
  try:
    path = ckpt.save(_state(*saved), {"history": []})
    restored = ckpt.restore(path, _state(*target, step=0))
  finally:
    ckpt.close()
  assert int(restored.state.step) == 5
  want = _rows(2)
  for got, expected in zip(_logical(restored.state, *target), want, strict=True):
    np.testing.assert_array_equal(got, expected)
  like = _state(*target).table.values.sharding
  assert restored.state.table.values.sharding == like
  shards = restored.meta[reader.TABLE_LAYOUT_KEY]
  assert shards == ({"row_shards": 8, "rows_per_shard": 3} if saved[0] == "row"
                    else {"row_shards": 1, "rows_per_shard": V})


def test_sgd_tables_without_slots_move_too_and_read_in_row_order(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=1)
  try:
    path = ckpt.save(_state("row", 8, slot_width=0), {"history": [], "fields": [{"rows": V}]})
    restored = ckpt.restore(path, _state("replicated", 1, slot_width=0, step=0))
  finally:
    ckpt.close()
  np.testing.assert_array_equal(np.asarray(restored.state.table.values), _rows(0)[0])
  assert restored.state.table.opt_slots.shape == (V, 0)
  table = reader.open_checkpoint(path).table  # the fields' 21 rows, padding dropped
  assert (table.num_rows, table.slot_width) == (V, 0)
  np.testing.assert_array_equal(table.rows(np.arange(V))[0], _rows(0)[0])
