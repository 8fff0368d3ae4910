"""gRDA: the closed form on a tiny case, exact zeros, jit, bad hyperparameters."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from sfjax.train import grda


def test_soft_threshold():
  x = jnp.array([-3.0, -0.5, 0.0, 0.5, 2.0])
  chex.assert_trees_all_close(grda._soft_threshold(x, 1.0), jnp.array([-2.0, 0.0, 0.0, 0.0, 1.0]))


def test_matches_the_formula_by_hand():
  lr, c, mu = 0.1, 0.5, 0.6
  tx = grda.grda(lr, c, mu)
  params = {"w": jnp.array([1.0, -0.2, 0.3])}
  state = tx.init(params)
  grads = [jnp.array([0.5, 0.1, -1.0]), jnp.array([0.5, -0.1, 0.2]), jnp.array([-0.25, 0.0, 0.4])]
  total = np.zeros(3)
  for n, g in enumerate(grads, start=1):
    updates, state = tx.update({"w": g}, state, params)
    params = optax.apply_updates(params, updates)
    total += np.asarray(g)
    threshold = c * np.sqrt(lr) * (n * lr) ** mu
    x = np.array([1.0, -0.2, 0.3]) - lr * total
    expected = np.sign(x) * np.maximum(np.abs(x) - threshold, 0.0)
    chex.assert_trees_all_close(params["w"], jnp.asarray(expected, jnp.float32), atol=1e-6)
  assert int(state.count) == 3
  chex.assert_trees_all_close(state.grad_sum["w"], jnp.asarray(total, jnp.float32))
  # Step 3 by hand: x = [1 - 0.1*0.75, -0.2 - 0, 0.3 - 0.1*(-0.4)] = [0.925, -0.2, 0.34],
  # threshold 0.5 * sqrt(0.1) * 0.3**0.6 = 0.076778; so w = [0.848222, -0.123222, 0.263222].
  chex.assert_trees_all_close(params["w"], jnp.array([0.848222, -0.123222, 0.263222]), atol=1e-5)


def test_exact_zeros_appear_and_the_signal_survives_under_jit():
  # Weight 0 gets a steady gradient (a real effect), the others zero-mean noise.
  tx = grda.grda(0.05, 0.4, 0.7)  # threshold after 400 steps: 0.73
  params = jnp.full((6,), 0.1, jnp.float32)
  state = tx.init(params)

  traces = []

  @jax.jit
  def step(params, state, key):
    traces.append(1)
    noise = 0.1 * jax.random.normal(key, (6,))
    grads = noise.at[0].set(-1.0)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for t in range(400):
    params, state = step(params, state, jax.random.key(t))
  w = np.asarray(params)
  assert w[0] > 1.0
  assert np.all(w[1:] == 0.0), w  # exact zeros, not small numbers
  assert len(traces) == 1


def test_update_needs_params_and_keeps_dtype():
  tx = grda.grda(0.1, 0.1, 0.5)
  state = tx.init(jnp.ones(2, jnp.float32))
  with pytest.raises(ValueError, match="needs `params`"):
    tx.update(jnp.ones(2), state)
  updates, _ = tx.update(jnp.ones(2), state, jnp.ones(2, jnp.float32))
  assert updates.dtype == jnp.float32


@pytest.mark.parametrize("kwargs, field", [({"learning_rate": 0.0, "c": 0.1, "mu": 0.5}, "learning_rate"),
                                           ({"learning_rate": 0.1, "c": -1.0, "mu": 0.5}, "c"),
                                           ({"learning_rate": 0.1, "c": 0.1, "mu": float("nan")}, "mu")])
def test_bad_hyperparameters_name_the_field(kwargs, field):
  with pytest.raises(ValueError, match=field):
    grda.grda(**kwargs)


def test_state_does_not_alias_params():
  params = jnp.ones(3)
  state = grda.grda(0.1, 0.1, 0.5).init(params)
  assert state.initial_params.unsafe_buffer_pointer() != params.unsafe_buffer_pointer()
