"""The step runner: what a window counts, times and refuses (a fake step, no model)."""

import time

import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.train import runner

BATCH = 8


def _fake_step(losses, sleep=None):
  """A `run_step` whose state counts steps; step k (1-based) returns `losses[k - 1]` and k + 10
  unique ids, after sleeping `sleep[k]` seconds (if given)."""
  sleep = sleep or {}

  def run_step(state, inputs):
    step = int(state) + 1
    assert inputs == f"batch{step}"  # one input per step, in order
    time.sleep(sleep.get(step, 0.0))
    return state + 1, {"loss": jnp.float32(losses[step - 1])}, step + 10

  return run_step


def _inputs(first, count=20):
  return iter(f"batch{k}" for k in range(first, first + count))


def test_step_one_is_excluded_from_examples_and_seconds():
  run_step = _fake_step([0.5, 0.4, 0.3, 0.2], sleep={1: 0.5})  # a slow "compile"
  state, window = runner.run_steps(run_step, jnp.int32(0), _inputs(1), 1, 4, BATCH)
  assert int(state) == 4 and window.last_step == 4
  assert window.examples == 3 * BATCH  # steps 2..4
  assert 0.0 < window.seconds < 0.5  # the 0.5 s of step 1 is not in the window
  assert window.examples_per_sec == pytest.approx(window.examples / window.seconds)
  np.testing.assert_allclose(window.losses, [0.5, 0.4, 0.3, 0.2])  # every step, step 1 too
  np.testing.assert_array_equal(window.unique_counts, [11, 12, 13, 14])
  assert float(window.last_metrics["loss"]) == pytest.approx(0.2)
  assert window.step_seconds.shape == (0,)  # only with wait_each_step


def test_window_not_starting_at_one_times_every_step():
  state, window = runner.run_steps(_fake_step([1.0] * 6), jnp.int32(2), _inputs(3), 3, 5, BATCH)
  assert int(state) == 5
  assert window.examples == 3 * BATCH and window.losses.shape == (3,)
  np.testing.assert_array_equal(window.unique_counts, [13, 14, 15])


def test_wait_each_step_records_each_timed_step():
  run_step = _fake_step([1.0] * 4, sleep={2: 0.05, 3: 0.1, 4: 0.05})
  _, window = runner.run_steps(run_step, jnp.int32(0), _inputs(1), 1, 4, BATCH,
                               wait_each_step=True)
  assert window.step_seconds.shape == (3,)  # steps 2..4; step 1 (the compile) not timed
  assert np.all(window.step_seconds >= [0.05, 0.1, 0.05])
  assert window.seconds >= window.step_seconds.sum()


def test_non_finite_logged_loss_raises_naming_the_step():
  run_step = _fake_step([0.7, 0.6, np.nan, 0.5])
  with pytest.raises(FloatingPointError, match="at step 3"):
    runner.run_steps(run_step, jnp.int32(0), _inputs(1), 1, 4, BATCH, log_every=1)


def test_only_logged_losses_are_checked():
  # log_every=2 reads steps 2 and 4: the NaN of step 3 is recorded, not raised on ...
  run_step = _fake_step([0.7, 0.6, np.nan, 0.5])
  _, window = runner.run_steps(run_step, jnp.int32(0), _inputs(1), 1, 4, BATCH, log_every=2)
  assert np.isnan(window.losses[2])
  # ... and an infinite loss at a logged step raises.
  with pytest.raises(FloatingPointError, match="inf at step 4"):
    runner.run_steps(_fake_step([0.7, 0.6, 0.5, np.inf]), jnp.int32(0), _inputs(1), 1, 4, BATCH,
                     log_every=2)


def test_log_reads_the_backends_counters():
  calls = []

  def stats():
    calls.append(1)
    return {"cache_hit_rate": 0.5, "last_step": {"hits": 3, "misses": 1, "evictions": 0}}

  runner.run_steps(_fake_step([1.0] * 4), jnp.int32(0), _inputs(1), 1, 4, BATCH, log_every=2,
                   total_steps=10, stats=stats)
  assert len(calls) == 2  # steps 2 and 4


def test_on_step_sees_every_new_state_even_when_a_later_input_fails():
  seen = []

  def inputs():
    yield "batch1"
    yield "batch2"
    raise OSError("shard vanished")

  with pytest.raises(OSError, match="shard vanished"):
    runner.run_steps(_fake_step([1.0] * 4), jnp.int32(0), inputs(), 1, 4, BATCH,
                     on_step=lambda s: seen.append(int(s)))
  assert seen == [1, 2]  # the trainer can still flush the state after step 2
