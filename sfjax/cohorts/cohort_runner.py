"""Vmapped cohorts: trials of one `ArchSpec` (or shape bucket) trained together.

DESIGN.md §4. `CohortRunner.run` plans its trials' program calls
(`chunk_plan.plan_chunks`: groups, chunks of the cohort width, power-of-two
padding) and executes exactly that plan, each chunk one call of a jitted
`jax.vmap(trial)` (`cohort_call.call_cohort`); every `CohortTrialResult` names the
chunk that ran it.

Choices:
  * Step ranges. By default a group holds trials of one exact step range `[start,
    end)` and one resume kind, so no trial pays for steps it does not take (PBT's
    rounds and synchronous rungs produce such groups). The start step is traced,
    so ranges of equal length share a program; the step count is static (the
    scan length). A `ragged` runner instead groups by bucket alone: ASHA's
    promotions (each resuming at its rung) and its new trials (from step 0) then
    share one program. Every trial starts from a host state (fresh ones drawn
    from their seeds, as the program would), reads the batches of its own steps
    inside the chunk's span, and its steps past its own range are not applied
    (the state stays exactly as it is), so each result equals its own-range run;
    the cost is that a short trial idles while the longest one trains (a chunk
    takes its trials longest first).
  * A bucket's trials whose architectures differ run one masked program of the
    bucket's superset: each trial's exact state is padded in and cut back out
    (`sfjax.cohorts.shape_buckets.buckets`). With `merge_optimizers` the bucket ignores the row
    optimizer: a chunk of several picks each lane's by an index (`lane_optimizers`).
  * 'auto' width: `measure_widths` times one budget unit of trials per candidate
    width (compiled first) and keeps the best trials/hour, per arch.
  * A trial's `seconds` is its chunk's wall time (compilation included) divided
    by the real trials of the chunk.
  * Cost metrics of the architecture (`params`, `flops`, `latency_ms` when
    measured) come from the runner's cost model, `costs` (a `costs.TrialCosts`,
    cached per arch; share one between runners of a task).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.cohorts import chunk_plan, cohort_call, host_cohort, lane_optimizers, trial_states
from sfjax.cohorts import program as trial_program
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_call import CohortOutput

# Re-exported (`x as x`): modules outside the package import these from here still.
from sfjax.cohorts.cohort_call import cohort_program as cohort_program
from sfjax.cohorts.cohort_call import split_eval_mask as split_eval_mask
from sfjax.cohorts.cohort_call import trial_mesh as trial_mesh
from sfjax.cohorts.costs import TrialCosts
from sfjax.cohorts.shape_buckets import buckets
from sfjax.cohorts.table_choices import bag_pooling, table_dims, table_overrides
from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.cohorts.trial_result import CohortTrialResult, chunk_results, failed_chunk_results

_WIDTH_CANDIDATES = (1, 2, 4, 8, 16, 32)


class CohortRunner:
  """Runs trials of a `CTRTask` as vmapped cohorts (see the module docstring).

  Attributes:
    task, data (TrialData), spec (DatasetSpec), mesh, cohort_width, width_candidates,
    ragged, costs (the `TrialCosts` its trials' cost metrics come from).
  """

  def __init__(self, task: CTRTask, *, cohort_width: int | str = "auto", mesh=None,
               data: TrialData | None = None, width_candidates: Sequence[int] = _WIDTH_CANDIDATES,
               measure_latency: bool = False, ragged: bool = False,
               costs: TrialCosts | None = None):
    """Builds the task's TrialData (unless `data` is given).

    Args:
      task: what every trial trains on.
      cohort_width: trials per compiled program, or 'auto' (measured per arch).
      mesh: optional ('trial',) mesh to shard the trial axis over.
      data: TrialData of `task`, shared between runners.
      width_candidates: the widths 'auto' measures.
      measure_latency: add `latency_ms` to every trial's metrics (one extra
        compilation per arch); switches it on in a given `costs` too (and may
        be switched on later: `costs.measure_latency`).
      ragged: `run` lets trials of one bucket with different step ranges (or
        fresh and resumed ones) share a program (`chunk_plan._group_trials`); a
        public attribute. Off: one program per exact range, no trial idles.
      costs: the cost model of the trials (default: a new `TrialCosts` on `data`).
    """
    if cohort_width != "auto" and (isinstance(cohort_width, bool) or not isinstance(cohort_width, int)
                                   or cohort_width < 1):
      raise ValueError(f"cohort_width must be a positive integer or 'auto', got {cohort_width!r}")
    if mesh is not None and mesh.axis_names != ("trial",):
      raise ValueError(f"mesh must have the single axis ('trial',), got {mesh.axis_names}")
    self.task, self.cohort_width, self.mesh = task, cohort_width, mesh
    self.width_candidates = tuple(width_candidates)
    self.data = data if data is not None else TrialData(task)
    self.spec = self.data.spec
    if costs is not None and costs.spec != self.spec:
      raise ValueError("CohortRunner: costs was built for a different data set spec")
    self.costs = costs if costs is not None else TrialCosts(self.spec, self.data)
    self.costs.measure_latency = self.costs.measure_latency or bool(measure_latency)
    self.ragged = bool(ragged)
    self._widths: dict[ArchSpec, dict[int, float]] = {}
    self._templates: dict[ArchSpec, Any] = {}

  def run_stacked(self, arch: ArchSpec, hparams: Mapping[str, Any], seeds, start, end,
                  init_states=None, dense_masks=None) -> CohortOutput:
    """Runs W trials over steps `[start, end)` as one program call (`cohort_call.call_cohort`
    on this runner's data and mesh; its Args).

    A task with `embedding_backend='cache'` runs the call through one shared host table
    (`host_cohort.call_host_cohort`: fresh trials of one step range only).

    Returns:
      CohortOutput.
    """
    if self.task.embedding_backend == "cache":
      return host_cohort.call_host_cohort(self.data, arch, hparams, seeds, start, end,
                                          init_states, dense_masks)
    return cohort_call.call_cohort(self.data, self.mesh, arch, hparams, seeds, start, end,
                                   init_states, dense_masks)

  def measure_widths(self, arch: ArchSpec, candidates: Sequence[int] = _WIDTH_CANDIDATES
                     ) -> dict[int, float]:
    """Trials/hour of one budget unit of default trials at each width (cached per arch).

    Each width is compiled and run once, then timed on a second run. A width
    that runs out of device memory scores 0 and larger ones are not tried.
    """
    measured = self._widths.setdefault(arch, {})
    steps = self.task.steps_per_budget_unit
    for width in sorted(set(candidates)):
      if width in measured:
        continue
      try:
        self.run_stacked(arch, {}, np.arange(width), 0, steps)
        seconds = self.run_stacked(arch, {}, np.arange(width), 0, steps).seconds
      except jax.errors.JaxRuntimeError:
        measured[width] = 0.0
        break
      measured[width] = width * 3600.0 / max(seconds, 1e-9)
    return {w: measured[w] for w in sorted(set(candidates)) if w in measured}

  def width_for(self, arch: ArchSpec, num_trials: int | None = None) -> int:
    """The cohort width used for `arch`: the fixed one, or the best measured.

    With `num_trials` given, 'auto' measures only widths that this many trials can
    fill (no measurement at all for a lone trial): measuring costs compilations.
    """
    if isinstance(self.cohort_width, int):  # else 'auto' (checked in __init__)
      return self.cohort_width
    candidates: Sequence[int] = self.width_candidates
    if num_trials is not None:
      if num_trials <= 1:
        return 1
      candidates = [w for w in candidates if w <= num_trials] or [1]
    rates = self.measure_widths(arch, candidates)
    return max(sorted(rates), key=lambda w: rates[w])

  def plan(self, archs: Sequence[ArchSpec], start_steps: Sequence[int],
           end_steps: Sequence[int], resumes: Sequence[bool],
           ragged: bool | None = None, merge_optimizers: bool = False) -> tuple[Chunk, ...]:
    """The program calls `run` makes for these trials (`chunk_plan.plan_chunks` by shape
    bucket, at `width_for` the group's first architecture: 'auto' may measure here).

    Args:
      archs: per trial, its ArchSpec.
      start_steps, end_steps: per trial, its global step range.
      resumes: per trial, whether it resumes from a state.
      ragged: group by bucket alone; None: the runner's `ragged`.
      merge_optimizers: trials of one bucket but different row optimizers share a
        program (`buckets.bucket_key`, `lane_optimizers`).

    A task with `embedding_backend='cache'` groups by exact architecture and step range
    (`host_cohort`: no padded, mixed or ragged programs).
    """
    cache = self.task.embedding_backend == "cache"
    keys = list(archs) if cache else [buckets.bucket_key(a, merge_optimizers, self.spec.num_dense,
                                                         self.spec.num_fields) for a in archs]
    return chunk_plan.plan_chunks(
        keys, start_steps, end_steps, resumes,
        ragged=False if cache else self.ragged if ragged is None else ragged, archs=archs,
        width=lambda members: self.width_for(archs[members[0]], len(members)))

  def run(self, arch: ArchSpec | Sequence[ArchSpec], hparams: Sequence[Mapping[str, float]],
          seeds: Sequence[int], start_steps: Sequence[int], end_steps: Sequence[int] | int,
          init_states: Sequence[Any], ragged: bool | None = None,
          merge_optimizers: bool = False) -> list[CohortTrialResult]:
    """Runs trials of one architecture, or of one shape bucket; results in input order.

    Args:
      arch: the trials' ArchSpec, or one ArchSpec per trial. Trials of one bucket
        (`buckets.bucket_key`) whose architectures differ share a padded program
        (`sfjax.cohorts.shape_buckets.buckets`); trials of other buckets run apart. Trials of
        one bucket with different step ranges share a program only when the
        run is `ragged` (`chunk_plan._group_trials`).
      hparams: per trial, dynamic hyperparameters (`arch.DYNAMIC_KEYS`; missing -> defaults;
        a bag's `features.<name>.pooling`, missing -> the data set's, `bag_pooling`).
      seeds: per trial, its initialisation seed.
      start_steps: per trial, the global step it starts at (0 for a fresh trial).
      end_steps: per trial (or one int for all), the global step it stops at.
      init_states: per trial, None (fresh) or the host state of an earlier
        CohortTrialResult at step `start_steps[i]` (resume: training continues), in the
        trial's own shapes.
      ragged: group by bucket alone; None: the runner's `ragged`.
      merge_optimizers: trials that differ in their row optimizer may share a bucket's
        program, each lane taking its own (`lane_optimizers`).

    Returns:
      One CohortTrialResult per trial, states in each trial's own shapes, each naming
      the chunk (program call) of `plan` that ran it.
    """
    n = len(hparams)
    archs = [arch] * n if isinstance(arch, ArchSpec) else list(arch)
    if isinstance(end_steps, (int, np.integer)):
      end_steps = [int(end_steps)] * n
    for name, seq in (("archs", archs), ("seeds", seeds), ("start_steps", start_steps),
                      ("end_steps", end_steps), ("init_states", init_states)):
      if len(seq) != n:
        raise ValueError(f"{name} has {len(seq)} entries but hparams has {n}")
    for i in range(n):
      start, end, state = int(start_steps[i]), int(end_steps[i]), init_states[i]
      if not 0 <= start <= end:
        raise ValueError(f"trial {i}: step range [{start}, {end}) is invalid")
      if state is None and start != 0:
        raise ValueError(f"trial {i}: start_steps={start} but no init_state to resume from")
      if state is not None and int(np.asarray(state.step)) != start:
        raise ValueError(f"trial {i}: init_state is at step {int(np.asarray(state.step))}, "
                         f"not at start_steps={start}")
    plan = self.plan(archs, start_steps, end_steps, [s is not None for s in init_states], ragged,
                     merge_optimizers)
    stacked = cohort_call.stack_hparams(hparams, self._dynamic_defaults())
    results: dict[int, CohortTrialResult] = {}
    for chunk in plan:
      for i, result in zip(chunk.trials, self._run_planned(chunk, archs, stacked, seeds,
                                                           init_states), strict=True):
        results[i] = result
    return [results[i] for i in range(n)]  # the plan runs every trial once

  def _dynamic_defaults(self) -> dict[str, float]:
    """Each bag's pooling code and each table's dim in the data set (a trial's default)."""
    return {**bag_pooling.default_codes(self.spec), **table_dims.default_dims(self.spec)}

  def run_chunk(self, chunk: Chunk, archs: Sequence[ArchSpec],
                hparams: Sequence[Mapping[str, float]], seeds: Sequence[int],
                init_states: Sequence[Any]) -> list[CohortTrialResult]:
    """Runs one given chunk (e.g. `chunk_plan.lockstep_chunk`) as one program call.

    Args:
      chunk: the call; `archs`, `hparams`, `seeds`, `init_states` are indexed by its
        trial indices (as `run` takes them). A resumed state's own step may differ from
        the chunk's start: the call reads the batches of the chunk's range, and each
        trial's `steps` counts its own applied steps (a pruned cohort's refilled lane).

    Returns:
      The results of `chunk.trials`, in that order.
    """
    stacked = cohort_call.stack_hparams(hparams, self._dynamic_defaults())
    return self._run_planned(chunk, list(archs), stacked, seeds, init_states)

  def _run_planned(self, chunk: Chunk, archs, stacked, seeds, init_states) -> list[CohortTrialResult]:
    """Runs one chunk of the plan: its lanes' hyperparameters, seeds and ranges, from
    host states when `chunk.from_states`, as one (masked, for a mixed bucket) call."""
    lanes = list(chunk.lane_trials)
    hparams = {k: v[lanes] for k, v in stacked.items()}
    lane_seeds = np.asarray(seeds)[lanes]
    start: np.ndarray | int
    end: np.ndarray | int
    if chunk.ragged:  # per-lane ranges (the padding lanes repeat the first trial's)
      starts = dict(zip(chunk.trials, chunk.starts, strict=True))
      ends = dict(zip(chunk.trials, chunk.ends, strict=True))
      start, end = np.asarray([starts[i] for i in lanes]), np.asarray([ends[i] for i in lanes])
    else:
      start, end = chunk.starts[0], chunk.ends[0]
    lane_archs = [archs[i] for i in lanes]
    lane_states = [init_states[i] for i in lanes]
    if chunk.masked:
      return self._run_padded_chunk(chunk, lane_archs, hparams, lane_seeds, start, end,
                                    lane_states)
    states = None
    if chunk.from_states:
      states = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                            *self._host_states(lane_archs, hparams, lane_seeds, lane_states))
    return self._run_chunk(chunk, lane_archs[0], hparams, lane_seeds, start, end, states)

  def _run_padded_chunk(self, chunk, archs, hparams, seeds, start, end,
                        init_states) -> list[CohortTrialResult]:
    """One chunk of a bucket's trials with different architectures: each trial's exact
    state (its resume state, or its fresh init drawn from its seed) padded to the
    chunk's superset, one masked program call, results cut back to exact shapes."""
    sup = buckets.superset(archs, self.spec.num_dense, self.spec.num_fields)
    template = self.state_template(sup)
    states, masks = [], []
    for arch, state in zip(archs, self._host_states(archs, hparams, seeds, init_states),
                           strict=True):
      state, mask = buckets.pad_state(state, template, arch=arch, sup_arch=sup)
      states.append(state)
      masks.append(mask)

    def stack(trees):
      return jax.tree.map(lambda *xs: np.stack(xs), *trees)

    if len(lane_optimizers.lane_names(sup.embedding_optimizer)) > 1:  # each lane its own
      hparams = {**hparams, lane_optimizers.LANE_KEY: np.asarray(
          [lane_optimizers.lane_index(sup.embedding_optimizer, a.embedding_optimizer)
           for a in archs], np.int32)}
    rowwise = ("rowwise_adagrad" in lane_optimizers.lane_names(sup.embedding_optimizer)
               or "rowwise_adagrad" in (table_overrides.own_optimizers(self.spec) or ()))
    if rowwise and any(a.embedding_width != sup.embedding_width
                       for a in archs):  # a mean over each lane's row
      hparams = {**hparams, lane_optimizers.ROW_WIDTH_KEY: np.asarray(
          [a.embedding_width for a in archs], np.float32)}
    results = self._run_chunk(chunk, sup, hparams, seeds, start, end, stack(states),
                              dense_masks=stack(masks), archs=archs)
    return [r._replace(state=buckets.unpad_state(r.state, self.state_template(arch), arch=arch,
                                                 sup_arch=sup))
            if r.state is not None else r
            for r, arch in zip(results, archs, strict=False)]  # real trials, then padding lanes

  def _host_states(self, archs, hparams, seeds, init_states) -> list[Any]:
    """Each trial's host state in its own shapes: its resume state, or its fresh init
    drawn from its seed (the state the program would draw, `init_trial_state`)."""
    out = []
    for i, (arch, state) in enumerate(zip(archs, init_states, strict=True)):
      if state is None:
        trial_hparams = {k: jnp.float32(v[i]) for k, v in hparams.items()}
        state = jax.device_get(trial_program.init_trial_state(
            arch, self.spec, trial_hparams, jax.random.key(int(seeds[i])), self.data.num_rows,
            self.data.table_starts))
      out.append(state)
    return out

  def state_template(self, arch: ArchSpec):
    """The abstract TrainState of `arch` on this task's data set (cached)."""
    if arch not in self._templates:
      self._templates[arch] = trial_states.state_template(arch, self.spec, self.data.num_rows,
                                                          self.data.table_starts)
    return self._templates[arch]

  def _run_chunk(self, chunk, arch, hparams, seeds, start, end, states, dense_masks=None,
                 archs=None) -> list[CohortTrialResult]:
    """One program call; `archs` (padded chunks) names each lane's own architecture,
    whose cost metrics its trial reports (else every trial's is `arch`)."""
    archs = archs if archs is not None else [arch] * chunk.lanes
    try:
      out = self.run_stacked(arch, hparams, seeds, start, end, states, dense_masks)
    except jax.errors.JaxRuntimeError as e:  # e.g. out of device memory: the chunk fails, not the study
      return failed_chunk_results(e, chunk, archs, self.costs.count_params,
                                  self.costs.count_flops)
    return chunk_results(out, chunk, archs, self.costs.cost_metrics)
