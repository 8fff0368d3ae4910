"""Dense optimizers (sfjax/train/optimizers.py): every registered name applies weight decay.

One step with a zero gradient isolates the decay: without it the parameters stay
(gRDA's soft threshold moves them by exactly its threshold), with it they move toward
0 by a hand-computed amount. Then end to end: a short
training run with weight decay ends elsewhere than one without.
"""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import ctr
from sfjax.core.errors import ConfigError
from sfjax.train import grda, loop, optimizers

NAMES = optimizers.DENSE_OPTIMIZER_NAMES
LR, WD = 0.1, 0.5
PARAMS = {"w": jnp.array([1.0, -2.0, 0.5, 0.0]), "b": jnp.array(0.25)}


def _one_step(name, weight_decay, params=PARAMS):
  """Params after one jitted update with a zero gradient, and the optimizer state."""
  tx = optimizers.dense_optimizer(name, LR, weight_decay)

  @jax.jit
  def step(params):
    state = tx.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, state = tx.update(zero, state, params)
    return optax.apply_updates(params, updates), state

  return step(params)


def _grda_step(p, g):
  """gRDA's first step by hand: S_t(p - LR g), t = c sqrt(LR) LR^mu (grda.py's formula)."""
  threshold = grda.DEFAULT_C * np.sqrt(LR) * LR ** grda.DEFAULT_MU
  x = p - LR * g
  return np.sign(x) * np.maximum(np.abs(x) - threshold, 0.0)


def _decayed(name, p):
  """The hand-computed result of one step from `p` with gradient 0, rate LR, decay WD."""
  g = WD * p  # the L2 gradient of the coupled variants
  if name == "grda":
    return _grda_step(p, g)
  if name in ("sgd", "adamw"):  # SGD on the L2 gradient; AdamW decays p directly (Adam of 0 is 0)
    return p - LR * WD * p
  if name == "adam":  # step 1: m_hat = g, v_hat = g^2 (float32 bias correction: ~1e-6 off)
    return p - LR * g / (np.abs(g) + 1e-8)
  if name == "adagrad":  # accumulator 0.1 + g^2 (optax: initial 0.1, eps 1e-7)
    return p - LR * g / np.sqrt(0.1 + g * g + 1e-7)
  raise AssertionError(f"no hand-computed case for {name!r}: add one here")


@pytest.mark.parametrize("name", NAMES)
def test_zero_gradient_without_decay_leaves_params_unchanged(name):
  new, _ = _one_step(name, 0.0)
  if name == "grda":  # the soft threshold alone: every weight moves toward 0 by it
    expected = jax.tree.map(lambda p: _grda_step(np.asarray(p, np.float64), 0.0), PARAMS)
    chex.assert_trees_all_close(new, expected, rtol=1e-6, atol=1e-7)
    assert not np.allclose(np.asarray(new["w"]), np.asarray(PARAMS["w"]))
    return
  chex.assert_trees_all_close(new, PARAMS, atol=0.0, rtol=0.0)


def test_grda_options_are_static_and_checked():
  tx = optimizers.dense_optimizer("grda", LR, 0.0, c=0.5, mu=0.6)
  state = tx.init(PARAMS)
  assert set(state.hyperparams) == {"learning_rate", "weight_decay"}  # c, mu: not injected
  updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, PARAMS), state, PARAMS)
  threshold = 0.5 * np.sqrt(LR) * LR ** 0.6  # 0.0795: w = 0.25 -> 0.1705, 0.0 stays 0
  chex.assert_trees_all_close(optax.apply_updates(PARAMS, updates)["b"],
                              jnp.asarray(0.25 - threshold), rtol=1e-6)
  with pytest.raises(ConfigError, match=r"optimizer\.name: dense optimizer 'adam' takes no "
                                        r"option 'c'"):
    optimizers.dense_optimizer("adam", LR, c=0.5)
  with pytest.raises(ValueError, match="grda mu must be >= 0"):
    optimizers.dense_optimizer("grda", LR, mu=-1.0).init(PARAMS)


@pytest.mark.parametrize("name", NAMES)
def test_decay_shrinks_params_toward_zero(name):
  new, _ = _one_step(name, WD)
  for before, after in zip(jax.tree.leaves(PARAMS), jax.tree.leaves(new), strict=True):
    before, after = np.asarray(before), np.asarray(after)
    nonzero = before != 0
    assert np.all(np.abs(after[nonzero]) < np.abs(before[nonzero])), (name, before, after)
    assert np.all(np.sign(after[nonzero]) == np.sign(before[nonzero])), (name, before, after)
    np.testing.assert_array_equal(after[~nonzero], 0.0)


@pytest.mark.parametrize("name", NAMES)
def test_decay_matches_the_hand_computed_step(name):
  new, _ = _one_step(name, WD)
  expected = jax.tree.map(lambda p: _decayed(name, np.asarray(p, np.float64)), PARAMS)
  chex.assert_trees_all_close(new, expected, rtol=1e-5, atol=1e-6)


def test_sgd_decay_by_hand():
  new, _ = _one_step("sgd", WD)  # p - lr * wd * p = 0.95 p
  chex.assert_trees_all_close(new, {"w": jnp.array([0.95, -1.9, 0.475, 0.0]),
                                    "b": jnp.array(0.2375)}, rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_hyperparameters_are_injected_into_the_state(name):
  _, state = _one_step(name, WD)
  chex.assert_trees_all_close(state.hyperparams, {"learning_rate": jnp.asarray(LR),
                                                  "weight_decay": jnp.asarray(WD)})
  # Traced: a state with the decay rewritten (as PBT does) decays by the new value.
  tx = optimizers.dense_optimizer(name, LR, 0.0)
  state = tx.init(PARAMS)
  state.hyperparams["weight_decay"] = jnp.asarray(WD)
  updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.zeros_like, PARAMS), state, PARAMS)
  expected = jax.tree.map(lambda p: _decayed(name, np.asarray(p, np.float64)), PARAMS)
  chex.assert_trees_all_close(optax.apply_updates(PARAMS, updates), expected, rtol=1e-5,
                              atol=1e-6)


def test_from_config_reads_the_optimizer_block():
  c = ctr.get_config().optimizer
  c.name, c.learning_rate, c.weight_decay = "sgd", LR, WD
  tx = optimizers.dense_optimizer_from_config(c)
  state = tx.init(PARAMS)
  assert float(state.hyperparams["learning_rate"]) == pytest.approx(LR)
  assert float(state.hyperparams["weight_decay"]) == pytest.approx(WD)


def test_unknown_name_raises_config_error_naming_the_field():
  with pytest.raises(ConfigError, match=r"optimizer\.name.*'lamb'") as info:
    optimizers.dense_optimizer("lamb", LR)
  for name in NAMES:
    assert name in str(info.value)
  with pytest.raises(ConfigError, match=r"trial\.dense_optimizer"):
    optimizers.dense_optimizer("lamb", LR, field="trial.dense_optimizer")


def _tiny_run(name, weight_decay):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 4096, 2048
  c.model.mlp_dims = (16,)
  c.optimizer.name, c.optimizer.weight_decay = name, weight_decay
  c.train.steps, c.train.batch_size, c.train.eval_every, c.train.num_devices = 10, 256, 10, 1
  final, state = loop.train_and_evaluate(c, None)
  sq_norm = sum(float(jnp.sum(jnp.square(x))) for x in jax.tree.leaves(state.params))
  return final, state, sq_norm


@pytest.mark.parametrize("name", [  # one run in the fast tier, the rest in `make test-all`
    pytest.param(name, marks=() if name == "adamw" else pytest.mark.slow) for name in NAMES])
def test_weight_decay_changes_training_end_to_end(name):
  plain, plain_state, plain_norm = _tiny_run(name, 0.0)
  decayed, decayed_state, decayed_norm = _tiny_run(name, 0.5)
  assert float(plain_state.opt_state.hyperparams["weight_decay"]) == 0.0
  assert float(decayed_state.opt_state.hyperparams["weight_decay"]) == 0.5
  assert math.isfinite(decayed["logloss"])
  assert decayed["logloss"] != plain["logloss"]  # runs are deterministic: equal if ignored
  assert decayed_norm < plain_norm  # the decay pulls the dense parameters toward 0
