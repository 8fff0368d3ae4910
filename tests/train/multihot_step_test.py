"""The sparse step with bags equals a dense `jax.grad` over the whole table (issue #22).

For every pooling (sum, mean, sqrtn, per-id weights, a mean-pooled sequence, a table
shared by two features, duplicate ids inside a bag, empty bags) the row update of
the sparse step (SGD, rate 1: new = old - grad) equals the gradient of the loss
written densely: the whole table indexed by the batch's global ids, padding masked,
pooled by an independent formula.
"""

import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from sfjax import models
from sfjax.core import feature_layout as fl
from sfjax.embedding import device_table as dt
from sfjax.embedding import row_optimizers as ro
from sfjax.embedding import vsi
from sfjax.train import state as state_lib
from sfjax.train import step as step_lib
from tests.train import bag_data

B = 24


def _model(layout):
  model = models.build_model_from_config(
      {"name": "deepfm", "embed_dim": 4, "mlp_dims": (8,)}, num_fields=layout.num_features,
      num_dense=bag_data.NUM_DENSE, rngs=nnx.Rngs(0), layout=layout)
  return nnx.split(model)


def _dense_loss(graphdef, params, table, batch, layout):
  """The loss from the whole table: pooled by explicit per-feature formulas."""
  inner = nnx.merge(graphdef, params).inner
  gids = vsi.global_row_ids(batch.ids, layout.column_offsets, column_rows=layout.column_rows,
                            allow_padding=True)
  real = gids >= 0
  emb = table[np.where(real, gids, 0)] * real[..., None]  # [B, S, E], padding exactly 0
  w = jnp.asarray(batch.weights)
  fields = []
  for f, feature in enumerate(layout.features):
    cols = layout.columns(f)
    e, wf = emb[:, cols], w[:, cols]
    num = jnp.einsum("bse,bs->be", e, wf)
    pooling = "mean" if feature.kind == "sequence" else feature.pooling
    if feature.kind == "one_hot" or pooling == "sum":
      fields.append(num)
    elif pooling == "mean":
      den = wf.sum(1)
      fields.append(jnp.where(den[:, None] > 0, num / jnp.maximum(den, 1e-30)[:, None], 0.0))
    else:
      den = jnp.sqrt((wf ** 2).sum(1))
      fields.append(jnp.where(den[:, None] > 0, num / jnp.maximum(den, 1e-30)[:, None], 0.0))
  logits = inner(jnp.stack(fields, 1), jnp.asarray(batch.dense))
  return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, jnp.asarray(batch.labels)))


@pytest.mark.parametrize("layout", [
    bag_data.LAYOUT,
    # A small shared table: many duplicates inside bags and across features.
    pytest.param(fl.FeatureLayout((fl.TableSpec("t", 9),), (
        fl.FeatureSpec("a", "t"), fl.FeatureSpec("b", "t", "multi_hot", 3, "sqrtn"))),
        marks=pytest.mark.slow),
], ids=["mixed", "shared-small"])
def test_sparse_step_equals_dense_grad(layout):
  graphdef, params = _model(layout)
  width = models.embedding_width("deepfm", 4)
  table = dt.init_table(layout.total_rows, width, ro.sgd(1.0), seed=3, stddev=0.3)
  batch = bag_data.make_rows(B, seed=5, layout=layout)
  db, _ = vsi.prepare_batch(batch, layout.column_offsets, B * layout.num_columns + 1,
                            layout.total_rows, layout.column_rows)
  tx = optax.sgd(0.0)
  state = state_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), table)
  before = np.asarray(table.values).copy()
  new, metrics = jax.jit(step_lib.make_train_step(graphdef, tx, ro.sgd(1.0)))(state, db)
  sparse_grad = before - np.asarray(new.table.values)
  loss, dense_grad = jax.value_and_grad(
      lambda t: _dense_loss(graphdef, params, t, batch, layout))(jnp.asarray(before))
  np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-6)
  chex.assert_trees_all_close(sparse_grad, np.asarray(dense_grad), atol=1e-6, rtol=1e-4)
  assert np.abs(dense_grad).sum() > 0


def test_padding_gets_no_unique_row_and_no_update():
  layout = bag_data.LAYOUT
  batch = bag_data.make_rows(B, seed=1)
  db, n = vsi.prepare_batch(batch, layout.column_offsets, B * layout.num_columns + 1,
                            layout.total_rows, layout.column_rows)
  real = batch.ids >= 0
  gids = batch.ids + layout.column_offsets[None, :]
  assert n == len(np.unique(gids[real]))  # padding adds no unique id
  assert (db.vids[~real] == n).all() and (db.rows[n:] == layout.total_rows).all()
  np.testing.assert_array_equal(db.rows[db.vids[real]], gids[real])


@pytest.mark.parametrize("name", [n if n == "deepfm" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in models.MODEL_NAMES])
def test_every_named_model_takes_pooled_bags_as_fields(name):
  layout = bag_data.LAYOUT
  model = models.build_model_from_config(
      {"name": name, "embed_dim": 4, "mlp_dims": (8,), "bottom_mlp_dims": (8, 4),
       "cin_dims": (4,), "attention_dim": 4}, num_fields=layout.num_features,
      num_dense=bag_data.NUM_DENSE, rngs=nnx.Rngs(0), layout=layout)
  width = models.embedding_width(name, 4)
  batch = bag_data.make_rows(B, seed=2)
  emb = jax.random.normal(jax.random.key(0), (B, layout.num_columns, width))
  logits = model(emb, jnp.asarray(batch.dense), jnp.asarray(batch.weights))
  chex.assert_shape(logits, (B,))
  chex.assert_tree_all_finite(logits)
  # Padding columns are never read: other values there change nothing.
  noisy = jnp.where(jnp.asarray(batch.weights)[..., None] == 0, 1e3, emb)
  chex.assert_trees_all_close(model(noisy, jnp.asarray(batch.dense), jnp.asarray(batch.weights)),
                              logits)


def test_each_tables_rows_move_as_that_tables_optimizer_alone():
  """Per-table row optimizers (issue #22 Deliver 1): user sgd 0.5, item adagrad 0.1, tag
  rowwise_adagrad 0.05, in one step over a batch touching all three tables."""
  layout = bag_data.TABLES_LAYOUT
  graphdef, params = _model(layout)
  width = models.embedding_width("deepfm", 4)
  cfg = types.SimpleNamespace(optimizer="adam", learning_rate=9.0, adagrad_initial_accumulator=0.1)
  row_opt = ro.row_optimizer_from_config(cfg, layout.tables)
  inits = dt.table_inits(layout, width, row_opt, 0.3)
  table = dt.init_table(layout.total_rows, width, row_opt, seed=3, stddev=0.3, tables=inits)
  batch = bag_data.make_rows(B, seed=5, layout=layout)
  db, n = vsi.prepare_batch(batch, layout.column_offsets, B * layout.num_columns + 1,
                            layout.total_rows, layout.column_rows, layout.table_offsets)
  np.testing.assert_array_equal(db.row_tables[:n], fl.row_tables(layout.table_offsets, db.rows[:n]))
  tx = optax.sgd(0.0)
  state = state_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), table)
  before = jax.tree.map(lambda x: np.asarray(x).copy(), table)
  new, _ = jax.jit(step_lib.make_train_step(graphdef, tx, row_opt))(state, db)
  uniq = dt.gather_rows(table, jnp.asarray(db.rows))
  _, (_, row_grads) = jax.jit(lambda v: step_lib.loss_and_grads(graphdef, params, v, db, 0.0))(
      uniq.values)
  values, slots = np.asarray(new.table.values), np.asarray(new.table.opt_slots)
  for t, spec in enumerate(layout.tables):
    alone = ro.make(spec.optimizer, spec.learning_rate, cfg)
    rows = db.rows[:n][db.row_tables[:n] == t]
    picked = np.isin(db.rows, rows)
    s = alone.slot_width(width)
    want_values, want_slots = alone.update(
        before.values[rows], before.opt_slots[rows, :s], np.asarray(row_grads)[picked], 1)
    assert rows.size > 3
    np.testing.assert_allclose(values[rows], np.asarray(want_values), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(slots[rows, :s], np.asarray(want_slots), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(slots[rows, s:], before.opt_slots[rows, s:])
    assert not np.allclose(values[rows], before.values[rows])
  untouched = np.setdiff1d(np.arange(layout.total_rows), db.rows[:n])
  np.testing.assert_array_equal(values[untouched], before.values[untouched])
