"""gRDA: generalised regularised dual averaging, an optimizer that yields exact zeros.

Chao, Cheng et al. 2020 ("Directional pruning of deep neural networks"); AutoFIS
(Liu et al., KDD 2020) trains its interaction gates with it. After n steps of
learning rate γ from the initial weights w_0:

  w_n = S_{g(n, γ)}(w_0 - γ Σ_{k <= n} grad_k),    g(n, γ) = c γ^{1/2} (n γ)^μ,

where S_g(x) = sign(x) max(|x| - g, 0) is the soft threshold. The threshold
grows with n (μ > 0), so a weight whose accumulated gradient does not keep it
away from zero becomes exactly 0 and stays there until the gradient sum moves
it out again. An optax-style factory: `grda(...)` returns a
`GradientTransformation` whose state is a `_GRDAState` NamedTuple; `update`
needs `params` and returns `w_n - params` so `optax.apply_updates` lands on w_n.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# The dense optimizer registry's defaults (`optimizers.dense_optimizer('grda', ...)`): AutoFIS's.
DEFAULT_C, DEFAULT_MU = 0.005, 0.8


class _GRDAState(NamedTuple):
  """State of gRDA.

  Attributes:
    initial_params: w_0, the parameters `init` saw (same tree as the params).
    grad_sum: Σ_k grad_k so far (same tree).
    count: n, int32 scalar, steps taken.
  """

  initial_params: Any
  grad_sum: Any
  # optax's name for the step count (as ScaleByAdamState.count); it is in saved opt states.
  count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, see above


def _soft_threshold(x: jax.Array, threshold) -> jax.Array:
  """S_g(x) = sign(x) * max(|x| - g, 0), elementwise."""
  return jnp.sign(x) * jnp.maximum(jnp.abs(x) - threshold, 0.0)


def _grda_threshold(count, learning_rate, c, mu) -> jax.Array:
  """g(n, γ) = c γ^{1/2} (n γ)^μ for n = `count` (a scalar, float32)."""
  n = jnp.asarray(count, jnp.float32)
  lr = jnp.asarray(learning_rate, jnp.float32)
  return c * jnp.sqrt(lr) * (n * lr) ** mu


def _check(name: str, value, low: float, low_ok: bool) -> None:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    if not (value > low or (low_ok and value == low)) or value != value:
      raise ValueError(f"grda {name} must be {'>=' if low_ok else '>'} {low}, got {value!r}")


def grda(learning_rate, c, mu) -> optax.GradientTransformation:
  """The gRDA transformation (see the module docstring).

  Args:
    learning_rate: γ > 0 (a float or a traced scalar).
    c: threshold scale c >= 0 (0: plain dual averaging, no zeros forced).
    mu: threshold growth exponent μ >= 0 (the paper uses 0.5 < μ < 1).

  Returns:
    optax.GradientTransformation; `update(grads, state, params)` requires `params`.

  Raises:
    ValueError: a Python-number hyperparameter out of range (naming it).
  """
  _check("learning_rate", learning_rate, 0.0, False)
  _check("c", c, 0.0, True)
  _check("mu", mu, 0.0, True)

  def init(params):
    # A copy: the state must not alias the params (both may be donated to one jit call).
    # An explicit dtype drops weak types, so the state's avals do not change after step 1.
    return _GRDAState(initial_params=jax.tree.map(lambda p: jnp.array(p, dtype=jnp.result_type(p), copy=True),
                                                  params),
                      grad_sum=jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.result_type(p)), params),
                      count=jnp.zeros((), jnp.int32))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("grda's update needs `params` (it returns w_n - params)")
    count = state.count + 1
    grad_sum = jax.tree.map(lambda s, g: s + g, state.grad_sum, grads)
    threshold = _grda_threshold(count, learning_rate, c, mu)
    target = jax.tree.map(lambda w0, s: _soft_threshold(w0 - learning_rate * s, threshold).astype(w0.dtype),
                          state.initial_params, grad_sum)
    updates = jax.tree.map(lambda t, p: t - p, target, params)
    return updates, _GRDAState(state.initial_params, grad_sum, count)

  return optax.GradientTransformation(init, update)
