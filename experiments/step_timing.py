"""bench_train's timing: device-only and end-to-end windows alternated, and our step
alternated with the plain-JAX floor's (issue #27).

Two shared cores drift by ~10% within a minute (other processes, frequency), so two
figures measured in two windows one after the other differ by that much whatever the
code does: an end-to-end rate above its own device-only rate (1.04, 1.075 in earlier
runs) is that noise. Each ratio here compares figures taken in one window, alternated:

  * `alternate_windows`: chunks of `chunk` waited steps (inputs prepared before the
    chunk, each step waited for: the device-only step time) alternate with chunks of
    `chunk` pipelined steps (the trainer's own loop: host preparation on the loader
    thread, steps dispatched ahead: the end-to-end rate);
  * `interleaved_floor_ratio`: our device step and the floor's, step by step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from experiments import floor_deepfm as floor_lib
from sfjax.data import Batch, DatasetSpec
from sfjax.embedding import prepare_batch
from sfjax.train import run_steps

FLOOR_BATCHES = 64  # distinct batches the floor cycles through (on device)
SETTLE_SECONDS = 0.2  # after pulling a waited chunk's inputs: the loader refills its queue


class Windows(NamedTuple):
  """What `alternate_windows` measured.

  Attributes:
    state: the state after the last step.
    step_seconds: [steps] each waited step's time, dispatch to ready (inputs prepared).
    unique_counts: [steps] unique ids of the waited steps' batches.
    piped_seconds: [chunks] wall time of each pipelined chunk.
    chunk_steps: [chunks] steps of each chunk (its waited steps are the next ones of
      `step_seconds`, as many pipelined steps follow them).
    counters: the backend's numeric counters (`Backend.stats`) over the pipelined chunks
      alone: each chunk's differences, summed.
    last_stats: `stats()` after the last pipelined chunk (the non-cumulative fields).
    last_metrics: the last pipelined step's metrics.
  """

  state: Any
  step_seconds: np.ndarray
  unique_counts: np.ndarray
  piped_seconds: np.ndarray
  chunk_steps: np.ndarray
  counters: dict[str, float]
  last_stats: dict[str, Any]
  last_metrics: dict[str, Any]



def _numeric(stats: dict[str, Any]) -> dict[str, float]:
  return {k: v for k, v in stats.items()
          if isinstance(v, (int, float)) and not isinstance(v, bool)}


def alternate_windows(run_step: Callable, state: Any, inputs: Iterator[Any], first_step: int,
                      steps: int, chunk: int, batch_size: int, *, prepare_ahead: bool,
                      stats: Callable[[], dict[str, Any]] = dict,
                      settle_seconds: float = SETTLE_SECONDS) -> Windows:
  """`steps` waited and `steps` pipelined steps, alternated in chunks of `chunk`.

  Args:
    run_step: the backend's compiled step (`Backend.make_step`).
    state: the state before `first_step` (> 1: the compile is done).
    inputs: the backend's train inputs (`Backend.train_inputs`), fresh batches.
    first_step: the number of the first step run.
    steps: waited steps, and pipelined steps, in all.
    chunk: steps per chunk (the last chunk of each kind may be shorter).
    batch_size: examples per step.
    prepare_ahead: take a waited chunk's inputs before it and let the loader thread
      refill its queue (`settle_seconds`), so no host work overlaps its steps (the
      device backend; the cache's steps must be planned in order, lookahead ahead).
    stats: the backend's counters (`Backend.stats`).
    settle_seconds: the pause after taking a waited chunk's inputs.

  Raises:
    ValueError: `steps` or `chunk` < 1, or `first_step` < 2.
  """
  if steps < 1 or chunk < 1 or first_step < 2:
    raise ValueError(f"alternate_windows: steps {steps} and chunk {chunk} must be >= 1 and "
                     f"first_step {first_step} >= 2 (step 1 is the compile)")
  step_seconds, uniques, counters = [], [], {}
  piped_seconds, chunk_steps, after, metrics = [], [], {}, {}
  step, done = first_step, 0
  while done < steps:
    n = min(chunk, steps - done)
    timed = inputs
    if prepare_ahead:
      timed = iter([next(inputs) for _ in range(n)])
      time.sleep(settle_seconds)
    state, waited = run_steps(run_step, state, timed, step, step + n - 1, batch_size,
                              wait_each_step=True)
    step_seconds.extend(waited.step_seconds)
    uniques.extend(waited.unique_counts)
    before = _numeric(stats())
    state, piped = run_steps(run_step, state, inputs, step + n, step + 2 * n - 1, batch_size)
    after = stats()
    for key, value in _numeric(after).items():
      counters[key] = counters.get(key, 0) + value - before.get(key, 0)
    piped_seconds.append(piped.seconds)
    chunk_steps.append(n)
    metrics = piped.last_metrics
    step, done = step + 2 * n, done + n
  return Windows(state, np.asarray(step_seconds), np.asarray(uniques), np.asarray(piped_seconds),
                 np.asarray(chunk_steps), counters, dict(after), metrics)


def window_figures(windows: Windows, batch_size: int) -> dict[str, float]:
  """The windows' figures: end-to-end and device-only rates, and their ratio.

  `examples_per_sec` is the pipelined chunks' examples over their summed time;
  `device_step_ms` the median waited step (`device_examples_per_sec` its rate),
  `device_mean_step_ms` the mean. `end_to_end_to_device_ratio` is the median over
  chunk pairs of (a pipelined chunk's rate) / (the waited chunk's just before it, by its
  mean step: like the pipelined rate, total examples over total time): each pair shares
  a second or two of machine noise, and a burst of noise spoils one pair, not the ratio.
  """
  ends = np.cumsum(windows.chunk_steps)
  ratios = [(n * batch_size / piped) / (n * batch_size / np.sum(windows.step_seconds[end - n:end]))
            for n, end, piped in zip(windows.chunk_steps, ends, windows.piped_seconds, strict=True)]
  median = float(np.median(windows.step_seconds))
  return {"examples_per_sec": float(np.sum(windows.chunk_steps) * batch_size
                                    / max(np.sum(windows.piped_seconds), 1e-9)),
          "device_step_ms": median * 1e3, "device_examples_per_sec": batch_size / median,
          "device_mean_step_ms": float(np.mean(windows.step_seconds)) * 1e3,
          "end_to_end_to_device_ratio": float(np.median(ratios))}


class FloorPair(NamedTuple):
  """Our jitted device step and the floor's, each with its state and device batches."""

  step: Callable
  state: Any
  batches: list
  floor_step: Callable
  floor_state: Any
  floor_batches: list


def make_floor_pair(trainer, spec: DatasetSpec, batches: list[Batch], capacity: int,
                    config: ml_collections.ConfigDict) -> FloorPair:
  """Our device-backend `trainer` and the plain-JAX floor on the same batches and capacity."""
  backend = trainer.backend
  ours = [jax.device_put(prepare_batch(b, spec.field_offsets, capacity, spec.total_rows)[0],
                         backend.batch_sharding) for b in batches[:config.steps]]
  offsets = spec.field_offsets[None, :]
  floor_batches = [jax.device_put(floor_lib.floor_batch(b.ids + offsets, b.dense, b.labels,
                                                        capacity, spec.total_rows))
                   for b in batches[:FLOOR_BATCHES]]
  floor_state = floor_lib.init_state(spec.total_rows, spec.num_fields, config.embed_dim,
                                     spec.num_dense)
  # The floor is compiled with our step's XLA options (`train.xla_cpu_dots`): the ratio
  # compares the two steps, not two dot libraries.
  return FloorPair(trainer.run_step.jitted, trainer.state, ours,
                   floor_lib.make_floor_step(backend.compiler_options), floor_state, floor_batches)


def measure_floor(config: ml_collections.ConfigDict, pair: FloorPair) -> tuple[dict, FloorPair]:
  """The floor's own figures (its step alone, `floor_deepfm.measure`)."""
  figures, floor_state = floor_lib.measure(pair.floor_step, pair.floor_state,
                                           pair.floor_batches, config.steps)
  return figures, pair._replace(floor_state=floor_state)


def interleaved_floor_ratio(config: ml_collections.ConfigDict,
                            pair: FloorPair) -> tuple[dict, FloorPair]:
  """Our device step and the floor's, alternated step by step in one process.

  Both see the same machine noise, so the ratio of their median step times is far
  steadier than separate runs' ratio.
  """
  state, floor_state = pair.state, pair.floor_state
  ours_s, floor_s = [], []
  for i in range(config.warmup + config.steps):
    t = time.perf_counter()
    state, m = pair.step(state, pair.batches[i % len(pair.batches)])
    jax.block_until_ready(m["loss"])
    t1 = time.perf_counter()
    floor_state, loss = pair.floor_step(floor_state,
                                        pair.floor_batches[i % len(pair.floor_batches)])
    jax.block_until_ready(loss)
    t2 = time.perf_counter()
    if i >= config.warmup:
      ours_s.append(t1 - t)
      floor_s.append(t2 - t1)
  ours_ms, floor_ms = statistics.median(ours_s) * 1e3, statistics.median(floor_s) * 1e3
  figures = {"step_ms": ours_ms, "floor_step_ms": floor_ms,
             "step_to_floor_ratio": floor_ms / ours_ms}
  return figures, pair._replace(state=state, floor_state=floor_state)
