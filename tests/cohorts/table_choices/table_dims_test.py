"""A table's embedding dim as a traced per-trial hyperparameter (`tables.<name>.dim`)."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_call
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import task as trial_data
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.table_choices import table_dims
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.core.types import DeviceBatch
from sfjax.data import table_settings, types
from sfjax.embedding import row_optimizers
from sfjax.train import step as step_lib
from tests.cohorts.conftest import CallRecorder, assert_host_cohort_equals_device_program

LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 5), fl.TableSpec("tag", 7, dim=3), fl.TableSpec("item", 9)),
    (fl.FeatureSpec("user", "user"), fl.FeatureSpec("tags", "tag", "multi_hot", 3),
     fl.FeatureSpec("history", "item", "sequence", 2), fl.FeatureSpec("item", "item")))
SPEC = types.DatasetSpec(tuple(types.FieldSpec(f.name, r) for f, r in
                               zip(LAYOUT.features, (5, 7, 9, 9), strict=True)), 0, LAYOUT)
STEPS = 4


def test_keys_values_and_defaults():
  assert table_dims.dim_key("item") == "tables.item.dim"
  assert table_dims.dimmed_table("tables.item.dim") == "item"
  assert table_dims.dimmed_table("features.item.pooling") is None
  assert table_dims.dimmed_table("tables.item.dims") is None
  assert table_dims.dim_value("k", 4) == 4.0 and table_dims.dim_value("k", np.float32(2)) == 2.0
  assert table_dims.dim_value("k", 0) == 0.0  # the model's dim
  for bad in (-1, 1.5, True, "4", None):
    with pytest.raises(ValueError, match="config key 'k': must be an integer >= 0"):
      table_dims.dim_value("k", bad)
  assert table_dims.default_dims(SPEC) == {"tables.user.dim": 0.0, "tables.tag.dim": 3.0,
                                           "tables.item.dim": 0.0}
  assert table_dims.default_dims(types.DatasetSpec((types.FieldSpec("a", 3),), 0)) == {}
  table_dims.check_dim_keys(SPEC, ["tables.item.dim", "model.name"])
  with pytest.raises(ConfigError, match="tables.tags.dim: 'tags' is not a table of the data "
                                        "set \\(its tables: user, tag, item\\)"):
    table_dims.check_dim_keys(SPEC, ["tables.tags.dim"])
  with pytest.raises(ConfigError, match=r"'item' is not a table of the data set \(its tables: "
                                        r"none\)"):
    table_dims.check_dim_keys(types.DatasetSpec((types.FieldSpec("a", 3),), 0),
                              ["tables.item.dim"])
  assert [t.dim for t in table_dims.undimmed_spec(SPEC).layout.tables] == [0, 0, 0]
  assert table_dims.undimmed_spec(table_dims.undimmed_spec(SPEC)) == table_dims.undimmed_spec(SPEC)
  plain = types.DatasetSpec((types.FieldSpec("a", 3),), 0)
  assert table_dims.undimmed_spec(plain) is plain
  assert table_dims.uses_dims(SPEC, {})  # the data set's own tag dim
  undimmed = table_dims.undimmed_spec(SPEC)
  assert not table_dims.uses_dims(undimmed, {"model.name": "fm"})
  assert table_dims.uses_dims(undimmed, {"tables.item.dim": 2.0})
  one = table_settings.with_table_settings(undimmed, {"user": {"dim": 1}})
  assert table_dims.uses_dims(one, {})  # a data set's own dim of 1 is a dim too


def test_live_columns_equal_the_trainers_for_fixed_dims():
  """The traced mask is `feature_layout.live_columns` of the layout with those dims, with
  and without a first-order column, the data set's own dim kept where no key is set."""
  for width in (4, 5):
    got = table_dims.traced_live_columns(SPEC, {"tables.item.dim": jnp.float32(1.0)}, 4, width)
    dimmed = table_settings.with_table_settings(SPEC, {"item": {"dim": 1}})
    want = fl.live_columns(dimmed.layout, 4, width)
    np.testing.assert_array_equal(np.asarray(got), want)
  widths = table_dims.row_widths(SPEC, {"tables.user.dim": 2}, 4, 5)
  np.testing.assert_array_equal(np.asarray(widths), [3.0, 4.0, 5.0])
  dimmed = table_settings.with_table_settings(SPEC, {"user": {"dim": 2}})
  want = [w or 5 for w in fl.table_row_widths(dimmed.layout, 4, 5)]
  np.testing.assert_array_equal(np.asarray(widths), want)


def test_row_tables_read_off_the_columns_equal_the_layouts_row_ranges():
  # [B=2, S=7]: user | tags (3) | history (2) | item; vids into 7 unique rows + padding (7).
  rows = np.asarray([0, 5, 6, 12, 14, 13, 1, 21], np.int32)  # global rows; 21 = padding
  vids = np.asarray([[0, 1, 2, 7, 3, 4, 3], [6, 2, 7, 7, 5, 7, 5]], np.int32)
  batch = DeviceBatch(jnp.asarray(rows), jnp.asarray(vids), None, None, None)
  got = np.asarray(table_dims.with_row_tables(SPEC, batch).row_tables)
  want = fl.row_tables(LAYOUT.table_offsets, rows)
  np.testing.assert_array_equal(got[:7], want[:7])  # the padding entry's table is any


def test_row_width_optimizer_updates_each_row_by_its_tables_width():
  grads = jax.random.normal(jax.random.key(0), (3, 5))
  rows, slots = jnp.ones((3, 5)), jnp.full((3, 1), 0.1)
  widths = jnp.asarray([3.0, 5.0])

  def make(row_width):
    return row_optimizers.rowwise_adagrad(0.1, row_width=row_width)

  opt = table_dims.row_width_optimizer(make, widths)
  assert opt.tables and opt.slot_width(5) == 1 and opt.name == "rowwise_adagrad"
  np.testing.assert_array_equal(opt.initial_slot_row(5), make(None).initial_slot_row(5))
  got = opt.update(rows, slots, grads, 1, row_tables=jnp.asarray([1, 0, 1]))
  for i, w in enumerate((5.0, 3.0, 5.0)):
    want = make(w).update(rows[i:i + 1], slots[i:i + 1], grads[i:i + 1], 1)
    chex.assert_trees_all_close((got[0][i:i + 1], got[1][i:i + 1]), want, rtol=1e-6)
  with pytest.raises(ValueError, match=r"^row_width_optimizer needs row_tables "
                                       r"\(DeviceBatch\.row_tables\)$"):
    opt.update(rows, slots, grads, 1)
  # An optimizer that reads the step count (adam's bias correction) gets it.
  adam = table_dims.row_width_optimizer(lambda w: row_optimizers.adam(0.1), widths)
  adam_slots = jnp.zeros((3, 10))
  got = adam.update(rows, adam_slots, grads, 3, row_tables=jnp.asarray([1, 0, 1]))
  chex.assert_trees_all_close(got, row_optimizers.adam(0.1).update(rows, adam_slots, grads, 3))


def test_split_config_checks_dims_against_the_model():
  arch, hparams = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                         "tables.item.dim": 2})
  assert hparams["tables.item.dim"] == 2.0
  _, full = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                   "tables.item.dim": 4})  # as wide as the model: allowed
  assert full["tables.item.dim"] == 4.0
  assert arch == arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4})[0]
  with pytest.raises(ValueError, match="'tables.item.dim': 8 is above the model's embedding "
                                       "dim 4"):
    arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4, "tables.item.dim": 8})
  with pytest.raises(ValueError, match="'tables.item.dim': model 'lr' has no per-table"):
    arch_lib.split_config({"model.name": "lr", "tables.item.dim": 2})
  with pytest.raises(ValueError, match="'tables.item.dim': must be an integer >= 0"):
    arch_lib.split_config({"model.name": "fm", "tables.item.dim": -2})


def test_trainer_tables_keep_the_recipes_settings():
  config = {"model.name": "fm", "tables.item.dim": 2.0, "tables.user.dim": 4}
  got = table_dims.trainer_tables(config, "item:optimizer=adagrad,dim=8; tag:dim=1")
  assert table_settings.parse_table_settings(got) == {
      "item": {"optimizer": "adagrad", "dim": 2}, "tag": {"dim": 1}, "user": {"dim": 4}}
  assert table_dims.trainer_tables({"model.name": "fm"}, "tag:dim=1") == "tag:dim=1"
  assert table_dims.trainer_tables(config) == "item:dim=2; user:dim=4"
  # 0 (the model's dim) overrides the recipe's own dim of that table
  assert table_dims.trainer_tables({"tables.tag.dim": 0}, "tag:dim=1") == "tag:dim=0"
  with pytest.raises(ValueError, match="config key 'tables.tag.dim': must be an integer"):
    table_dims.trainer_tables({"tables.tag.dim": 2.5})


def _hparams(**overrides):
  values = arch_lib.resolve_hparams({"embedding.learning_rate": 0.05,
                                     "optimizer.learning_rate": 1e-2, "embedding.l2": 1e-4,
                                     **overrides})
  return {k: jnp.float32(v) for k, v in values.items()}


def _trainer_reference(arch, spec, dims, init, batches, eval_batches):
  """The trainer's way to a model whose tables have `dims`: a layout with those dims
  (`PooledInput` masks), the trainer's row optimizer (`row_optimizer_from_config`, per-table
  row widths) and each row's table from the layout's row ranges, as VSI gives it."""
  dimmed = table_settings.with_table_settings(spec, {t: {"dim": d} for t, d in dims.items()})
  graph = trial_program.abstract_graphdef(arch, dimmed)
  tx, _ = trial_program.trial_optimizers(arch, _hparams())
  cfg = ml_collections.ConfigDict(trial_program._EMB.to_dict())
  cfg.optimizer, cfg.learning_rate = arch.embedding_optimizer, 0.05
  latent = arch.embed_dim
  row_opt = row_optimizers.row_optimizer_from_config(
      cfg, dimmed.layout.tables,
      fl.table_row_widths(dimmed.layout, latent, arch.embedding_width))
  step = jax.jit(step_lib.make_train_step(graph, tx, row_opt, l2=_hparams()["embedding.l2"]))
  starts = spec.layout.table_offsets
  state, losses = init, []
  for t in range(STEPS):
    batch = jax.tree.map(lambda x, t=t: x[t], batches)
    row_tables = fl.row_tables(starts, np.asarray(batch.rows)).astype(np.int32)
    state, metrics = step(state, batch._replace(row_tables=jnp.asarray(row_tables)))
    losses.append(metrics["loss"])
  logits = trial_program.stacked_eval_logits(graph, state, eval_batches)
  return state, jnp.stack(losses), logits


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adagrad"])
def test_traced_dims_equal_the_trainer_with_those_dims(layout_data, optimizer):
  """Three trials of one program whose tables' dims differ (item 2, user 1; bag1 3; none),
  vmapped as one cohort, each equal step by step (losses, rows, slots, dense parameters,
  eval logits) to the trainer with `data.tables` set to its dims; the history shares the
  item table, so its columns follow item's dim."""
  spec = layout_data.spec
  arch, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                   "model.mlp.depth": 1, "model.mlp.width": 8,
                                   "embedding.optimizer": optimizer})
  choices = [{"item": 2, "user": 1}, {"bag1": 3}, {"item": 0}]  # 0: the model's dim
  batches = layout_data.train_steps(0, STEPS)
  graphdef = trial_program.program_graphdef(arch, spec)
  cohort = jax.jit(trial_program.make_cohort_fn(arch, spec, graphdef, resume=True))
  stacked = {k: jnp.stack([v] * 3) for k, v in _hparams().items()}
  for table in ("item", "user", "bag1"):
    stacked[f"tables.{table}.dim"] = jnp.asarray([c.get(table, 4) for c in choices], jnp.float32)
  stacked["tables.bag0.dim"] = jnp.asarray([0, 0, 0], jnp.float32)
  init = trial_program.init_trial_state(arch, spec, _hparams(), jax.random.key(3))
  inits = jax.tree.map(lambda x: jnp.stack([x] * 3), init)
  out = cohort(stacked, jnp.zeros(3, jnp.int32), inits, batches, layout_data.eval_batches)
  for i, dims in enumerate(choices):
    state, losses, logits = _trainer_reference(arch, spec, dims, init, batches,
                                               layout_data.eval_batches)
    got = jax.tree.map(lambda x, i=i: x[i], out.state)
    chex.assert_trees_all_close(out.losses[i], losses, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(got, state, rtol=1e-4, atol=1e-6)
    chex.assert_trees_all_close(out.logits[i], logits, rtol=1e-4, atol=1e-5)
  assert not np.allclose(out.losses[0], out.losses[2])  # the dims differ for real
  assert not np.allclose(out.losses[1], out.losses[2])


def test_a_dim_for_a_model_without_latent_columns_is_refused(layout_data):
  arch, _ = arch_lib.split_config({"model.name": "lr"})
  with pytest.raises(ConfigError, match="model 'lr' has no per-table embedding dims"):
    trial_program.trial_live_columns(arch, layout_data.spec, {"tables.item.dim": 1.0})


@pytest.mark.slow  # ~25 s: two programs
def test_trials_that_differ_only_in_dims_share_one_program(layout_data):
  """The runner puts trials whose tables' dims differ (one of them with the data set's
  own) in one program call of three lanes, each trial's result its solo run's."""
  arch, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 4,
                                   "embedding.optimizer": "rowwise_adagrad"})
  hparams = [{"tables.item.dim": 2, "tables.bag1.dim": 1}, {"tables.user.dim": 3}, {}]
  shared = CallRecorder(layout_data.task, data=layout_data, cohort_width=4)
  together = shared.run(arch, hparams, [1, 2, 3], [0] * 3, 6, [None] * 3)
  assert [lanes for lanes, _, _ in shared.calls] == [4]  # 3 trials + a padding lane
  solo = CohortRunner(layout_data.task, data=layout_data, cohort_width=1)
  for i, h in enumerate(hparams):
    alone = solo.run(arch, [h], [i + 1], [0], 6, [None])[0]
    chex.assert_trees_all_close(together[i].state, alone.state, rtol=1e-5, atol=1e-6)
    assert together[i].metrics["auc"] == pytest.approx(alone.metrics["auc"], abs=1e-6)
  assert together[0].metrics["auc"] != together[2].metrics["auc"]


@pytest.mark.slow  # ~20 s: a cache program and a device program
def test_a_host_table_cohort_reads_each_lanes_dims_as_the_device_program():
  """Two lanes of different item and bag1 dims through one host table and a device cache
  (`host_cohort`, the cache backend's cohorts) equal the device-table program from the same
  rows: losses, written rows and eval AUC per lane."""
  d = ctr_config.get_config("multihot_smoke").data
  task = trial_data.CTRTask(d, batch_size=64, eval_rows=512, eval_batch_size=256,
                            unique_capacity=800, embedding_backend="cache", cache_rows=900,
                            cache_lookahead=1)
  data = trial_data.TrialData(task)
  arch, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                   "model.mlp.depth": 1, "model.mlp.width": 8,
                                   "embedding.optimizer": "rowwise_adagrad"})
  seeds, steps = (3, 4), 5
  hparams = cohort_call.stacked_hparams({"tables.item.dim": np.float32([2, 0]),
                                         "tables.bag1.dim": np.float32([1, 3])}, 2)
  assert_host_cohort_equals_device_program(data, arch, hparams, seeds, steps)

@pytest.mark.slow  # ~30 s: a padded program and two solo ones
def test_dims_inside_a_padded_program_of_wider_rows_equal_solo_runs(layout_data):
  """Trials of embed_dim 4 and 8 share one padded program of 8-wide rows (`buckets`:
  a trial's columns [0, d) keep their places), each reading its tables through its own dims
  there: each equals its solo run."""
  archs = [arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": d,
                                  "model.mlp.depth": 1, "model.mlp.width": 8,
                                  "embedding.optimizer": "adagrad"})[0] for d in (4, 8)]
  hparams = [{"tables.item.dim": 2, "tables.user.dim": 3}, {"tables.item.dim": 6}]
  shared = CallRecorder(layout_data.task, data=layout_data, cohort_width=2)
  together = shared.run(archs, hparams, [1, 2], [0, 0], 6, [None, None])
  assert [lanes for lanes, _, _ in shared.calls] == [2]  # one padded program
  solo = CohortRunner(layout_data.task, data=layout_data, cohort_width=1)
  for i, (arch, h) in enumerate(zip(archs, hparams, strict=True)):
    alone = solo.run(arch, [h], [i + 1], [0], 6, [None])[0]
    chex.assert_trees_all_close(together[i].state, alone.state, rtol=1e-5, atol=1e-6)
    assert together[i].metrics["auc"] == pytest.approx(alone.metrics["auc"], abs=1e-6)


def test_fresh_rows_start_at_zero_past_each_tables_dim_as_the_trainers():
  # SPEC: user 5 rows, tag 7 (its own dim 3), item 9; a trial sets item's dim to 1.
  arch, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4})
  width = arch.embedding_width  # 4 latent columns + the first-order one
  hparams = _hparams(**{"tables.item.dim": 1})
  values = np.asarray(trial_program.init_trial_state(arch, SPEC, hparams,
                                                     jax.random.key(0)).table.values)
  assert values.shape == (SPEC.total_rows, width)
  assert (values[:5] != 0).all()  # user: the model's dim, every column
  assert (values[5:12, 3:4] == 0).all() and (values[5:12, [0, 1, 2, 4]] != 0).all()
  assert (values[12:, 1:4] == 0).all() and (values[12:, [0, 4]] != 0).all()
  # The same mask as numpy (the host cohort's) and for compact rows: rows 0, 6, 13 and 20.
  live = table_dims.row_live_columns(SPEC, {"tables.item.dim": 1.0}, 4, width,
                                     np.arange(SPEC.total_rows), xp=np)
  chex.assert_trees_all_equal(live, values != 0)
  compact = trial_program.init_trial_state(arch, SPEC, hparams, jax.random.key(0), num_rows=4,
                                           table_starts=(0, 1, 2)).table.values
  chex.assert_trees_all_equal(np.asarray(compact) != 0, live[[0, 6, 13, 20]])
  with pytest.raises(ValueError, match="4 compact rows of 21 need their table_starts "
                                       r"\(tables with their own dims\)"):
    trial_program.init_trial_state(arch, SPEC, hparams, jax.random.key(0), num_rows=4)
  # Without dims (an undimmed data set, no dim key) every column is drawn.
  plain = trial_program.init_trial_state(arch, table_dims.undimmed_spec(SPEC), _hparams(),
                                         jax.random.key(0)).table.values
  assert (np.asarray(plain) != 0).all()


def test_lane_rows_zero_each_lanes_columns_past_its_tables_dim():
  from sfjax.cohorts import host_cohort  # pylint: disable=import-outside-toplevel
  ids = np.array([2, 6, 15], np.int64)  # a user, a tag and an item row
  slot_row = np.asarray([0.1], np.float32)
  dims = [{"tables.item.dim": 2.0}, {}]  # lane 1: the data set's dims (tag 3)
  values, _ = host_cohort.lane_rows([7, 8], [0.1, 0.2], ids, 5, slot_row, SPEC, dims, 4)
  plain, _ = host_cohort.lane_rows([7, 8], [0.1, 0.2], ids, 5, slot_row, SPEC)
  want = plain.copy()
  want[1, 3:4] = want[1, 8:9] = 0.0  # the tag row: dim 3 in both lanes
  want[2, 2:4] = 0.0  # the item row: dim 2 in lane 0 only
  chex.assert_trees_all_equal(values, want)
  assert (plain != 0).all()
