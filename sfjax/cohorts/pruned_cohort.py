"""Pruned cohorts: members stopped at eval points by a pruner, their lanes refilled.

Issue #26 item 5. With `study.pruner` set, a round's trials run as cohorts of one
shape bucket and one start step (`run_trials`), each cohort a sequence of program
calls between eval points (`run_cohort`):

  * Lock step. The cohort has a clock (its trials' start step). Each call runs every
    live lane over the batches of the clock's next L steps, L the fewest steps any
    lane has to its next eval point (`PrunerSpec.next_eval`): one call of the same
    vmapped program an unpruned run makes (`chunk_plan.lockstep_chunk`,
    `CohortRunner.run_chunk`), from the lanes' host states. A run cut at eval points
    and resumed equals the one call bit for bit, so every lane that is never
    pruned or refilled ends exactly as in an unpruned run (tested).
  * Eval points. A lane at an eval point reports the objective (the valid AUC of its
    state). A lane at its end is DONE, a non-finite one FAILED; the others are judged
    by `pruning.should_prune` against the completed trials' reports as they stand at
    this boundary (`history()`): a pruned lane ends PRUNED with its reports, no state,
    and stops training (the calls after it run one lane fewer, or its refill).
    Every ended lane is handed to `on_end` at once (the driver tells the study).
  * Refill. While the cohort runs on (some lane is live), a lane freed early (its
    trial pruned, failed or at a shorter end) takes a trial of the cohort's bucket
    (`refill(bucket)`: the driver's queue or a new proposal of the algorithm) from the
    next call on; when every lane ends at once, the cohort ends.
    It starts from its own start (a fresh trial from its seed, a promotion from its
    parent's state) and counts its own steps (its eval points, its end, `steps`),
    but reads the batches of the cohort's clock: it sees the task's batches in
    rotated order (the clock wraps at `period`, the steps the task precomputes), not
    in its solo run's order. That keeps the cohort one lock-step program: a ragged
    one (each lane reading its own steps) would batch the mates' inputs per lane and
    change their floating-point results.

Each ended trial's metrics are those of its last call, with `train_loss` the mean
over all its applied steps, `seconds` the sum of its calls' shares, and its reports
as metrics `'<objective>/<step>'` (`optuna_mirror.reported_metrics`: the journal
keeps them; the Optuna mirror writes them as intermediate values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from sfjax.automl.algorithms import TrialStatus
from sfjax.automl.study.optuna_mirror import reported_metrics
from sfjax.cohorts import chunk_plan, pruning
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.pruning import PrunerSpec
from sfjax.cohorts.shape_buckets import buckets
from sfjax.cohorts.trial_result import CohortTrialResult


class LaneTrial(NamedTuple):
  """A trial a lane of a pruned cohort runs.

  Attributes:
    handle: the caller's name for it (the study's `Suggestion`), given back to `on_end`.
    arch, hparams, seed: as `CohortRunner.run` takes them.
    start, end: its own step range `[start, end)`.
    state: None (fresh, drawn from `seed`) or the host state at `start` to resume from.
  """

  handle: Any
  arch: ArchSpec
  hparams: Mapping[str, float]
  seed: int
  start: int
  end: int
  state: Any = None


class _Lane(NamedTuple):
  """A lane's progress: its trial, own step, host state (None: fresh), reports
  (step -> value), the losses of its applied steps per call, and its seconds."""

  trial: LaneTrial
  step: int
  state: Any
  values: dict[int, float]
  losses: tuple[np.ndarray, ...]
  seconds: float


History = Callable[[], Sequence[Mapping[int, float]]]
Refill = Callable[[Hashable], "LaneTrial | None"]
OnEnd = Callable[[LaneTrial, CohortTrialResult], None]


def _start(trial: LaneTrial) -> _Lane:
  return _Lane(trial, int(trial.start), trial.state, {}, (), 0.0)


def _ended(spec: PrunerSpec, lane: _Lane, last: CohortTrialResult, status: TrialStatus,
           error: str | None) -> CohortTrialResult:
  """The result an ended lane's trial reports (see the module docstring)."""
  losses = np.concatenate(lane.losses) if lane.losses else np.zeros((0,), np.float32)
  metrics = {**last.metrics, "train_loss": float(np.mean(losses)) if losses.size else math.nan,
             "seconds": lane.seconds, **reported_metrics(spec.metric, lane.values)}
  state = last.state if status == TrialStatus.DONE else None
  return CohortTrialResult(metrics, status, state, error, last.chunk, losses)


def _prune_reason(spec: PrunerSpec, lane: _Lane, completed) -> str:
  step = max(lane.values)
  bar = pruning.percentile_bar(completed, step, spec.percentile, spec.direction)
  return (f"pruned at step {step}: best {spec.metric} "
          f"{pruning.best_so_far(lane.values, spec.direction):.5f} is worse than the "
          f"{spec.percentile:g}th percentile {bar:.5f} of {len(completed)} completed trials")


def _advance(spec: PrunerSpec, run: _Lane, result: CohortTrialResult, steps: int,
             completed: Sequence[Mapping[int, float]]
             ) -> tuple[_Lane, CohortTrialResult | None]:
  """A lane after a call of `steps` steps: its progress, and its trial's result if it
  ended (failed, done at its end, or pruned at this eval point)."""
  if result.losses is None:  # the call raised: the lane trained no step of it
    result = result._replace(metrics={**result.metrics, "steps": run.step})
  at_eval = run.step + steps == spec.next_eval(run.step, run.trial.end)
  lane = run._replace(step=run.step + steps, state=result.state,
                      losses=run.losses + ((result.losses,) if result.losses is not None else ()),
                      seconds=run.seconds + result.metrics["seconds"])
  if result.status != TrialStatus.DONE:
    return lane, _ended(spec, lane, result, result.status, result.error)
  if at_eval:
    lane = lane._replace(values={**lane.values, lane.step: result.metrics[spec.metric]})
  if lane.step >= lane.trial.end:
    return lane, _ended(spec, lane, result, TrialStatus.DONE, None)
  if at_eval and pruning.should_prune(spec, lane.values, completed):
    return lane, _ended(spec, lane, result, TrialStatus.PRUNED,
                        _prune_reason(spec, lane, completed))
  return lane, None


def run_cohort(runner: CohortRunner, key: Hashable, trials: Sequence[LaneTrial],
               spec: PrunerSpec, *, period: int, history: History, refill: Refill,
               on_end: OnEnd, width: int | None = None) -> list[Chunk]:
  """Runs one pruned cohort to the end of its last lane (see the module docstring).

  Args:
    runner: runs the calls.
    key: the trials' shape bucket (`buckets.bucket_key`), handed to `refill`.
    trials: the cohort's trials (at most `width`), all starting at one step.
    spec: the pruner.
    period: the clock wraps to step 0 here (the task's precomputed steps; >= every
      trial's end).
    history: the completed trials' reports (step -> value), read once per boundary.
    refill: a trial for a freed lane, or None (the lane stays empty).
    on_end: called with each trial and its result as it ends (done, pruned or failed).
    width: the cohort width (default: `runner.width_for` its first architecture).

  Returns:
    The chunks (program calls) that ran, in order.
  """
  if not trials or len({int(t.start) for t in trials}) != 1:
    raise ValueError("run_cohort: needs trials that all start at one step")
  width = width or runner.width_for(trials[0].arch, len(trials))
  if len(trials) > width:
    raise ValueError(f"run_cohort: {len(trials)} trials do not fit width {width}")
  if any(t.end > period for t in trials):
    raise ValueError(f"run_cohort: a trial ends after the clock's period {period}")
  lanes: list[_Lane | None] = [_start(t) for t in trials]
  clock, chunks = int(trials[0].start) % period, []
  while any(lane is not None for lane in lanes):
    live = [(i, lane) for i, lane in enumerate(lanes) if lane is not None]
    runs = [lane for _, lane in live]
    steps = min([spec.next_eval(r.step, r.trial.end) - r.step for r in runs] + [period - clock])
    archs = [r.trial.arch for r in runs]
    chunk = chunk_plan.lockstep_chunk(key, len(runs), width, clock, clock + steps,
                                      [r.state is not None for r in runs], len(set(archs)) > 1)
    results = runner.run_chunk(chunk, archs, [r.trial.hparams for r in runs],
                               [r.trial.seed for r in runs], [r.state for r in runs])
    chunks.append(chunk)
    clock = (clock + steps) % period
    completed = list(history())  # as the study stands at this boundary
    ended = []
    for (i, run), result in zip(live, results, strict=True):
      lanes[i], outcome = _advance(spec, run, result, steps, completed)
      if outcome is not None:
        ended.append((i, run.trial, outcome))
    for i, trial, outcome in ended:
      on_end(trial, outcome)
      lanes[i] = None
    if any(lane is not None for lane in lanes):  # the program runs on: its free lanes refill
      for i, _, _ in ended:
        new = refill(key)
        lanes[i] = _start(new) if new is not None else None
  return chunks


def run_trials(runner: CohortRunner, trials: Sequence[LaneTrial], spec: PrunerSpec, *,
               period: int, history: History, ask: Callable[[], LaneTrial | None],
               on_end: OnEnd, merge_optimizers: bool = False) -> list[Chunk]:
  """Runs trials as pruned cohorts, refilling freed lanes; returns the chunks that ran.

  Cohorts hold trials of one bucket (`buckets.bucket_key`, merged over row optimizers
  with `merge_optimizers`) and one start step, in order of first appearance, cut at
  the runner's width. A freed lane takes the first queued trial of its bucket, else
  `ask()`'s new trial if it is of that bucket; a new trial of another bucket is
  queued and runs in a later cohort of this call (so every asked trial runs).
  """
  queue = list(trials)
  chunks: list[Chunk] = []

  def key_of(t: LaneTrial) -> Hashable:
    return buckets.bucket_key(t.arch, merge_optimizers, runner.spec.num_dense, runner.spec.num_fields)

  def refill(key: Hashable) -> LaneTrial | None:
    for i, t in enumerate(queue):
      if key_of(t) == key:
        return queue.pop(i)
    new = ask()
    if new is not None and key_of(new) != key:
      queue.append(new)
      return None
    return new

  while queue:
    first = queue[0]
    members = [t for t in queue if key_of(t) == key_of(first) and t.start == first.start]
    width = runner.width_for(first.arch, len(members))
    cohort = members[:width]
    queue = [t for t in queue if all(t is not c for c in cohort)]
    chunks += run_cohort(runner, key_of(first), cohort, spec, period=period, history=history,
                         refill=refill, on_end=on_end, width=width)
  return chunks
