"""A layout's per-table learning rates and initializers in trial programs
(`sfjax/cohorts/table_choices/table_overrides.py`): each trial trains as the trainer does with the same
`data.tables`, on the device program and through the host cohort's first touch."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_call, host_cohort
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import task as trial_data
from sfjax.cohorts.table_choices import table_overrides
from sfjax.core import feature_layout as fl
from sfjax.data import table_settings
from sfjax.embedding import device_table, initializers, row_optimizers
from sfjax.train import step as step_lib
from tests.cohorts.conftest import (
  assert_cohort_equals_each_trial_alone,
  assert_host_cohort_equals_device_program,
)

STEPS = 4
TABLES = "item:learning_rate=0.3; user:init_stddev=0.2,learning_rate=0.01"


@pytest.fixture(scope="module")
def tables_data():
  """The multi-hot smoke task (`ctr.py:multihot_smoke`) with `data.tables = TABLES`."""
  d = ctr_config.get_config("multihot_smoke").data
  d.tables = TABLES
  task = trial_data.CTRTask(d, batch_size=64, eval_rows=512, steps_per_budget_unit=4,
                            eval_batch_size=256)
  return trial_data.TrialData(task)


def _hparams(**overrides):
  values = arch_lib.resolve_hparams({"embedding.learning_rate": 0.05,
                                     "optimizer.learning_rate": 1e-2, "embedding.l2": 1e-4,
                                     "embedding.init_stddev": 0.01, **overrides})
  return {k: jnp.float32(v) for k, v in values.items()}


def test_own_settings_are_read_off_the_layout(tables_data):
  spec = tables_data.spec
  names = [t.name for t in spec.layout.tables]
  rates = dict(zip(names, table_overrides.own_rates(spec), strict=True))
  assert rates == {"user": 0.01, "item": 0.3, "ctx0": 0.0, "ctx1": 0.0, "bag0": 0.0,
                   "bag1": 0.0, "long0": 0.0}
  stddevs = dict(zip(names, table_overrides.own_stddevs(spec).tolist(), strict=True))
  assert stddevs["user"] == pytest.approx(0.2) and sum(stddevs.values()) == pytest.approx(0.2)
  plain = table_settings.with_table_settings(spec, {})  # the fixture's own, unchanged
  assert plain is spec
  bare = ctr_config.get_config("multihot_smoke").data
  bare_spec = trial_data.TrialData(trial_data.CTRTask(
      bare, batch_size=64, eval_rows=512, steps_per_budget_unit=4, eval_batch_size=256)).spec
  assert table_overrides.own_rates(bare_spec) is None
  assert table_overrides.own_stddevs(bare_spec) is None
  assert table_overrides.own_rates(None) is None and table_overrides.own_stddevs(None) is None


def test_row_stddevs_take_each_rows_table(tables_data):
  spec = tables_data.spec
  starts = spec.layout.table_offsets  # user [0, 500), item [500, 1300), ...
  rows = np.asarray([0, 499, 500, 1299, 1300, 1839])
  want = [0.2, 0.2, 0.07, 0.07, 0.07, 0.07]
  host = table_overrides.row_stddevs(spec, 0.07, rows, xp=np)
  assert host.dtype == np.float64  # as the trainer's host initial rows
  np.testing.assert_allclose(host, want, rtol=1e-6)
  traced = jax.jit(lambda s, r: table_overrides.row_stddevs(spec, s, r))(jnp.float32(0.07),
                                                                          jnp.asarray(rows))
  np.testing.assert_allclose(traced, want, rtol=1e-6)
  # compact rows: 3 user rows, 2 item rows, one ctx0 row, one long0 row: each contiguous
  row_ids = np.asarray([3, 40, 400, 600, 700, 1310, 1800])
  compact = table_overrides.compact_table_starts(spec, row_ids)
  assert compact == (0, 3, 5, 6, 6, 6, 6) and len(compact) == len(starts)
  got = table_overrides.row_stddevs(spec, 0.07, np.arange(7), xp=np, table_starts=compact)
  np.testing.assert_allclose(got, [0.2] * 3 + [0.07] * 4, rtol=1e-6)
  with pytest.raises(ValueError,
                     match="^row_stddevs: no table of the data set sets its own init_stddev$"):
    table_overrides.row_stddevs(table_settings.with_table_settings(
        spec, {"user": {"init_stddev": 0.0}}), 0.1, rows)


OWN = {"bag0": {"optimizer": "adam"}, "user": {"optimizer": "rowwise_adagrad"},
       "long0": {"optimizer": "sgd", "learning_rate": 0.5}}


def test_own_optimizers_are_read_off_the_layout(tables_data):
  spec = table_settings.with_table_settings(tables_data.spec, OWN)
  names = dict(zip([t.name for t in spec.layout.tables], table_overrides.own_optimizers(spec),
                   strict=True))
  assert names == {"user": "rowwise_adagrad", "item": "", "ctx0": "", "ctx1": "",
                   "bag0": "adam", "bag1": "", "long0": "sgd"}
  assert table_overrides.own_optimizers(tables_data.spec) is None  # rates and stddevs only
  assert table_overrides.own_optimizers(None) is None


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad", "sgd"])
def test_a_trials_row_update_takes_each_tables_own_optimizer_as_the_trainers(tables_data,
                                                                             optimizer):
  """A trial's row optimizer over tables naming their own (bag0 adam, user rowwise_adagrad,
  long0 sgd at 0.5) and own rates (item 0.3) equals the trainer's `row_optimizer_from_config`
  with the same tables: slots as wide as adam's, each table's rows updated by its own."""
  spec = table_settings.with_table_settings(tables_data.spec, OWN)
  arch, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 4,
                                   "embedding.optimizer": optimizer})
  _, row_opt = trial_program.trial_optimizers(arch, _hparams(), spec)
  cfg = ml_collections.ConfigDict(trial_program._EMB.to_dict())
  cfg.optimizer, cfg.learning_rate = optimizer, 0.05
  want = row_optimizers.row_optimizer_from_config(cfg, spec.layout.tables)
  e = arch.embedding_width
  assert row_opt.slot_width(e) == want.slot_width(e) == 2 * e  # adam's two moments
  tables = jnp.asarray([0, 1, 2, 3, 4, 5, 6, 4], jnp.int32)  # user, item, ..., long0, bag0
  keys = jax.random.split(jax.random.key(1), 2)
  rows = jax.random.normal(keys[0], (8, e))
  grads = jax.random.normal(keys[1], (8, e))
  slot_rows = row_optimizers.initial_slot_rows(want.tables, e)
  chex.assert_trees_all_equal(row_optimizers.initial_slot_rows(row_opt.tables, e), slot_rows)
  slots = jnp.asarray(slot_rows)[tables]
  for count in (1, 2):  # adam's bias correction reads the count
    got = jax.jit(lambda r, s, g, c=count: row_opt.update(r, s, g, c, row_tables=tables))(
        rows, slots, grads)
    ref = jax.jit(lambda r, s, g, c=count: want.update(r, s, g, c, row_tables=tables))(
        rows, slots, grads)
    chex.assert_trees_all_close(got, ref, rtol=1e-6, atol=1e-7)
  adam = row_optimizers.make("adam", 0.05, trial_program._EMB)
  moved, _ = adam.update(rows[4:5], slots[4:5], grads[4:5], 2)
  chex.assert_trees_all_close(got[0][4:5], moved, rtol=1e-6)  # bag0 by adam at the trial's rate
  sgd = rows[6] - 0.5 * grads[6]
  chex.assert_trees_all_close(got[0][6], sgd, rtol=1e-6)  # long0 by sgd at its own 0.5


def test_row_slot_rows_take_each_rows_table_on_the_host_and_traced(tables_data):
  spec = tables_data.spec
  slot_rows = np.arange(7 * 2, dtype=np.float64).reshape(7, 2)  # [T, S]
  rows = np.asarray([0, 499, 500, 1299, 1300, 1839])  # user, user, item, item, ctx0, long0
  want = slot_rows[[0, 0, 1, 1, 2, 6]].astype(np.float32)
  host = table_overrides.row_slot_rows(spec, slot_rows, rows, xp=np)
  assert type(host) is np.ndarray and host.dtype == np.float32
  np.testing.assert_array_equal(host, want)
  traced = jax.jit(lambda r: table_overrides.row_slot_rows(spec, slot_rows, r))(
      jnp.asarray(rows))
  assert traced.dtype == jnp.float32
  np.testing.assert_array_equal(traced, want)
  compact = table_overrides.row_slot_rows(spec, slot_rows, np.arange(3), xp=np,
                                          table_starts=(0, 1, 2, 3, 3, 3, 3))
  np.testing.assert_array_equal(compact, slot_rows[[0, 1, 2]])


def test_fresh_slots_take_their_tables_optimizer(tables_data):
  """The program's draw starts each row from its table's initial slots (bag0 adam: zeros;
  user rowwise_adagrad: one accumulator; the rest the trial's adagrad), as the trainer's
  `device_table.table_inits`; compact rows through their table_starts."""
  spec = table_settings.with_table_settings(tables_data.spec, OWN)
  arch, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 4,
                                   "embedding.optimizer": "adagrad"})
  e, key = arch.embedding_width, jax.random.key(5)
  slots = trial_program.init_trial_state(arch, spec, _hparams(), key).table.opt_slots
  cfg = ml_collections.ConfigDict(trial_program._EMB.to_dict())
  cfg.optimizer, cfg.learning_rate = "adagrad", 0.05
  trainer = row_optimizers.row_optimizer_from_config(cfg, spec.layout.tables)
  inits = device_table.table_inits(spec.layout, e, trainer, 0.01)
  want = inits.slot_rows[fl.row_tables(spec.layout.table_offsets, np.arange(spec.total_rows))]
  chex.assert_trees_all_equal(np.asarray(slots), want)
  assert slots.shape == (spec.total_rows, 2 * e)
  rowwise = row_optimizers.make("rowwise_adagrad", 0.05, trial_program._EMB).initial_slot_row(e)
  np.testing.assert_array_equal(slots[0], [*rowwise] + [0.0] * (2 * e - 1))  # user: row-wise
  acc = np.float32(trial_program._EMB.adagrad_initial_accumulator)
  np.testing.assert_array_equal(slots[600], [acc] * e + [0.0] * e)  # item: the trial's adagrad
  bag0 = spec.layout.table_offsets[4]
  np.testing.assert_array_equal(slots[bag0], [0.0] * (2 * e))  # bag0: adam's moments
  starts = (0, 3, 5, 6, 6, 6, 7)  # 3 user rows, 2 item, 1 ctx0, 1 bag1, 1 long0
  compact = trial_program.init_trial_state(arch, spec, _hparams(), key, 8, starts)
  np.testing.assert_array_equal(compact.table.opt_slots,
                                inits.slot_rows[[0, 0, 0, 1, 1, 2, 5, 6]])
  no_stddev = table_settings.with_table_settings(spec, {"user": {"init_stddev": 0.0}})
  with pytest.raises(ValueError, match="8 compact rows of 1840 need their table_starts "
                                       r"\(tables with their own row optimizer\)"):
    trial_program.init_trial_state(arch, no_stddev, _hparams(), key, 8)


def test_fresh_rows_take_their_tables_stddev(tables_data):
  spec = tables_data.spec
  arch, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 4})
  key = jax.random.key(5)
  got = trial_program.init_trial_state(arch, spec, _hparams(), key).table.values
  # the same unit draw scaled per row: user rows by 0.2, every other row by the trial's 0.01
  wide = trial_program.init_trial_state(arch, spec, _hparams(**{"embedding.init_stddev": 0.2}),
                                        key).table.values
  narrow = trial_program.init_trial_state(
      arch, table_settings.with_table_settings(spec, {"user": {"init_stddev": 0.0}}),
      _hparams(), key).table.values
  np.testing.assert_allclose(got[:500], wide[:500], rtol=1e-6)
  np.testing.assert_allclose(got[500:], narrow[500:], rtol=1e-6)
  assert float(jnp.std(got[:500])) == pytest.approx(0.2, rel=0.05)
  assert float(jnp.std(got[500:])) == pytest.approx(0.01, rel=0.05)
  # compact rows (3 user rows, then others) take their tables' stddevs through table_starts
  compact = trial_program.init_trial_state(arch, spec, _hparams(), key, 7,
                                           (0, 3, 5, 6, 6, 6, 6)).table.values
  unit = jax.random.uniform(jax.random.split(key)[1], (7, arch.embedding_width), jnp.float32,
                            -1.0, 1.0) * np.sqrt(3.0)
  np.testing.assert_allclose(compact, unit * np.asarray([[0.2]] * 3 + [[0.01]] * 4),
                             rtol=1e-6)
  with pytest.raises(ValueError, match="7 compact rows of 1840 need their table_starts"):
    trial_program.init_trial_state(arch, spec, _hparams(), key, 7)


def _trainer_reference(arch, spec, hparams, init, batches, eval_batches, tables, widths=None):
  """The trainer's row optimizer for layout tables `tables` (`row_optimizer_from_config`),
  each row's table from the layout's row ranges (as VSI gives it), the shared step."""
  graph = trial_program.abstract_graphdef(arch, spec)
  tx, _ = trial_program.trial_optimizers(arch, hparams)
  cfg = ml_collections.ConfigDict(trial_program._EMB.to_dict())
  cfg.optimizer = arch.embedding_optimizer
  cfg.learning_rate = float(hparams["embedding.learning_rate"])
  row_opt = row_optimizers.row_optimizer_from_config(cfg, tables, widths)
  step = jax.jit(step_lib.make_train_step(graph, tx, row_opt, l2=hparams["embedding.l2"]))
  state, losses = init, []
  for t in range(STEPS):
    batch = jax.tree.map(lambda x, t=t: x[t], batches)
    row_tables = fl.row_tables(spec.layout.table_offsets, np.asarray(batch.rows))
    state, metrics = step(state, batch._replace(row_tables=jnp.asarray(row_tables, jnp.int32)))
    losses.append(metrics["loss"])
  return state, jnp.stack(losses), trial_program.stacked_eval_logits(graph, state, eval_batches)


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad", "adam"])
def test_a_trials_row_update_takes_each_tables_own_rate_as_the_trainers(tables_data, optimizer):
  """The row optimizer of a trial (traced rate 0.05) updates rows of every table as the
  trainer's `row_optimizer_from_config` with the same tables: item at 0.3, user at 0.01, the
  other tables at the trial's rate (and unlike the trial's rate alone on item and user)."""
  spec = tables_data.spec
  arch, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 4,
                                   "embedding.optimizer": optimizer})
  _, row_opt = trial_program.trial_optimizers(arch, _hparams(), spec)
  _, plain = trial_program.trial_optimizers(arch, _hparams())
  cfg = ml_collections.ConfigDict(trial_program._EMB.to_dict())
  cfg.optimizer, cfg.learning_rate = optimizer, 0.05
  want = row_optimizers.row_optimizer_from_config(cfg, spec.layout.tables)
  e = arch.embedding_width
  keys = jax.random.split(jax.random.key(0), 2)
  rows = jax.random.normal(keys[0], (7, e))
  grads = jax.random.normal(keys[1], (7, e))
  slots = jnp.tile(jnp.asarray(want.initial_slot_row(e)), (7, 1))
  tables = jnp.asarray([0, 1, 2, 3, 4, 5, 6], jnp.int32)  # user, item, ctx0, ..., long0
  got = jax.jit(lambda r, s, g: row_opt.update(r, s, g, 1, row_tables=tables))(rows, slots, grads)
  ref = jax.jit(lambda r, s, g: want.update(r, s, g, 1, row_tables=tables))(rows, slots, grads)
  chex.assert_trees_all_close(got, ref, rtol=1e-6, atol=1e-7)
  alone = plain.update(rows, slots, grads, 1)
  assert not np.allclose(got[0][:2], alone[0][:2])  # user and item: their own rates
  chex.assert_trees_all_close(got[0][2:], alone[0][2:], rtol=1e-6)  # the rest: the trial's


def _lanes_equal_the_trainer(tables_data, spec, optimizer):
  """Two trials of one program (embedding rates 0.05 and 0.2, fresh from their seeds 3 and
  4) over `spec`'s tables, each equal step by step (losses, rows, slots, dense parameters,
  eval logits) to the trainer with the same tables. Returns (arch, lanes, the program's
  losses [2, STEPS], batches)."""
  arch, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                   "model.mlp.depth": 1, "model.mlp.width": 8,
                                   "embedding.optimizer": optimizer})
  lanes = [_hparams(), _hparams(**{"embedding.learning_rate": 0.2})]
  batches = tables_data.train_steps(0, STEPS)
  graphdef = trial_program.program_graphdef(arch, spec)
  cohort = jax.jit(trial_program.make_cohort_fn(arch, spec, graphdef, resume=False))
  stacked = {k: jnp.stack([h[k] for h in lanes]) for k in lanes[0]}
  seeds = jnp.asarray([3, 4], jnp.int32)
  out = cohort(stacked, seeds, None, batches, tables_data.eval_batches)
  for i, hparams in enumerate(lanes):
    init = trial_program.init_trial_state(arch, spec, hparams, jax.random.key(int(seeds[i])))
    state, losses, logits = _trainer_reference(arch, spec, hparams, init, batches,
                                               tables_data.eval_batches, spec.layout.tables)
    got = jax.tree.map(lambda x, i=i: x[i], out.state)
    chex.assert_trees_all_close(out.losses[i], losses, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(got, state, rtol=1e-4, atol=1e-6)
    chex.assert_trees_all_close(out.logits[i], logits, rtol=1e-4, atol=1e-5)
  return arch, lanes, out.losses, batches


@pytest.mark.slow  # ~8 s each: a cohort program and the trainer's step, twice
@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_trials_train_each_table_at_its_own_rate_as_the_trainer(tables_data, optimizer):
  """Item at 0.3, user at 0.01, the rest at the trial's rate, as the trainer."""
  spec = tables_data.spec
  arch, lanes, losses, batches = _lanes_equal_the_trainer(tables_data, spec, optimizer)
  # the tables' own rates matter: every table at the trial's rate trains otherwise
  init = trial_program.init_trial_state(arch, spec, lanes[0], jax.random.key(3))
  _, plain, _ = _trainer_reference(arch, spec, lanes[0], init, batches,
                                   tables_data.eval_batches, None)
  assert not np.allclose(losses[0], plain, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # ~10 s each: a cohort program and the trainer's step
@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_trials_train_each_table_with_its_own_optimizer_as_the_trainer(tables_data, optimizer):
  """OWN's tables (bag0 adam, user rowwise_adagrad, long0 sgd at 0.5; item at 0.3) train
  with their own optimizers, the rest with the trial's, as the trainer."""
  spec = table_settings.with_table_settings(tables_data.spec, OWN)
  arch, lanes, losses, batches = _lanes_equal_the_trainer(tables_data, spec, optimizer)
  # the tables' own optimizers matter: the trainer with the rates alone trains otherwise
  # (from the same rows; the trial's adagrad slots are as wide as its rows)
  init = trial_program.init_trial_state(arch, spec, lanes[0], jax.random.key(3))
  plain = trial_program.init_trial_state(arch, tables_data.spec, lanes[0], jax.random.key(3))
  init = init._replace(table=init.table._replace(opt_slots=plain.table.opt_slots))
  _, alone, _ = _trainer_reference(arch, spec, lanes[0], init, batches, tables_data.eval_batches,
                                   tables_data.spec.layout.tables)
  assert not np.allclose(losses[0], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # ~5 s
def test_own_rates_with_table_dims_equal_the_trainer(tables_data):
  """Rates and dims together (rowwise_adagrad averages a row over its table's dim): a trial
  reading item through 2 columns equals the trainer whose item table has dim 2 too."""
  spec = tables_data.spec
  arch, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                   "model.mlp.depth": 1, "model.mlp.width": 8,
                                   "embedding.optimizer": "rowwise_adagrad"})
  hparams = {**_hparams(), "tables.item.dim": jnp.float32(2)}
  batches = tables_data.train_steps(0, STEPS)
  graphdef = trial_program.program_graphdef(arch, spec)
  cohort = jax.jit(trial_program.make_cohort_fn(arch, spec, graphdef, resume=False))
  out = cohort({k: v[None] for k, v in hparams.items()}, jnp.asarray([3], jnp.int32), None,
               batches, tables_data.eval_batches)
  dimmed = table_settings.with_table_settings(spec, {"item": {"dim": 2}})
  # The program's own draw: item's columns past its dim start at 0, as the trainer's.
  init = trial_program.init_trial_state(arch, spec, hparams, jax.random.key(3))
  widths = fl.table_row_widths(dimmed.layout, arch.embed_dim, arch.embedding_width)
  state, losses, _ = _trainer_reference(arch, dimmed, _hparams(), init, batches,
                                        tables_data.eval_batches, dimmed.layout.tables, widths)
  chex.assert_trees_all_close(out.losses[0], losses, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[0], out.state.table), state.table,
                              rtol=1e-4, atol=1e-6)


def test_host_cohort_first_touch_takes_each_tables_stddev(tables_data):
  spec = tables_data.spec
  ids = np.asarray([1, 499, 500, 1839])
  slot_row = np.asarray([0.1, 0.1], np.float32)
  values, slots = host_cohort.lane_rows([7, 8], [0.01, 0.05], ids, 2, slot_row, spec)
  for w, (seed, stddev) in enumerate([(7, 0.01), (8, 0.05)]):
    want = initializers.init_rows(seed, 0, ids, 2, np.asarray([0.2, 0.2, stddev, stddev]))
    np.testing.assert_array_equal(values[:, 2 * w:2 * w + 2], want)
  np.testing.assert_array_equal(slots, np.tile(slot_row, (4, 2)))
  plain, _ = host_cohort.lane_rows([7], [0.01], ids, 2, slot_row)  # no spec: one stddev
  np.testing.assert_array_equal(plain, initializers.init_rows(7, 0, ids, 2, 0.01))


def test_host_cohort_first_touch_takes_each_tables_initial_slots(tables_data):
  spec = table_settings.with_table_settings(tables_data.spec, OWN)
  ids = np.asarray([1, 600, spec.layout.table_offsets[4], 1839])  # user, item, bag0, long0
  slot_rows = np.arange(7 * 3, dtype=np.float32).reshape(7, 3)  # [T, S]
  _, slots = host_cohort.lane_rows([7, 8], [0.01, 0.05], ids, 2, slot_rows, spec)
  np.testing.assert_array_equal(slots, np.tile(slot_rows[[0, 1, 4, 6]], (1, 2)))


@pytest.mark.slow  # ~20 s: a cache program and a device program
def test_a_host_table_cohort_takes_the_tables_rates_and_stddevs_as_the_device_program():
  """Two lanes through one host table and a device cache (`host_cohort`) with TABLES: the
  first touch draws user rows at 0.2, and the lanes equal the device-table program started
  from the same rows (losses, written rows, eval AUC), each table at its own rate."""
  d = ctr_config.get_config("multihot_smoke").data
  d.tables = TABLES
  task = trial_data.CTRTask(d, batch_size=64, eval_rows=512, eval_batch_size=256,
                            unique_capacity=800, embedding_backend="cache", cache_rows=900,
                            cache_lookahead=1)
  data = trial_data.TrialData(task)
  arch, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                   "model.mlp.depth": 1, "model.mlp.width": 8})
  seeds, steps = (3, 4), 5
  hparams = cohort_call.stacked_hparams({"embedding.learning_rate": np.float32([0.05, 0.2])}, 2)
  values = assert_host_cohort_equals_device_program(data, arch, hparams, seeds, steps)
  e = arch.embedding_width
  # the first touch drew user rows at the table's 0.2, the others at the lane's 0.01
  lane0 = values[:, :e]
  assert float(np.std(lane0[:500])) == pytest.approx(0.2, rel=0.05)
  assert float(np.std(lane0[500:])) == pytest.approx(
      float(hparams["embedding.init_stddev"][0]), rel=0.05)


@pytest.mark.slow  # ~20 s: a cache program and a device program
def test_a_host_table_cohort_takes_the_tables_own_optimizers_as_the_device_program():
  """Two lanes through one host table and a device cache with tables naming their own row
  optimizer (user rowwise_adagrad, bag0 adam): the first touch writes each row its table's
  initial slots, and the lanes equal the device-table program started from the same rows."""
  d = ctr_config.get_config("multihot_smoke").data
  d.tables = ("item:learning_rate=0.3; user:init_stddev=0.2,learning_rate=0.01,"
              "optimizer=rowwise_adagrad; bag0:optimizer=adam")
  task = trial_data.CTRTask(d, batch_size=64, eval_rows=512, eval_batch_size=256,
                            unique_capacity=800, embedding_backend="cache", cache_rows=900,
                            cache_lookahead=1)
  data = trial_data.TrialData(task)
  assert table_overrides.own_optimizers(data.spec) == (
      "rowwise_adagrad", "", "", "", "adam", "", "")
  arch, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                   "model.mlp.depth": 1, "model.mlp.width": 8})
  hparams = cohort_call.stacked_hparams({"embedding.learning_rate": np.float32([0.05, 0.2])}, 2)
  assert_host_cohort_equals_device_program(data, arch, hparams, (3, 4), 5)


@pytest.mark.slow  # ~60 s: two cohorts and their trials alone, fresh and resumed
def test_padded_and_mixed_cohorts_with_tables_own_optimizers_equal_each_trial_alone():
  """Tables naming their own optimizer (bag0 adam, user rowwise_adagrad) inside a padded
  program (fm of embed_dim 2 and 5: adagrad's padded accumulators start at 0 there and stay
  put) and inside a mixed program (adagrad and sgd lanes): each trial as it trains alone."""
  d = ctr_config.get_config("multihot_smoke").data
  d.tables = "item:learning_rate=0.3; user:optimizer=rowwise_adagrad; bag0:optimizer=adam"
  data = trial_data.TrialData(trial_data.CTRTask(d, batch_size=64, eval_rows=512,
                                                 steps_per_budget_unit=4, eval_batch_size=256))
  hparams = [{"embedding.learning_rate": 0.05, "optimizer.learning_rate": 1e-2},
             {"embedding.learning_rate": 0.02, "optimizer.learning_rate": 3e-3}]
  padded = [arch_lib.split_config({"model.name": "fm", "model.embed_dim": dim,
                                   "embedding.optimizer": "adagrad"})[0] for dim in (2, 5)]
  assert_cohort_equals_each_trial_alone(data, padded, hparams, STEPS, num_programs=1)
  mixed = [arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                  "model.mlp.depth": 1, "model.mlp.width": 8,
                                  "embedding.optimizer": name})[0] for name in ("adagrad", "sgd")]
  assert_cohort_equals_each_trial_alone(data, mixed, hparams, STEPS, merge_optimizers=True,
                                        num_programs=1)
