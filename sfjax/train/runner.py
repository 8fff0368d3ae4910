"""The step runner: dispatches a range of train steps and measures them.

Shared by the trainer loop (`sfjax.train.loop`, one call per eval window) and
the benchmarks (`experiments/bench_train.py`), so a benchmark times exactly the
loop users run. Steps are dispatched without waiting (JAX runs ahead of the
host); the window's wall time ends with one `block_until_ready`. Step 1 is the
compile: it is waited for and left out of the window's time and examples.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from sfjax.train import backends
from sfjax.train.state import TrainState


class StepWindow(NamedTuple):
  """What a run of steps `[first, last]` did.

  Attributes:
    last_step: the last step run.
    examples: examples of the timed steps (step 1, the compile, excluded).
    seconds: wall time of the timed steps, until the state was ready.
    losses: [steps] train loss of every step of the window.
    unique_counts: [steps] unique ids of every step's batch.
    step_seconds: [timed steps] per-step time (dispatch to ready, input wait excluded), only with
      `wait_each_step`, else empty.
    last_metrics: the last step's metrics (device arrays).
  """

  last_step: int
  examples: int
  seconds: float
  losses: np.ndarray
  unique_counts: np.ndarray
  step_seconds: np.ndarray
  last_metrics: dict[str, Any]

  @property
  def examples_per_sec(self) -> float:
    """End-to-end rate of the window's timed steps."""
    return self.examples / max(self.seconds, 1e-9)


def _fmt_eta(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  m, s = divmod(int(seconds), 60)
  h, m = divmod(m, 60)
  return f"{h:d}:{m:02d}:{s:02d}"


def _log_progress(step: int, total: int, loss: float, rate: float, unique: float,
                  batch_size: int, cache: dict[str, Any]) -> None:
  eta = (total - step) * batch_size / rate if rate > 0 else float("inf")
  hit = ""
  if cache:
    last = cache["last_step"]
    hit = (f"  cache hit rate {cache['cache_hit_rate']:.3f} (last step: {last['hits']} hits, "
           f"{last['misses']} misses, {last['evictions']} evictions)")
  logging.info("step %d/%d loss %.5f  %.0f examples/s  unique/batch %.0f%s  ETA %s",
               step, total, loss, rate, unique, hit, _fmt_eta(eta))


def run_steps(run_step: backends.StepFn, state: TrainState, inputs: Iterator[Any],
              first_step: int, last_step: int, batch_size: int, *, total_steps: int | None = None,
              log_every: int = 0, stats=None, wait_each_step: bool = False,
              on_step=None) -> tuple[TrainState, StepWindow]:
  """Runs steps `first_step..last_step` (1-based, inclusive).

  Args:
    run_step: the backend's compiled step (`Backend.make_step`).
    state: the state before `first_step`.
    inputs: the backend's train inputs (`Backend.train_inputs`).
    first_step, last_step: the range; step 1 is the compile and is not timed.
    batch_size: examples per step.
    total_steps: the run's last step, for the ETA (default `last_step`).
    log_every: log progress every this many steps (0: never).
    stats: a function returning the backend's counters for the log (optional).
    wait_each_step: wait for every step and record its time (a benchmark's
      device-bound step time; slower than the pipelined default).
    on_step: called as `on_step(state)` after each step is dispatched (the trainer keeps
      the newest state so a fault mid-window can still flush it).

  Returns:
    (state after `last_step`, StepWindow).

  Raises:
    FloatingPointError: a logged loss is not finite (names the step).
  """
  total = total_steps or last_step
  losses, uniques, step_seconds = [], [], []
  examples, t_start = 0, time.perf_counter()
  t_log, ex_log = t_start, 0
  metrics: dict[str, Any] = {}
  for step in range(first_step, last_step + 1):
    step_inputs = next(inputs)
    t = time.perf_counter()
    state, metrics, n_unique = run_step(state, step_inputs)
    if on_step is not None:
      on_step(state)
    losses.append(metrics["loss"])
    uniques.append(n_unique)
    if step == 1:  # the compile: excluded from the window's time and examples
      jax.block_until_ready(state)
      t_start = t_log = time.perf_counter()
      continue
    if wait_each_step:
      jax.block_until_ready(metrics["loss"])
      step_seconds.append(time.perf_counter() - t)
    examples += batch_size
    ex_log += batch_size
    if log_every and (step % log_every == 0 or step == total):
      loss = float(metrics["loss"])
      now = time.perf_counter()
      _log_progress(step, total, loss, ex_log / max(now - t_log, 1e-9),
                    float(np.mean(uniques[-log_every:])), batch_size, stats() if stats else {})
      if not math.isfinite(loss):
        raise FloatingPointError(f"training loss became {loss} at step {step}")
      t_log, ex_log = now, 0
  jax.block_until_ready(state)
  seconds = time.perf_counter() - t_start
  loss_values = np.asarray(jnp.stack(losses)) if losses else np.zeros((0,), np.float32)
  return state, StepWindow(last_step, examples, seconds, loss_values, np.asarray(uniques),
                           np.asarray(step_seconds), metrics)
