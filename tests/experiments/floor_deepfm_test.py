"""experiments/floor_deepfm.py: the plain-JAX floor step on a tiny hand-checkable table."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import floor_deepfm as floor

V, F, D, ND, B = 12, 3, 2, 2, 4
IDS = np.array([[0, 5, 9], [1, 5, 11], [0, 6, 9], [2, 5, 10]])  # global rows, 8 unique


def _batch(capacity=10):
  rng = np.random.default_rng(0)
  return floor.floor_batch(IDS, rng.random((B, ND)), np.array([1, 0, 0, 1]), capacity, V)


def test_floor_batch_pads_the_unique_rows_with_the_table_size():
  b = _batch()
  np.testing.assert_array_equal(b.rows, [0, 1, 2, 5, 6, 9, 10, 11, V, V])
  np.testing.assert_array_equal(b.rows[b.inv], IDS)
  assert b.rows.dtype == b.inv.dtype == np.int32
  with pytest.raises(ValueError, match="8 unique ids, more than the capacity 7"):
    _batch(capacity=7)


def test_step_equals_row_wise_adagrad_on_the_dense_gradient():
  state = floor.init_state(V, F, D, ND, mlp_dims=(8,))
  batch = jax.tree.map(jnp.asarray, _batch())
  table0, params0 = np.array(state.table), jax.tree.map(np.array, state.params)  # donated below

  def dense_loss(table):  # the same loss over the whole table: its gradient is dense
    logit = floor.forward(params0, table[IDS], batch.dense)
    y = batch.labels
    return jnp.mean(jnp.maximum(logit, 0) - logit * y + jnp.log1p(jnp.exp(-jnp.abs(logit))))

  loss0 = dense_loss(state.table)
  g = np.asarray(jax.grad(dense_loss)(state.table))
  accum = np.mean(g * g, 1)
  expected = table0 - floor.ROW_LR * g / (np.sqrt(accum)[:, None] + floor.EPS)
  touched = np.unique(IDS)
  new, loss = floor.make_floor_step()(state, batch)
  np.testing.assert_allclose(loss, loss0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(new.table)[touched], expected[touched], rtol=1e-5, atol=1e-7)
  untouched = np.setdiff1d(np.arange(V), touched)
  np.testing.assert_array_equal(np.asarray(new.table)[untouched], table0[untouched])
  np.testing.assert_allclose(np.asarray(new.accum)[touched], accum[touched], rtol=1e-5)
  assert float(new.count) == 1.0
  # Adam's first step moves every dense parameter with a nonzero gradient by about DENSE_LR.
  moved = np.abs(np.asarray(new.params["wd"]) - np.asarray(params0["wd"]))
  np.testing.assert_allclose(moved, floor.DENSE_LR, rtol=1e-3)


def test_measure_trains_without_recompiling():
  state = floor.init_state(V, F, D, ND, mlp_dims=(8,))
  batches = [jax.tree.map(jnp.asarray, _batch())] * 2
  step = chex.assert_max_traces(floor.floor_step, n=1)
  figures, state = floor.measure(jax.jit(step, donate_argnums=0), state, batches, steps=20,
                                 warmup=2)
  assert figures["probe"] == "floor_deepfm" and figures["unique_capacity"] == 10
  assert figures["median_step_ms"] > 0
  assert figures["examples_per_sec"] == pytest.approx(B / (figures["median_step_ms"] * 1e-3))
  assert float(state.count) == 22
  first = floor.init_state(V, F, D, ND, mlp_dims=(8,))
  _, loss0 = floor.floor_step(first, batches[0])
  assert figures["loss"] < float(loss0)  # 22 steps on one batch fit it
