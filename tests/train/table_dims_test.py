"""Per-table embedding dims (`TableSpec.dim`, `data.tables`, issue #22 Deliver 1).

A table of dim d is read through its rows' first d latent columns: training a model of
embed_dim D whose tables all have dim d equals training a model of embed_dim d (its
parameters the wider model's, restricted to the columns read), step by step, for an
element-wise and a row-wise row optimizer; the unread columns never change; tables of
mixed dims train on both backends alike.
"""

import dataclasses
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from experiments.configs import ctr
from sfjax import models
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.embedding import device_table as dt
from sfjax.embedding import row_optimizers as ro
from sfjax.embedding import vsi
from sfjax.train import loop
from sfjax.train import state as state_lib
from sfjax.train import step as step_lib
from tests.train import bag_data

B, D, NARROW = 24, 4, 2


def _with_dims(layout, dims):
  return dataclasses.replace(layout, tables=tuple(
      dataclasses.replace(t, dim=d) for t, d in zip(layout.tables, dims, strict=True)))


def _build(layout, embed_dim):
  model = models.build_model_from_config(
      {"name": "deepfm", "embed_dim": embed_dim, "mlp_dims": (8,)},
      num_fields=layout.num_features, num_dense=bag_data.NUM_DENSE, rngs=nnx.Rngs(0),
      layout=layout)
  return nnx.split(model)


def _train(graphdef, params, table, row_opt, layout, steps=3):
  tx = optax.adam(0.01)
  state = state_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), table)
  step = jax.jit(step_lib.make_train_step(graphdef, tx, row_opt))
  losses = []
  for seed in range(steps):
    batch = bag_data.make_rows(B, seed=seed, layout=layout)
    db, _ = vsi.prepare_batch(batch, layout.column_offsets, B * layout.num_columns + 1,
                              layout.total_rows, layout.column_rows,
                              table_starts=layout.table_offsets if row_opt.tables else None)
    state, metrics = step(state, db)
    losses.append(float(metrics["loss"]))
  return losses, state.table


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_tables_of_a_smaller_dim_train_as_a_model_of_that_dim(optimizer):
  layout = _with_dims(bag_data.LAYOUT, [NARROW] * 3)
  cfg = types.SimpleNamespace(optimizer=optimizer, learning_rate=0.3,
                              adagrad_initial_accumulator=0.1)
  wide_width, narrow_width = D + 1, NARROW + 1  # DeepFM rows: latent columns + first order
  live = [0, 1, D]  # the columns a dim-2 table's rows are read through
  row_widths = fl.table_row_widths(layout, D, wide_width)
  assert row_widths == (narrow_width,) * 3
  wide_opt = ro.row_optimizer_from_config(cfg, layout.tables, row_widths)
  narrow_opt = ro.row_optimizer_from_config(cfg, bag_data.LAYOUT.tables)
  graphdef, params = _build(layout, D)
  narrow_def, narrow_params = _build(bag_data.LAYOUT, NARROW)
  # The narrow model's first MLP layer: the wide kernel's rows of the columns read.
  kernel = params["inner"]["mlp"]["hidden"][0]["kernel"][...]
  f = layout.num_features
  rows = [i * D + j for i in range(f) for j in range(NARROW)] + [f * D + k for k in range(2)]
  narrow_params["inner"]["mlp"]["hidden"][0]["kernel"][...] = kernel[np.asarray(rows)]
  for path in (("inner", "mlp", "hidden", 0, "bias"), ("inner", "mlp", "out", "kernel"),
               ("inner", "mlp", "out", "bias"), ("inner", "dense_linear", "kernel")):
    src, dst = params, narrow_params
    for key in path:
      src, dst = src[key], dst[key]
    dst[...] = src[...]
  table = dt.init_table(layout.total_rows, wide_width, wide_opt, seed=3, stddev=0.3)
  cols = np.asarray(live)

  def read(slots):  # element-wise slots have a column per row column; row-wise ones one
    return slots[:, cols] if slots.shape[1] == wide_width else slots

  narrow_table = dt.TableState(table.values[:, cols], read(table.opt_slots))
  losses, trained = _train(graphdef, params, table, wide_opt, layout)
  narrow_losses, narrow_trained = _train(narrow_def, narrow_params, narrow_table, narrow_opt,
                                         bag_data.LAYOUT)
  np.testing.assert_allclose(losses, narrow_losses, rtol=1e-5)
  chex.assert_trees_all_close(trained.values[:, cols], narrow_trained.values, atol=1e-6)
  chex.assert_trees_all_close(read(trained.opt_slots), narrow_trained.opt_slots, atol=1e-6)
  # The unread columns never change; the read ones did.
  np.testing.assert_array_equal(trained.values[:, NARROW:D], table.values[:, NARROW:D])
  assert not np.array_equal(trained.values[:, :NARROW], table.values[:, :NARROW])


def test_without_its_row_width_rowwise_adagrad_drifts_from_the_narrow_model():
  # The row width matters: averaging over all E columns gives another update.
  layout = _with_dims(bag_data.LAYOUT, [NARROW] * 3)
  cfg = types.SimpleNamespace(optimizer="rowwise_adagrad", learning_rate=0.3,
                              adagrad_initial_accumulator=0.1)
  graphdef, params = _build(layout, D)
  with_widths = ro.row_optimizer_from_config(cfg, layout.tables,
                                             fl.table_row_widths(layout, D, D + 1))
  without = ro.row_optimizer_from_config(cfg, layout.tables)
  table = dt.init_table(layout.total_rows, D + 1, without, seed=3, stddev=0.3)
  _, a = _train(graphdef, params, table, with_widths, layout, steps=2)
  _, b = _train(graphdef, params, table, without, layout, steps=2)
  assert np.abs(np.asarray(a.values) - np.asarray(b.values)).max() > 1e-4


def test_live_columns_keep_the_first_order_column_and_name_a_dim_too_large():
  layout = _with_dims(bag_data.LAYOUT, [0, 3, 1])  # user: the model's dim
  live = fl.live_columns(layout, 4, 5)
  dims = layout.column_dims
  assert live.shape == (layout.num_columns, 5)
  for s, d in enumerate(dims):
    want = np.array([1.0] * (d or 4) + [0.0] * (4 - (d or 4)) + [1.0], np.float32)
    np.testing.assert_array_equal(live[s], want)
  assert fl.live_columns(bag_data.LAYOUT, 4, 5) is None
  full = fl.live_columns(_with_dims(bag_data.LAYOUT, [4, 0, 0]), 4, 5)  # dim D: all read
  assert full is not None and (full == 1).all()
  assert fl.table_row_widths(layout, 4, 5) == (None, 4, 2)
  with pytest.raises(ConfigError, match=r"features\.tables\.item\.dim: 5 is above .* 4"):
    fl.live_columns(_with_dims(bag_data.LAYOUT, [0, 5, 0]), 4, 5)
  with pytest.raises(ConfigError, match=r"features\.tables\.tag\.dim: must be an integer >= 1"):
    _with_dims(bag_data.LAYOUT, [0, 0, -1])
  for bad in ("2", 2.0, True):
    with pytest.raises(ConfigError, match=r"features\.tables\.tag\.dim: must be an integer"):
      _with_dims(bag_data.LAYOUT, [0, 0, bad])


def test_models_without_latent_columns_refuse_table_dims():
  layout = _with_dims(bag_data.LAYOUT, [0, 2, 0])
  with pytest.raises(ConfigError, match=r"features\.tables\.item\.dim: model 'lr'"):
    models.build_model_from_config({"name": "lr", "embed_dim": 4}, num_fields=6, num_dense=2,
                                   rngs=nnx.Rngs(0), layout=layout)
  assert models.table_latent_dim("dcnv2", 4, layout) == 4  # rows are the 4 latent columns
  assert models.table_latent_dim("deepfm", 4, bag_data.LAYOUT) is None
  assert models.latent_dim("deepfm", 4) == 4 and models.latent_dim("dcnv2", 4) == 4
  assert models.latent_dim("lr", 1) is None and models.latent_dim("lr", 4) is None
  assert models.latent_dim("composed", 4) is None


def _multihot_config(backend, tables):
  c = ctr.get_config("multihot_smoke")
  c.data.tables, c.embedding.backend, c.train.steps = tables, backend, 20
  return c


def test_data_tables_trains_alike_on_both_backends():
  tables = "item:dim=4;user:dim=8,optimizer=adagrad,learning_rate=0.05"
  finals = {}
  for backend in ("device", "cache"):
    final = loop.train_and_evaluate(_multihot_config(backend, tables))
    finals[backend] = final[0] if isinstance(final, tuple) else final
  assert finals["device"]["loss"] == finals["cache"]["loss"]
  assert finals["device"]["auc"] == finals["cache"]["auc"]
  plain = loop.train_and_evaluate(_multihot_config("device", ""))
  plain = plain[0] if isinstance(plain, tuple) else plain
  assert plain["loss"] != finals["device"]["loss"]  # the dims changed the model


def test_a_step_reading_through_live_columns_equals_the_model_with_those_dims():
  """`make_train_step(live_columns=)` on the undimmed model (what a search program runs,
  `sfjax.cohorts.table_choices.table_dims`) equals the step of the model built with the dims (its
  `PooledInput` masks): same losses, rows and parameters, L2 included."""
  dimmed = _with_dims(bag_data.LAYOUT, [0, NARROW, 1])
  graph_dims, params = _build(dimmed, D)
  graph_full, params_full = _build(bag_data.LAYOUT, D)
  chex.assert_trees_all_equal(params, params_full)  # the dims add no parameter
  live = jnp.asarray(fl.live_columns(dimmed, D, D + 1))
  tx = optax.adam(0.01)
  row_opt = ro.adagrad(0.05)
  table = dt.init_table(bag_data.LAYOUT.total_rows, D + 1, row_opt, seed=1, stddev=0.1)
  steps = {name: jax.jit(step_lib.make_train_step(graph, tx, row_opt, l2=1e-3, live_columns=lv))
           for name, graph, lv in (("dims", graph_dims, None), ("live", graph_full, live))}
  states = {name: state_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), table)
            for name in steps}
  for seed in range(3):
    batch = bag_data.make_rows(B, seed=seed, layout=bag_data.LAYOUT)
    db, _ = vsi.prepare_batch(batch, bag_data.LAYOUT.column_offsets,
                              B * bag_data.LAYOUT.num_columns + 1, bag_data.LAYOUT.total_rows,
                              bag_data.LAYOUT.column_rows)
    metrics = {}
    for name, step in steps.items():
      states[name], metrics[name] = step(states[name], db)
    chex.assert_trees_all_close(metrics["live"], metrics["dims"], rtol=1e-6)
    logits = {name: step_lib.eval_logits(graph, states[name].params, states[name].table.values,
                                         db, lv)
              for name, graph, lv in (("dims", graph_dims, None), ("live", graph_full, live))}
    chex.assert_trees_all_close(logits["live"], logits["dims"], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(states["live"], states["dims"], rtol=1e-5, atol=1e-7)
  plain = db._replace(weights=None, vids=db.vids[:, :bag_data.LAYOUT.num_features])
  with pytest.raises(ValueError, match="live columns need a feature layout's batch"):
    step_lib.forward_logits(graph_full, params, table.values[:8], plain, live)


@pytest.mark.slow  # ~8 s each: a trainer per backend (the fast tier stays under 5 minutes)
@pytest.mark.parametrize("backend", ["device", "cache"])
def test_unread_columns_start_and_stay_zero_and_the_host_table_stores_each_tables_width(backend):
  # item: dim 4 of the model's 16 (+ DeepFM's first-order column); user: dim 2, adagrad slots.
  from sfjax.data import make_dataset  # pylint: disable=import-outside-toplevel
  from sfjax.embedding.host_table import HostTable  # pylint: disable=import-outside-toplevel
  from sfjax.train.runner import run_steps  # pylint: disable=import-outside-toplevel

  c = _multihot_config(backend, "item:dim=4;user:dim=2,optimizer=adagrad")
  c.embedding.l2 = 1e-3  # an L2 keeps a zero column zero too
  data = make_dataset(c.data, seed=c.seed)
  spec = data.spec
  trainer = loop.build_trainer(c, spec)
  be = trainer.backend
  latent = c.model.embed_dim
  dims = np.asarray([t.dim for t in spec.layout.tables])
  starts = np.append(spec.layout.table_offsets, spec.total_rows)

  def dead(values):  # [V, E] -> the columns past each table's dim, all tables
    return np.concatenate([values[starts[t]:starts[t + 1], d:latent].ravel()
                           for t, d in enumerate(dims) if 0 < d < latent])

  if backend == "cache":
    host = be.host_table
    assert host.spec.packed
    plain = HostTable.create_ram(
        host.num_rows, host.width, host.slot_width, seed=0, init_stddev=0.1,
        initial_slot_row=np.zeros(host.slot_width),
        tables=host.spec.table_inits()._replace(dims=None))
    assert not plain.spec.packed
    sizes = np.diff(starts)
    stored = sum(int(n) * ((d + 1 if 0 < d < latent else latent + 1) * (4 + 4 * (host.slot_width > 1)))
                 for n, d in zip(sizes, dims, strict=True))
    assert host.nbytes - host.num_rows == stored < plain.nbytes - plain.num_rows
  else:
    chex.assert_trees_all_equal(dead(np.asarray(trainer.state.table.values)), 0.0)
  inputs = be.train_inputs(data.train_batches(c.train.batch_size, seed=c.seed))
  try:
    state, _ = run_steps(trainer.run_step, trainer.state, inputs, 1, 6, c.train.batch_size)
    be.sync(state)
  finally:
    inputs.close()
  values = (be.host_table.read_all()[0] if backend == "cache"
            else np.asarray(state.table.values))
  chex.assert_trees_all_equal(dead(values), 0.0)
  initial = dt.init_table_host(spec.total_rows, values.shape[1], ro.sgd(0.1), seed=c.seed,
                               stddev=c.embedding.init_stddev,
                               tables=dt.table_inits(spec.layout, values.shape[1], ro.sgd(0.1),
                                                     c.embedding.init_stddev, latent))[0]
  assert (values[:, :4] != initial[:, :4]).any()  # the read columns trained
  if backend == "cache":
    be.close()
