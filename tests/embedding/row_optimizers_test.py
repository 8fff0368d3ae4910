"""Row optimizers against hand-computed numbers, under jit."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def test_zero_gradient_rows_unchanged_for_sgd_and_adagrad():
  for opt in (ro.sgd(0.3), ro.adagrad(0.3)):
    w, _ = _run(opt, W, np.zeros_like(G))
    chex.assert_trees_all_close(w, W)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam", "ftrl"])
def test_from_config(name):
  from experiments.configs import ctr
  cfg = ctr.get_config().embedding
  cfg.optimizer = name
  opt = ro.from_config(cfg)
  assert opt.name == name
  assert opt.initial_slot_row(3).shape == (opt.slot_width(3),)


def test_bad_config_names_field():
  from experiments.configs import ctr
  cfg = ctr.get_config().embedding
  cfg.optimizer = "lamb"
  with pytest.raises(ValueError, match="embedding.optimizer"):
    ro.from_config(cfg)
  with pytest.raises(ValueError, match="initial_accumulator"):
    ro.adagrad(0.1, initial_accumulator=0.0)
