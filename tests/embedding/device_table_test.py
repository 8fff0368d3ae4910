"""On-device table: init equals the host initialiser; padded rows never touch the table."""

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from sfjax.embedding import device_table as dt
from sfjax.embedding import initializers, row_dtype
from sfjax.embedding import row_optimizers as ro


def test_init_matches_lazy_rows_in_any_order():
  opt = ro.adagrad(0.1, 0.5)
  table = dt.init_table(100, 5, opt, seed=3, stddev=0.1)
  rows = np.array([97, 3, 41], np.int64)
  chex.assert_trees_all_close(np.asarray(table.values)[rows], initializers.init_rows(3, 0, rows, 5, 0.1))
  chex.assert_trees_all_close(table.opt_slots, np.full((100, 5), 0.5, np.float32))
  vals = np.asarray(table.values)
  assert abs(vals.std() - 0.1) < 0.01 and abs(vals.mean()) < 0.01


def test_gather_fills_and_scatter_drops_padding():
  opt = ro.sgd(0.1)
  table = dt.init_table(6, 2, opt, seed=0, stddev=1.0)
  rows = jnp.array([4, 1, 6, 6], jnp.int32)  # 6 == V is padding
  got = jax.jit(dt.gather_rows)(table, rows)
  chex.assert_trees_all_close(got.values[2:], np.zeros((2, 2)))
  upd = dt.TableState(jnp.full((4, 2), 7.0), jnp.zeros((4, 0)))
  new = jax.jit(dt.scatter_rows)(table, rows, upd)
  expect = np.asarray(table.values).copy()
  expect[[4, 1]] = 7.0
  chex.assert_trees_all_close(new.values, expect)


def test_half_width_rows_are_stored_rounded_and_computed_in_float32():
  bf16 = np.dtype(ml_dtypes.bfloat16)
  opt = ro.sgd(0.1)
  full = dt.init_table(10, 3, opt, seed=2, stddev=0.1)
  half = dt.init_table(10, 3, opt, seed=2, stddev=0.1, dtype=bf16)
  # bfloat16 rows live on the device as their uint16 bits (XLA:CPU: no bf16 scatter).
  assert half.values.dtype == np.uint16 and half.opt_slots.dtype == np.float32
  stored = row_dtype.from_storage(half.values)
  assert stored.dtype == bf16
  np.testing.assert_array_equal(stored, np.asarray(full.values).astype(bf16))
  rows = jnp.array([7, 2, 10], jnp.int32)  # 10 == V is padding
  got = jax.jit(dt.gather_rows)(half, rows)  # upcast for the step
  assert got.values.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(got.values[:2]), stored[[7, 2]].astype(np.float32))
  assert jax.jit(dt.take_stored_rows)(half, rows).values.dtype == np.uint16  # as stored (evictions)
  upd = dt.TableState(jnp.full((3, 3), 0.1 + 1e-4, jnp.float32), jnp.zeros((3, 0)))
  new = jax.jit(dt.scatter_rows)(half, rows, upd)
  assert new.values.dtype == np.uint16  # rounded to nearest on the way in
  np.testing.assert_array_equal(row_dtype.from_storage(new.values)[[7, 2]],
                                np.full((2, 3), 0.1 + 1e-4, np.float32).astype(bf16))


def test_table_inits_records_table_dims_below_the_latent_dim():
  from sfjax.core import feature_layout as fl  # pylint: disable=import-outside-toplevel

  def layout(**item):
    tables = (fl.TableSpec("user", 6), fl.TableSpec("item", 10, **item))
    return fl.FeatureLayout(tables, (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item")))

  opt = ro.rowwise_adagrad(0.1, 0.2)
  assert dt.table_inits(layout(), 5, opt, 0.1, latent_dim=4) is None  # rows alike
  assert dt.table_inits(layout(dim=4), 5, opt, 0.1, latent_dim=4) is None  # the model's dim
  assert dt.table_inits(layout(dim=2), 5, opt, 0.1) is None  # no latent dim: no dims recorded
  inits = dt.table_inits(layout(dim=2), 5, opt, 0.1, latent_dim=4)
  chex.assert_trees_all_equal((inits.starts, inits.stddevs, inits.slot_rows, inits.dims),
                              (np.array([0, 6]), np.array([0.1, 0.1]),
                               np.full((2, 1), 0.2, np.float32), np.array([0, 2])))
  assert inits.latent_dim == 4
  values = dt.init_table_host(16, 5, opt, seed=1, stddev=0.1, tables=inits)[0]
  assert (values[6:, 2:4] == 0).all() and (values[6:, [0, 1, 4]] != 0).all()
  assert (values[:6] != 0).all()
  with_rate = dt.table_inits(layout(dim=2, init_stddev=0.5), 5, opt, 0.1, latent_dim=4)
  chex.assert_trees_all_equal((with_rate.stddevs, with_rate.dims),
                              (np.array([0.1, 0.5]), np.array([0, 2])))
  assert dt.table_inits(layout(init_stddev=0.5), 5, opt, 0.1, latent_dim=4).dims is None
