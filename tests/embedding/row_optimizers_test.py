"""Row optimizers against hand-computed numbers, under jit."""

import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.embedding import device_table
from sfjax.embedding import row_optimizers as ro

W = np.array([[0.5, -1.0]], np.float32)
G = np.array([[0.2, -0.4]], np.float32)


def _run(opt, rows, grads, count=1, slots=None):
  if slots is None:
    slots = np.broadcast_to(opt.initial_slot_row(rows.shape[1]), (rows.shape[0], opt.slot_width(rows.shape[1])))
  return jax.jit(opt.update)(jnp.asarray(rows), jnp.asarray(slots), jnp.asarray(grads), jnp.int32(count))


def test_sgd():
  w, s = _run(ro.sgd(0.1), W, G)
  chex.assert_trees_all_close(w, np.array([[0.48, -0.96]]), atol=1e-6)
  chex.assert_shape(s, (1, 0))


def test_adagrad_two_steps():
  opt = ro.adagrad(0.1, initial_accumulator=0.1)
  w, s = _run(opt, W, G)
  # acc = 0.1 + g^2 = [0.14, 0.26]; w -= 0.1 * g / sqrt(acc)
  chex.assert_trees_all_close(s, np.array([[0.14, 0.26]]), atol=1e-6)
  chex.assert_trees_all_close(w, np.array([[0.5 - 0.02 / np.sqrt(0.14), -1.0 + 0.04 / np.sqrt(0.26)]]), atol=1e-6)
  w2, s2 = _run(opt, np.asarray(w), G, count=2, slots=np.asarray(s))
  chex.assert_trees_all_close(s2, np.array([[0.18, 0.42]]), atol=1e-6)
  chex.assert_trees_all_close(w2, np.asarray(w) - 0.1 * G / np.sqrt([[0.18, 0.42]]), atol=1e-6)


def test_adagrad_element_never_initialised_keeps_its_value():
  """A padded slot column of a search program (accumulator 0, gradient always 0) keeps its
  value and its 0 (not 0/0); an element with a gradient on a 0 accumulator moves by the
  gradient's sign, as Adagrad's first step from 0 does."""
  rows = np.array([[0.5, -1.0, 2.0]], np.float32)
  grads = np.array([[0.2, 0.0, -0.5]], np.float32)
  slots = np.array([[0.1, 0.0, 0.0]], np.float32)
  w, s = _run(ro.adagrad(0.1), rows, grads, slots=slots)
  acc = 0.1 + 0.2**2
  chex.assert_trees_all_close(w, np.array([[0.5 - 0.1 * 0.2 / np.sqrt(acc), -1.0, 2.0 + 0.1]]),
                              atol=1e-6)
  chex.assert_trees_all_close(s, np.array([[acc, 0.0, 0.25]]), atol=1e-7)
  chex.assert_tree_all_finite((w, s))


def test_rowwise_adagrad_two_rows_two_steps():
  # lr 0.3, a0 = 1; one accumulator per row, fed mean_j(g_j^2) over the row's E = 2 columns.
  opt = ro.rowwise_adagrad(0.3, initial_accumulator=1.0)
  assert opt.slot_width(2) == 1 and opt.slot_width(17) == 1
  chex.assert_trees_all_close(opt.initial_slot_row(2), np.array([1.0], np.float32))
  rows = np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)
  # Step 1: row 0 g = [2.4, -3.2]: a = 1 + (5.76 + 10.24) / 2 = 9, w -= 0.3 * g / 3 = 0.1 g.
  #         row 1 g = 0: unchanged, a stays 1.
  g1 = np.array([[2.4, -3.2], [0.0, 0.0]], np.float32)
  w, s = _run(opt, rows, g1)
  chex.assert_shape(s, (2, 1))
  chex.assert_trees_all_close(s, np.array([[9.0], [1.0]]), atol=1e-5)
  chex.assert_trees_all_close(w, np.array([[0.76, 2.32], [-1.0, 0.5]]), atol=1e-6)
  # Step 2: row 0 g = [4, -4]: a = 9 + 16 = 25, w -= 0.3 * g / 5 = [0.24, -0.24].
  #         row 1 g = [0, 4]: a = 1 + 8 = 9, w -= 0.3 * g / 3 = [0, 0.4]: column 0 does not
  #         move, but its accumulator is the row's (element-wise Adagrad would keep it at 1).
  g2 = np.array([[4.0, -4.0], [0.0, 4.0]], np.float32)
  w2, s2 = _run(opt, np.asarray(w), g2, count=2, slots=np.asarray(s))
  chex.assert_trees_all_close(s2, np.array([[25.0], [9.0]]), atol=1e-5)
  chex.assert_trees_all_close(w2, np.array([[0.52, 2.56], [-1.0, 0.1]]), atol=1e-6)


def test_rowwise_adagrad_equals_adagrad_at_width_one():
  g = np.array([[0.2], [-0.4], [0.0]], np.float32)
  w = np.array([[0.5], [-1.0], [3.0]], np.float32)
  for step in (1, 2):
    got = _run(ro.rowwise_adagrad(0.1, 0.1), w, g * step)
    want = _run(ro.adagrad(0.1, 0.1), w, g * step)
    chex.assert_trees_all_close(got, want, atol=1e-7)


@pytest.mark.parametrize("traced", [False, True])
def test_rowwise_adagrad_row_width_averages_over_the_rows_own_columns(traced):
  # Rows of width e = 3 padded with zero-gradient columns to E = 5 (a lane of a wider cohort
  # program): with row_width=e the update is the e-column row's own, the padding stays put.
  key = jax.random.split(jax.random.key(0), 3)
  rows, grads = jax.random.normal(key[0], (4, 3)), jax.random.normal(key[1], (4, 3))
  slots = jnp.abs(jax.random.normal(key[2], (4, 1))) + 0.1
  pad = jnp.full((4, 2), 7.0)
  want_rows, want_slots = ro.rowwise_adagrad(0.2, 0.1).update(rows, slots, grads, jnp.int32(1))

  def padded(width):
    opt = ro.rowwise_adagrad(0.2, 0.1, row_width=width)
    return opt.update(jnp.concatenate([rows, pad], 1), slots,
                      jnp.concatenate([grads, jnp.zeros((4, 2))], 1), jnp.int32(1))

  got_rows, got_slots = jax.jit(padded)(jnp.float32(3)) if traced else padded(3)
  chex.assert_trees_all_close(got_slots, want_slots, rtol=1e-6)
  chex.assert_trees_all_close(got_rows[:, :3], want_rows, rtol=1e-6)
  np.testing.assert_array_equal(got_rows[:, 3:], pad)
  # without it the padded row's mean is over 5 columns: a smaller accumulator step
  _, mean_slots = ro.rowwise_adagrad(0.2, 0.1).update(
      jnp.concatenate([rows, pad], 1), slots, jnp.concatenate([grads, jnp.zeros((4, 2))], 1),
      jnp.int32(1))
  assert (np.asarray(mean_slots - slots) < 0.99 * np.asarray(want_slots - slots)).all()


def test_rowwise_adagrad_padding_rows_are_harmless():
  """A padded unique set through the device table: padding (row V) reads zero slots and
  zero gradients, its NaN update is dropped, and real rows do not see it."""
  opt = ro.rowwise_adagrad(0.3, initial_accumulator=1.0)
  num_rows = 4
  table = device_table.TableState(
      jnp.arange(8, dtype=jnp.float32).reshape(num_rows, 2),
      jnp.ones((num_rows, 1), jnp.float32))
  real = jnp.array([2, 0], jnp.int32)
  padded = jnp.array([2, 0, num_rows, num_rows], jnp.int32)  # pad = V
  g_real = jnp.array([[2.4, -3.2], [0.0, 0.0]], jnp.float32)
  g_padded = jnp.concatenate([g_real, jnp.zeros((2, 2), jnp.float32)])

  @jax.jit
  def step(table, rows, grads):
    uniq = device_table.gather_rows(table, rows)
    values, slots = opt.update(uniq.values, uniq.opt_slots, grads, jnp.int32(1))
    return device_table.scatter_rows(table, rows, device_table.TableState(values, slots))

  got = step(table, padded, g_padded)
  want = step(table, real, g_real)
  chex.assert_tree_all_finite(got)
  chex.assert_trees_all_close(got, want)
  # Row 2 moved (a = 9, w -= 0.1 g); row 0 had a zero gradient and is unchanged.
  chex.assert_trees_all_close(got.values[2], np.array([4.0 - 0.24, 5.0 + 0.32]), atol=1e-6)
  chex.assert_trees_all_close(got.opt_slots[:, 0], np.array([1.0, 1.0, 9.0, 1.0]), atol=1e-5)
  chex.assert_trees_all_close(got.values[np.array([0, 1, 3])], table.values[np.array([0, 1, 3])])


def test_adam_first_step_and_bias_correction():
  opt = ro.adam(0.01, b1=0.9, b2=0.999, eps=1e-8)
  w, s = _run(opt, W, G)
  # t=1: mhat = g, vhat = g^2 -> w -= lr * sign(g) (up to eps)
  chex.assert_trees_all_close(w, W - 0.01 * np.sign(G), atol=1e-6)
  chex.assert_trees_all_close(s, np.concatenate([0.1 * G, 0.001 * G * G], axis=1), atol=1e-7)
  # t=5 with given moments: hand formula
  m, v = np.array([[0.05, 0.01]]), np.array([[0.002, 0.003]])
  w5, _ = _run(opt, W, G, count=5, slots=np.concatenate([m, v], 1).astype(np.float32))
  m1, v1 = 0.9 * m + 0.1 * G, 0.999 * v + 0.001 * G * G
  expect = W - 0.01 * (m1 / (1 - 0.9**5)) / (np.sqrt(v1 / (1 - 0.999**5)) + 1e-8)
  chex.assert_trees_all_close(w5, expect, atol=1e-6)


def test_ftrl_hand_computed():
  lr, l1, l2, beta = 0.1, 0.05, 0.01, 0.5
  opt = ro.ftrl(lr, l1=l1, l2=l2, beta=beta, initial_accumulator=0.1)
  w, s = _run(opt, W, G)
  n0, z0 = 0.1, 0.0
  n1 = n0 + G**2
  sigma = (np.sqrt(n1) - np.sqrt(n0)) / lr
  z1 = z0 + G - sigma * W
  expect = np.where(np.abs(z1) <= l1, 0.0, -(z1 - np.sign(z1) * l1) / ((beta + np.sqrt(n1)) / lr + l2))
  chex.assert_trees_all_close(w, expect, atol=1e-6)
  chex.assert_trees_all_close(s, np.concatenate([z1, n1], 1), atol=1e-6)


def test_ftrl_l1_zeroes_small_weights():
  opt = ro.ftrl(0.1, l1=10.0)
  w, _ = _run(opt, W, G)
  chex.assert_trees_all_close(w, np.zeros_like(W))


def test_zero_gradient_rows_unchanged_for_sgd_and_adagrads():
  for opt in (ro.sgd(0.3), ro.adagrad(0.3), ro.rowwise_adagrad(0.3)):
    w, s = _run(opt, W, np.zeros_like(G))
    chex.assert_trees_all_close(w, W)
    chex.assert_trees_all_close(s, np.broadcast_to(opt.initial_slot_row(2), s.shape))


@pytest.mark.parametrize("name", ro.ROW_OPTIMIZER_NAMES)
def test_from_config(name):
  from experiments.configs import ctr
  cfg = ctr.get_config().embedding
  cfg.optimizer = name
  opt = ro.row_optimizer_from_config(cfg)
  assert opt.name == name
  assert opt.initial_slot_row(3).shape == (opt.slot_width(3),)


def test_bad_config_names_field():
  from experiments.configs import ctr
  cfg = ctr.get_config().embedding
  cfg.optimizer = "lamb"
  with pytest.raises(ValueError, match="embedding.optimizer"):
    ro.row_optimizer_from_config(cfg)
  with pytest.raises(ValueError, match="initial_accumulator"):
    ro.adagrad(0.1, initial_accumulator=0.0)
  with pytest.raises(ValueError, match="rowwise_adagrad initial_accumulator"):
    ro.rowwise_adagrad(0.1, initial_accumulator=0.0)


def _per_table_case():
  opts = (ro.sgd(0.5), ro.adagrad(0.1), ro.rowwise_adagrad(0.05), ro.adam(0.01))
  rng = np.random.default_rng(0)
  u, e = 12, 3
  row_tables = np.array([0, 1, 2, 3, 2, 1, 0, 3, 3, 1, 2, 0], np.int32)
  rows = rng.normal(size=(u, e)).astype(np.float32)
  grads = rng.normal(size=(u, e)).astype(np.float32)
  slots = rng.uniform(0.1, 1.0, size=(u, 2 * e)).astype(np.float32)  # S = max = adam's 2E
  return opts, row_tables, rows, grads, slots


def test_per_table_moves_each_row_exactly_as_its_tables_optimizer_alone():
  opts, row_tables, rows, grads, slots = _per_table_case()
  opt = ro.per_table(opts)
  assert opt.slot_width(3) == 6 and opt.tables == opts
  update = jax.jit(lambda r, s, g, c, t: opt.update(r, s, g, c, row_tables=t))
  new_rows, new_slots = update(rows, slots, grads, jnp.int32(4), row_tables)
  for t, alone in enumerate(opts):
    mine = row_tables == t
    width = alone.slot_width(3)
    want_rows, want_slots = jax.jit(alone.update)(rows[mine], slots[mine, :width], grads[mine],
                                                  jnp.int32(4))
    np.testing.assert_array_equal(np.asarray(new_rows)[mine], np.asarray(want_rows))
    np.testing.assert_array_equal(np.asarray(new_slots)[mine, :width], np.asarray(want_slots))
    # The columns this table's optimizer does not use stay as they were.
    np.testing.assert_array_equal(np.asarray(new_slots)[mine, width:], slots[mine, width:])
  assert not np.array_equal(np.asarray(new_rows), rows)


def test_per_table_equal_keys_share_one_update_with_the_same_result():
  opts, row_tables, rows, grads, slots = _per_table_case()
  keys = [("sgd", 0.5), ("adagrad", 0.1), ("rowwise_adagrad", 0.05), ("adam", 0.01)]
  shared = ro.per_table(opts + (ro.sgd(0.5),), keys=keys + [("sgd", 0.5)])
  row_tables = np.where(row_tables == 0, 4, row_tables).astype(np.int32)  # table 4 = table 0
  got = shared.update(rows, slots, grads, jnp.int32(2), row_tables=row_tables)
  want = ro.per_table(opts).update(rows, slots, grads, jnp.int32(2),
                                   row_tables=np.where(row_tables == 4, 0, row_tables))
  chex.assert_trees_all_equal(got, want)
  with pytest.raises(ValueError, match="row_tables"):
    shared.update(rows, slots, grads, jnp.int32(2))


def test_initial_slot_rows_pad_each_tables_row():
  got = ro.initial_slot_rows((ro.sgd(1.0), ro.rowwise_adagrad(1.0, 0.3), ro.ftrl(1.0)), 2)
  np.testing.assert_allclose(got, [[0, 0, 0, 0], [0.3, 0, 0, 0], [0, 0, 0.1, 0.1]])


def test_optimizer_from_config_with_table_settings():
  cfg = types.SimpleNamespace(optimizer="adagrad", learning_rate=0.2,
                              adagrad_initial_accumulator=0.1)
  plain = (fl.TableSpec("a", 3), fl.TableSpec("b", 4, init_stddev=0.5))
  assert ro.row_optimizer_from_config(cfg, plain).tables == ()  # init only: one optimizer
  opt = ro.row_optimizer_from_config(cfg, (fl.TableSpec("a", 3), fl.TableSpec("b", 4, "sgd")))
  assert [o.name for o in opt.tables] == ["adagrad", "sgd"] and opt.slot_width(2) == 2
  with pytest.raises(ConfigError, match=r"features\.tables\.b\.optimizer"):
    ro.row_optimizer_from_config(cfg, (fl.TableSpec("a", 3), fl.TableSpec("b", 4, "adamw")))


def test_row_dtype_rounds_the_float32_update_and_keeps_slots_float32():
  cfg = types.SimpleNamespace(optimizer="adagrad", learning_rate=0.2,
                              adagrad_initial_accumulator=0.1)
  plain = ro.row_optimizer_from_config(cfg)
  assert ro.with_row_dtype(plain, "float32") is plain  # float32: the optimizer itself
  cfg.dtype = "bfloat16"
  half = ro.row_optimizer_from_config(cfg)
  slots = np.full((1, 2), 0.1, np.float32)
  want_rows, want_slots = _run(plain, W, G, slots=slots)
  got_rows, got_slots = jax.jit(half.update)(W, slots, G, 1)
  assert got_rows.dtype == jnp.bfloat16 and got_slots.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(got_rows), np.asarray(want_rows).astype(jnp.bfloat16))
  np.testing.assert_array_equal(np.asarray(got_slots), np.asarray(want_slots))
  cfg.stochastic_rounding = True  # the same update, rounded to a neighbour keyed by the step
  sr = jax.jit(ro.row_optimizer_from_config(cfg).update)
  out = np.asarray(sr(W, slots, G, 1)[0]).astype(np.float32)
  np.testing.assert_array_equal(out, np.asarray(sr(W, slots, G, 1)[0]).astype(np.float32))
  assert np.all(np.abs(out - np.asarray(want_rows)) < 2.0 ** -7)
  with pytest.raises(ConfigError, match=r"embedding\.dtype"):
    ro.row_optimizer_from_config(types.SimpleNamespace(**{**vars(cfg), "dtype": "fp8"}))


def test_default_accumulators_and_float32_slot_rows():
  # The documented defaults (0.1) and float32 slots, whatever the optimizer.
  assert ro.adagrad(0.1).initial_slot_row(3).tolist() == pytest.approx([0.1] * 3)
  assert ro.rowwise_adagrad(0.1).initial_slot_row(3).tolist() == pytest.approx([0.1])
  for opt in (ro.sgd(0.1), ro.adagrad(0.1), ro.rowwise_adagrad(0.1), ro.adam(0.1), ro.ftrl(0.1)):
    assert opt.initial_slot_row(3).dtype == np.float32, opt.name
  assert ro.initial_slot_rows((ro.sgd(1.0), ro.adagrad(1.0)), 2).dtype == np.float32


def test_unknown_name_names_the_field_and_the_kind():
  with pytest.raises(ConfigError, match=r"embedding\.optimizer.*row optimizer"):
    ro.make("lamb", 0.1, types.SimpleNamespace())


def test_a_table_without_its_own_rate_takes_the_blocks():
  cfg = types.SimpleNamespace(optimizer="sgd", learning_rate=0.2, adagrad_initial_accumulator=0.1)
  opt = ro.row_optimizer_from_config(cfg, (fl.TableSpec("a", 3), fl.TableSpec("b", 4, "sgd", 0.5)))
  rows, grads = np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)
  got, _ = opt.update(rows, np.zeros((2, 0), np.float32), grads, jnp.int32(1),
                      row_tables=np.array([0, 1], np.int32))
  np.testing.assert_allclose(np.asarray(got), [[0.8, 0.8], [0.5, 0.5]], rtol=1e-6)


def test_half_width_rows_round_stochastically_when_asked_keyed_by_the_step():
  cfg = types.SimpleNamespace(optimizer="sgd", learning_rate=1e-3, adagrad_initial_accumulator=0.1,
                              dtype="bfloat16", stochastic_rounding=True)
  opt = ro.row_optimizer_from_config(cfg)
  rows = np.full((64, 8), 1.0, np.float32)  # 1 - 1e-3 g lies between two bf16 values
  grads = np.random.default_rng(0).uniform(0.1, 0.9, (64, 8)).astype(np.float32)
  nearest = (rows - 1e-3 * grads).astype(jnp.bfloat16)
  first = np.asarray(opt.update(rows, np.zeros((64, 0)), grads, jnp.int32(1))[0])
  second = np.asarray(opt.update(rows, np.zeros((64, 0)), grads, jnp.int32(2))[0])
  assert (first != np.asarray(nearest)).any() and (first != second).any()
  cfg.stochastic_rounding = False
  plain = np.asarray(ro.row_optimizer_from_config(cfg).update(
      rows, np.zeros((64, 0)), grads, jnp.int32(1))[0])
  np.testing.assert_array_equal(plain, np.asarray(nearest))
  # keyword arguments (a per-table optimizer's row_tables) reach the wrapped update
  tables = ro.with_row_dtype(ro.per_table((ro.sgd(0.5),)), "bfloat16")
  got = tables.update(rows[:2], np.zeros((2, 0)), grads[:2], jnp.int32(1),
                      row_tables=np.zeros((2,), np.int32))[0]
  assert got.dtype == jnp.bfloat16
