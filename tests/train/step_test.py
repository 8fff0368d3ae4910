"""Train step: sparse row updates, no recompilation, 8-device equals 1-device."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.extend import core as jax_core
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax import models
from sfjax.data import types
from sfjax.embedding import device_table as dt
from sfjax.embedding import row_optimizers as ro
from sfjax.embedding import sharded_cache, vsi
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import state as state_lib
from sfjax.train import step as step_lib

SPEC = types.DatasetSpec(tuple(types.FieldSpec(f"c{i}", n) for i, n in enumerate([7, 11, 5])), 2)
B = 16


def _batch(seed, rows=SPEC.field_rows):
  rng = np.random.default_rng(seed)
  ids = np.stack([rng.integers(0, n, B) for n in rows], 1)
  return types.make_batch(ids, rng.normal(size=(B, 2)), rng.integers(0, 2, B))


def _setup_parts():
  """(graphdef, dense optimizer) of the tiny DeepFM."""
  model = models.build_model("deepfm", num_fields=3, embed_dim=4, num_dense=2,
                             rngs=nnx.Rngs(0), mlp_dims=(8,))
  return nnx.split(model)[0], optax.adam(1e-2)


def _setup(row_opt, mesh=None):
  model = models.build_model("deepfm", num_fields=3, embed_dim=4, num_dense=2,
                             rngs=nnx.Rngs(0), mlp_dims=(8,))
  graphdef, params = nnx.split(model)
  tx = optax.adam(1e-2)
  width = models.embedding_width("deepfm", 4)
  table = dt.init_table(SPEC.total_rows, width, row_opt, seed=0, stddev=0.1)
  state = state_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), table)
  fn = step_lib.make_train_step(graphdef, tx, row_opt, l2=1e-4)
  return state, fn


def _device_batch(b, capacity=B * 3):
  return vsi.prepare_batch(b, SPEC.field_offsets, capacity, SPEC.total_rows)[0]


def test_only_touched_rows_change():
  state, fn = _setup(ro.adagrad(0.1))
  before = np.asarray(state.table.values).copy()
  b = _batch(0)
  state, m = jax.jit(fn, donate_argnums=0)(state, _device_batch(b))
  touched = np.unique(b.ids + SPEC.field_offsets)
  changed = np.flatnonzero(np.any(np.asarray(state.table.values) != before, axis=1))
  assert set(changed) <= set(touched) and len(changed) > 0
  assert int(state.step) == 1 and np.isfinite(float(m["loss"]))


def test_step_does_not_recompile_across_unique_counts():
  state, fn = _setup(ro.adam(0.01))
  step = jax.jit(chex.assert_max_traces(fn, n=1), donate_argnums=0)
  counts = set()
  for seed in range(4):
    rows = (3, 2, 5) if seed % 2 else SPEC.field_rows  # fewer unique ids on odd steps
    db, n = vsi.prepare_batch(_batch(seed, rows), SPEC.field_offsets, B * 3, SPEC.total_rows)
    counts.add(n)
    state, _ = step(state, db)
  assert len(counts) > 1


def test_loss_decreases_on_repeated_batch():
  state, fn = _setup(ro.adagrad(0.1))
  step = jax.jit(fn, donate_argnums=0)
  db = _device_batch(_batch(1))
  losses = []
  for _ in range(20):
    state, m = step(state, db)
    losses.append(float(m["loss"]))
  assert losses[-1] < losses[0] * 0.7


def test_eight_devices_match_one_device():
  b = _device_batch(_batch(2))
  outs = []
  for n in (1, 8):
    state, fn = _setup(ro.ftrl(0.1, l1=0.001))
    mesh = mesh_lib.make_mesh(n)
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    state = jax.device_put(state, rep)
    bsh = mesh_lib.batch_shardings(mesh)
    step = step_lib.jit_train_step(fn, jax.tree.map(lambda _, rep=rep: rep, state), bsh)
    for _ in range(3):
      state, m = step(state, jax.device_put(b, bsh))
    if n == 8:
      assert len(jax.device_put(b, bsh).vids.sharding.device_set) == 8
    outs.append((m["loss"], state.table, state.params))
  chex.assert_trees_all_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_owner_step_on_eight_devices_equals_the_reference_step():
  """The row-sharded step (per device, in shard_map) equals the reference step, l2 included."""
  state, fn = _setup(ro.adagrad(0.1))  # l2 = 1e-4
  graphdef, tx = _setup_parts()
  mesh = mesh_lib.make_mesh(8)
  layout = sharded_cache.SlotLayout(8, 3)  # 24 slots; table row r lives in physical slot r
  values, slots = (np.concatenate([np.asarray(x), np.zeros((1, x.shape[1]), np.float32)])
                   for x in state.table)
  on = NamedSharding(mesh, P("data"))
  sharded_state = state._replace(table=dt.TableState(jax.device_put(values, on),
                                                     jax.device_put(slots, on)))
  owner = step_lib.make_train_step(graphdef, tx, ro.adagrad(0.1), l2=1e-4, row_axis="data")
  spec = state_lib.TrainState(P(), P(), P(), P("data"))
  step = jax.jit(jax.shard_map(owner, mesh=mesh, in_specs=(spec, P("data")),
                               out_specs=(spec, P()), check_vma=False))
  ref_step = jax.jit(fn)
  for seed in range(3):
    db, n = vsi.prepare_batch(_batch(seed), SPEC.field_offsets, B * 3, SPEC.total_rows)
    rows, vids = sharded_cache.block_by_owner(db.rows[:n], db.vids, layout, buckets=(2, 4, 8))
    sharded_state, m = step(sharded_state, db._replace(rows=rows, vids=vids))
    state, ref_m = ref_step(state, db)
    chex.assert_trees_all_close(m["loss"], ref_m["loss"], rtol=1e-5)
  chex.assert_trees_all_close(np.asarray(sharded_state.table.values)[:SPEC.total_rows],
                              np.asarray(state.table.values), rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(np.asarray(sharded_state.table.opt_slots)[:SPEC.total_rows],
                              np.asarray(state.table.opt_slots), rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(sharded_state.params, state.params, rtol=1e-5, atol=1e-6)


def test_owner_step_refuses_skip_non_finite():
  graphdef, tx = _setup_parts()
  with pytest.raises(ValueError, match="row_axis"):
    step_lib.make_train_step(graphdef, tx, ro.sgd(0.1), skip_non_finite=True, row_axis="data")


class _CountingDeepFM(nnx.Module):
  """The tiny DeepFM plus a non-parameter variable its forward updates (a call counter)."""

  def __init__(self):
    self.inner = models.build_model("deepfm", num_fields=3, embed_dim=4, num_dense=2,
                                    rngs=nnx.Rngs(0), mlp_dims=(8,))
    self.calls = nnx.BatchStat(jnp.zeros((), jnp.int32))

  def __call__(self, emb, dense):
    self.calls[...] += 1
    return self.inner(emb, dense)


def test_model_variables_are_written_back_and_the_params_train_as_without_them():
  counting = _CountingDeepFM()
  graphdef, full = nnx.split(counting)
  tx, row_opt = optax.adam(1e-2), ro.adagrad(0.1)
  table = dt.init_table(SPEC.total_rows, models.embedding_width("deepfm", 4), row_opt, seed=0,
                        stddev=0.1)
  params = nnx.state(full, nnx.Param)
  state = state_lib.TrainState(jnp.zeros((), jnp.int32), full, tx.init(params), table)
  step = jax.jit(chex.assert_max_traces(step_lib.make_train_step(
      graphdef, tx, row_opt, l2=1e-4, model_variables=True), n=1))
  plain_state, plain = _setup(row_opt)  # the same DeepFM, no variable
  for seed in range(3):
    db = _device_batch(_batch(seed))
    state, m = step(state, db)
    plain_state, plain_m = jax.jit(plain)(plain_state, db)
    chex.assert_trees_all_close(m["loss"], plain_m["loss"], rtol=1e-6)
  assert int(state.params["calls"][...]) == 3  # one forward per step, written back
  chex.assert_trees_all_close(nnx.to_pure_dict(state.params)["inner"],
                              nnx.to_pure_dict(plain_state.params), rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(state.table, plain_state.table, rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="model_variables is not supported"):
    step_lib.make_train_step(graphdef, tx, row_opt, model_variables=True, row_axis="data")


def _jaxpr_primitives(jaxpr) -> set[str]:
  """Names of every primitive in `jaxpr`, sub-jaxprs (pjit, custom_jvp) included."""
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for sub in jax_core.jaxprs_in_params(eqn.params):
      names |= _jaxpr_primitives(sub)
  return names


def test_split_input_deepfm_trains_as_the_default_up_to_rounding():
  """model.split_input: the step calls DeepFM.from_unique_rows (no concatenated MLP input)."""
  outs, prims = [], []
  for split in (False, True):
    model = models.build_model("deepfm", num_fields=3, embed_dim=4, num_dense=2,
                               rngs=nnx.Rngs(0), mlp_dims=(8,), split_input=split)
    graphdef, params = nnx.split(model)
    tx, row_opt = optax.adam(1e-2), ro.rowwise_adagrad(0.1)
    table = dt.init_table(SPEC.total_rows, models.embedding_width("deepfm", 4), row_opt, seed=0,
                          stddev=0.1)
    state = state_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), table)
    step = jax.jit(step_lib.make_train_step(graphdef, tx, row_opt), donate_argnums=0)
    db = _device_batch(_batch(3))
    prims.append(_jaxpr_primitives(jax.make_jaxpr(
        lambda p, v, b, g=graphdef: step_lib.forward_logits(g, p, v, b))(
            params, jnp.zeros((B * 3, 5)), db).jaxpr))
    for seed in range(3):
      state, m = step(state, _device_batch(_batch(seed)))
    outs.append((m["loss"], state.table, state.params))
  chex.assert_trees_all_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
  assert "concatenate" in prims[0] and "concatenate" not in prims[1]
