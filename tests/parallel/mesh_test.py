"""Data-parallel mesh: examples sharded on 'data', unique rows replicated."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from sfjax.core.types import DeviceBatch
from sfjax.parallel import mesh as mesh_lib


@pytest.mark.parametrize("n", [1, 2, 8])
def test_make_mesh_uses_the_first_n_devices(n):
  mesh = mesh_lib.make_mesh(n)
  assert mesh.axis_names == ("data",) and mesh.shape == {"data": n}
  assert list(mesh.devices) == jax.local_devices()[:n]
  assert mesh.axis_types == (jax.sharding.AxisType.Auto,)


def test_make_mesh_default_is_all_devices():
  assert mesh_lib.make_mesh().shape == {"data": jax.local_device_count()} == {"data": 8}
  assert mesh_lib.make_mesh(-1).shape == {"data": 8}


def test_too_many_devices_names_the_config_field():
  with pytest.raises(ValueError, match=r"train\.num_devices=9 but only 8 devices"):
    mesh_lib.make_mesh(9)


def test_replicated_keeps_a_full_copy_everywhere():
  mesh = mesh_lib.make_mesh(8)
  sharding = mesh_lib.replicated(mesh)
  assert sharding.spec == P() and sharding.is_fully_replicated
  x = jax.device_put(np.arange(6.0), sharding)
  assert len(x.sharding.device_set) == 8
  assert all(s.data.shape == (6,) for s in x.addressable_shards)


def test_batch_shardings_put_rows_replicated_and_examples_on_data():
  mesh = mesh_lib.make_mesh(8)
  shardings = mesh_lib.batch_shardings(mesh)
  assert isinstance(shardings, DeviceBatch)
  assert shardings.rows.spec == P()
  assert all(s.spec == P("data") for s in shardings[1:6]) and shardings.row_tables is None
  assert mesh_lib.batch_shardings(mesh, row_tables=True).row_tables.spec == P()  # like rows
  b, f = 16, 3  # 2 examples per device
  batch = DeviceBatch(rows=np.arange(5, dtype=np.int32), vids=np.zeros((b, f), np.int32),
                      dense=np.zeros((b, 2), np.float32), labels=np.zeros((b,), np.float32),
                      mask=np.ones((b,), np.float32))
  placed = jax.device_put(batch, shardings)
  assert placed.rows.sharding.is_fully_replicated
  chex.assert_shape([s.data for s in placed.rows.addressable_shards], [(5,)] * 8)
  chex.assert_tree_is_sharded(placed._replace(rows=None), devices=mesh.devices.tolist())
  chex.assert_shape([s.data for s in placed.vids.addressable_shards], [(2, f)] * 8)
  chex.assert_shape([s.data for s in placed.mask.addressable_shards], [(2,)] * 8)
  # Under jit the sharded mask still sums to the batch size (GSPMD all-reduce).
  assert float(jax.jit(jnp.sum)(placed.mask)) == b


def test_rows_on_devices_splits_the_leading_axis():
  mesh = mesh_lib.make_mesh(8)
  x = jax.device_put(np.arange(16.0).reshape(16, 1), mesh_lib.rows_on_devices(mesh))
  assert x.sharding.spec == P("data")
  assert [s.data.shape for s in x.addressable_shards] == [(2, 1)] * 8
  np.testing.assert_array_equal(np.asarray(x.addressable_shards[3].data)[:, 0], [6.0, 7.0])
