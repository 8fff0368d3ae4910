"""experiments/step_timing.py: alternated waited / pipelined chunks and their figures."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import step_timing as timing
from sfjax.core import background

_add = jax.jit(lambda s, x: (s + x, {"loss": jnp.sum(x)}))


def _run_step(state, inputs):
  """A real (tiny) step: adds the input to the state; reports the input's unique count."""
  x, n = inputs
  state, metrics = _add(state, x)
  return state, metrics, n


def _inputs(taken):
  def source():
    for i in range(100):
      taken.append(i)
      yield np.float32(2.0**i % 1000), i % 5

  return background.BackgroundIterator(source(), maxsize=2)


def test_steps_alternate_in_chunks_in_input_order():
  taken = []
  inputs = _inputs(taken)
  counters = {"steps": 0}

  def stats():
    return {"steps": counters["steps"], "row_bytes": 8, "label": "x", "flag": True}

  def counting_step(state, x):
    counters["steps"] += 1
    return _run_step(state, x)

  w = timing.alternate_windows(counting_step, jnp.float32(0), inputs, 2, 7, 3, 16,
                               prepare_ahead=True, stats=stats, settle_seconds=0.0)
  inputs.close()
  # 7 waited + 7 pipelined steps: chunks of 3, 3, 1 of each kind, waited first.
  assert list(w.chunk_steps) == [3, 3, 1] and len(w.piped_seconds) == 3
  assert len(w.step_seconds) == 7 and np.all(w.step_seconds > 0)
  assert list(w.unique_counts) == [0, 1, 2, 1, 2, 3, 2]  # inputs 0-2, 6-8, 12 (i % 5)
  expected = sum(np.float32(2.0**i % 1000) for i in range(14))
  assert float(w.state) == pytest.approx(expected)  # each input once, none skipped
  # Only the pipelined steps count; booleans and strings are no counters.
  assert w.counters == {"steps": 7, "row_bytes": 0}
  assert w.last_stats["label"] == "x"
  assert float(w.last_metrics["loss"]) == np.float32(2.0**13 % 1000)


def test_figures_pair_each_pipelined_chunk_with_the_waited_one_before_it():
  w = timing.Windows(state=None, step_seconds=np.array([0.1, 0.1, 0.2, 0.2]),
                     unique_counts=np.zeros(4), piped_seconds=np.array([0.2, 0.5]),
                     chunk_steps=np.array([2, 2]), counters={}, last_stats={}, last_metrics={})
  fig = timing.window_figures(w, 10)
  # Pair 1: 20 ex in 0.2 s both ways (1.0); pair 2: 20 ex in 0.5 s vs 0.4 s (0.8).
  assert math.isclose(fig["end_to_end_to_device_ratio"], 0.9)
  assert math.isclose(fig["examples_per_sec"], 40 / 0.7)
  assert math.isclose(fig["device_step_ms"], 150.0)
  assert math.isclose(fig["device_mean_step_ms"], 150.0)
  assert math.isclose(fig["device_examples_per_sec"], 10 / 0.15)


@pytest.mark.parametrize("steps,chunk,first", [(0, 2, 2), (3, 0, 2), (3, 2, 1)])
def test_bad_counts_are_refused(steps, chunk, first):
  with pytest.raises(ValueError, match="alternate_windows: steps"):
    timing.alternate_windows(_run_step, jnp.float32(0), iter([]), first, steps, chunk, 1,
                             prepare_ahead=False)
