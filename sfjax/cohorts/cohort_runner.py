"""Vmapped cohorts: trials of one `ArchSpec` trained together as one compiled program.

DESIGN.md §4. `CohortRunner.run` takes trials of one architecture (or of one shape
bucket, `sfjax.cohorts.buckets`), groups them (`group_trials`), splits each group
into chunks of the cohort width and runs each chunk as one `jax.jit` of
`jax.vmap(trial)` (`sfjax.cohorts.program`): init (or resume), a
`lax.scan` of the train step over the task's precomputed batches, and eval over
the whole stacked eval set. AUC and logloss are computed exactly on the host.

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
  * A partial chunk runs at the smallest power of two >= its size (at most the
    cohort width), padded with copies of its first trial whose results are
    dropped, so a run compiles at most log2(width) extra programs per range length.
  * The trial axis is sharded over a ('trial',) mesh when the chunk width is a
    multiple of the mesh size; batches are replicated.
  * 'auto' width: `measure_widths` times one budget unit of trials per candidate
    width (compiled first) and keeps the best trials/hour, per arch.
  * Compiled programs are cached per process by (arch, data set spec, resume), so
    runners of one task (e.g. of different widths) share them.
  * A trial's `seconds` is its chunk's wall time (compilation included) divided
    by the real trials of the chunk.
  * Cost metrics of the architecture (`params`, `flops`, `latency_ms` when the
    runner `measure_latency`) come from `trial_costs.TrialCosts`, cached per arch.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.automl.algorithms import TrialStatus
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import buckets as padded
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import trial_states
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.costs import TrialCosts
from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.core import metrics as metrics_lib

WIDTH_CANDIDATES = (1, 2, 4, 8, 16, 32)


class TrialResult(NamedTuple):
  """Outcome of one trial's run.

  Attributes:
    metrics: 'auc', 'logloss' (NaN when failed), 'train_loss' (mean over the
      applied steps of this run), 'steps' (global steps applied so far),
      'params' (`arch.count_params`), 'flops' (per example of the eval forward),
      'latency_ms' (only when the runner measures it), 'seconds' (share of the
      chunk's wall time).
    status: TrialStatus.DONE or TrialStatus.FAILED.
    state: host (numpy) TrainState to resume from; None when failed.
    error: why it failed, else None.
  """

  metrics: dict[str, float]
  status: TrialStatus
  state: Any
  error: str | None


class CohortOutput(NamedTuple):
  """One program call over W trials (device states, host metrics).

  Attributes:
    states: stacked [W] TrainState, on device.
    alive: [W] bool; steps: [W] int, global steps applied.
    losses: [W, L] per-step train loss; applied: [W, L] bool.
    auc, logloss: [W] float64 exact metrics on the first half of the eval rows (the
      'valid' half that searches select on; NaN for failed trials).
    test_auc, test_logloss: [W] the same on the second half, never used for selection.
    seconds: wall time of the call (compilation included).
  """

  states: Any
  alive: np.ndarray
  steps: np.ndarray
  losses: np.ndarray
  applied: np.ndarray
  auc: np.ndarray
  logloss: np.ndarray
  test_auc: np.ndarray
  test_logloss: np.ndarray
  seconds: float


def split_eval_mask(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Splits the real eval examples into a first ('valid') and a second ('test') half.

  Searches select on the valid half; the test half is only reported, so the best
  trial's test AUC is an unbiased comparison with the default config's.
  """
  real = np.cumsum(mask > 0)
  first = real <= (real[-1] + 1) // 2 if real.size else real.astype(bool)
  return mask * first, mask * ~first


def trial_mesh(num_devices: int = 0) -> jax.sharding.Mesh:
  """A 1-D ('trial',) mesh (Auto axes) over the first `num_devices` local devices (0 = all)."""
  devices = jax.local_devices()
  n = len(devices) if num_devices <= 0 else num_devices
  if n > len(devices):
    raise ValueError(f"num_devices={num_devices} but only {len(devices)} devices are visible")
  return jax.sharding.Mesh(np.array(devices[:n]), ("trial",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def stack_hparams(hparams: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """Per-trial dicts (defaults filled, checked) -> `arch.DYNAMIC_KEYS` -> [W] float32."""
  resolved = [arch_lib.resolve_hparams(h) for h in hparams]
  return {k: np.asarray([h[k] for h in resolved], np.float32) for k in arch_lib.DYNAMIC_KEYS}


# Traces of cohort programs per (arch, resume): a compile counter for no-recompile checks.
_TRACES: collections.Counter = collections.Counter()


def num_traces() -> int:
  """How many times any cohort program was traced (compiled) in this process."""
  return sum(_TRACES.values())


@functools.lru_cache(maxsize=64)
def cohort_program(arch: ArchSpec, spec, resume: bool, masked: bool = False,
                   num_rows: int | None = None, ragged: bool = False):
  """The jitted cohort program of `arch` on data set `spec` (cached, shared by runners).

  `jax.jit` then keeps one executable per (width, step count, input shardings).
  Resumed states are donated. `masked`: the padded program of a shape bucket whose
  superset is `arch` (`sfjax.cohorts.buckets`; it takes per-trial dense masks).
  `num_rows`: rows of a fresh trial's table (`TrialData.num_rows`). `ragged`: each
  trial takes its own step range (`trial_program.make_trial_fn`).
  """
  graphdef = trial_program.abstract_graphdef(arch, spec)
  fn = trial_program.make_cohort_fn(
      arch, spec, graphdef, resume=resume, masked=masked, num_rows=num_rows, ragged=ragged,
      on_trace=lambda: _TRACES.update([(arch, resume, masked, ragged)]))
  return jax.jit(fn, donate_argnums=(2,) if resume or masked or ragged else ())


def group_trials(keys: Sequence[Any], start_steps: Sequence[int], end_steps: Sequence[int],
                 resumes: Sequence[bool], ragged: bool) -> list[list[int]]:
  """How `CohortRunner.run` groups trials into programs, before chunking by width.

  Args:
    keys: per trial, its shape bucket (`padded.bucket_key`) or anything hashable.
    start_steps, end_steps, resumes: per trial, its step range and whether it resumes.
    ragged: trials of one bucket with different step ranges (or resumes) share a
      program (each takes its own range); else one group per (bucket, range, resume).

  Returns:
    Groups of trial indices, in order of first appearance. A ragged group lists its
    trials longest range first, so a chunk of the cohort width holds similar lengths.
  """
  groups: dict[Any, list[int]] = {}
  for i, key in enumerate(keys):
    group = key if ragged else (key, int(start_steps[i]), int(end_steps[i]), bool(resumes[i]))
    groups.setdefault(group, []).append(i)
  if not ragged:
    return list(groups.values())
  length = lambda i: int(end_steps[i]) - int(start_steps[i])
  return [sorted(members, key=lambda i: -length(i)) for members in groups.values()]



def _chunk_width(size: int, width: int) -> int:
  return min(width, 1 << max(size - 1, 0).bit_length())


class CohortRunner(TrialCosts):
  """Runs trials of a `CTRTask` as vmapped cohorts (see the module docstring); its trials'
  cost metrics come from `TrialCosts`.

  Attributes:
    task, data (TrialData), spec (DatasetSpec), mesh, cohort_width, width_candidates.
  """

  def __init__(self, task: CTRTask, *, cohort_width: int | str = "auto", mesh=None,
               data: TrialData | None = None, width_candidates: Sequence[int] = WIDTH_CANDIDATES,
               measure_latency: bool = False, ragged: bool = False):
    """Builds the task's TrialData (unless `data` is given).

    Args:
      task: what every trial trains on.
      cohort_width: trials per compiled program, or 'auto' (measured per arch).
      mesh: optional ('trial',) mesh to shard the trial axis over.
      data: TrialData of `task`, shared between runners.
      width_candidates: the widths 'auto' measures.
      measure_latency: add `latency_ms` to every trial's metrics (one extra
        compilation per arch; a public attribute, may be switched on later).
      ragged: `run` lets trials of one bucket with different step ranges (or
        fresh and resumed ones) share a program (`group_trials`); a public
        attribute. Off: one program per exact range, no trial idles.
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
    super().__init__(self.spec, self.data, measure_latency)
    self.ragged = bool(ragged)
    self._widths: dict[ArchSpec, dict[int, float]] = {}
    self._templates: dict[ArchSpec, Any] = {}

  def _place(self, tree, width: int, per_trial: bool):
    if self.mesh is None or width % self.mesh.size:
      return jax.tree.map(jnp.asarray, tree)
    return jax.device_put(tree, NamedSharding(self.mesh, P("trial") if per_trial else P()))

  def run_stacked(self, arch: ArchSpec, hparams: Mapping[str, Any], seeds, start, end,
                  init_states=None, dense_masks=None) -> CohortOutput:
    """Runs W trials over steps `[start, end)` as one program call.

    Args:
      arch: their architecture.
      hparams: `arch.DYNAMIC_KEYS` -> [W] values (missing keys take defaults).
      seeds: [W] ints; a fresh trial's parameters and table are drawn from its seed.
      start, end: the global step range: ints (all trials), or [W] ints, one range
        per trial (a ragged program: `init_states` required; the scan runs the
        longest range and a shorter trial's remaining loop steps are not applied).
      init_states: None (fresh trials, `start` must be 0) or a stacked [W]
        TrainState (host or device; device arrays are donated) at step `start`.
      dense_masks: None, or stacked [W] dense masks of padded trials of a shape
        bucket whose superset is `arch` (`padded.pad_state`; `init_states` required).

    Returns:
      CohortOutput.
    """
    seeds = np.asarray(seeds, np.int32).reshape(-1)
    width = seeds.shape[0]
    defaults = arch_lib.resolve_hparams({})
    stacked = {}
    for key, value in {**{k: None for k in arch_lib.DYNAMIC_KEYS}, **dict(hparams)}.items():
      if value is None:
        value = np.full((width,), defaults[key], np.float32)
      else:
        value = np.asarray(jax.device_get(value), np.float32)
        for v in value.reshape(-1):
          arch_lib.dynamic_value(key, v)
      if value.shape != (width,):
        raise ValueError(f"hparams[{key!r}] has shape {value.shape}, expected ({width},)")
      stacked[key] = value
    starts = np.broadcast_to(np.asarray(start, np.int64), (width,))
    ends = np.broadcast_to(np.asarray(end, np.int64), (width,))
    if (starts < 0).any() or (ends < starts).any():
      raise ValueError(f"run_stacked: invalid step ranges starts={starts.tolist()} "
                       f"ends={ends.tolist()}")
    ragged = bool((starts != starts[0]).any() or (ends != ends[0]).any())
    if init_states is None and (starts != 0).any():
      raise ValueError(f"fresh trials start at step 0, got start={start}; "
                       "pass init_states to resume")
    if ragged and init_states is None:
      raise ValueError("run_stacked: per-trial step ranges need init_states (host-initialise "
                       "the fresh trials)")
    if dense_masks is not None and init_states is None:
      raise ValueError("dense_masks need init_states (padded trials start from padded states)")
    if init_states is not None:
      # Host leaves are copied: the program donates its input state, and on CPU a
      # transferred numpy buffer may be aliased, so the caller's arrays would change.
      init_states = jax.tree.map(lambda x: np.array(x) if isinstance(x, np.ndarray) else x, init_states)
    t0 = time.perf_counter()
    lo, hi = int(starts.min()), int(ends.max())
    batches = self._place(self.data.train_steps(lo, hi), width, per_trial=False)
    eval_batches = self._place(self.data.eval_batches, width, per_trial=False)
    masked = dense_masks is not None
    program = cohort_program(arch, self.spec, init_states is not None, masked,
                             self.data.num_rows, ragged)
    args = [self._place(stacked, width, True), self._place(seeds, width, True),
            None if init_states is None else self._place(init_states, width, True),
            batches, eval_batches, self._place(dense_masks, width, True) if masked else None]
    if ragged:
      args += [self._place(np.asarray(starts - lo, np.int32), width, True),
               self._place(np.asarray(ends - starts, np.int32), width, True),
               jnp.arange(int((ends - starts).max()), dtype=jnp.int32)]
    out = program(*args)
    alive, steps, losses, applied, logits = jax.device_get(
        (out.alive, out.state.step, out.losses, out.applied, out.logits))
    seconds = time.perf_counter() - t0
    logits = logits.reshape(width, -1)
    labels = self.data.eval_labels
    valid_mask, test_mask = split_eval_mask(self.data.eval_mask)
    metrics = np.full((4, width), np.nan)  # auc, logloss, test_auc, test_logloss
    for i in np.flatnonzero(alive):
      probs = metrics_lib.sigmoid(logits[i])
      metrics[:, i] = (metrics_lib.auc(labels, logits[i], valid_mask),
                       metrics_lib.logloss(labels, probs, valid_mask),
                       metrics_lib.auc(labels, logits[i], test_mask),
                       metrics_lib.logloss(labels, probs, test_mask))
    return CohortOutput(out.state, alive, steps, losses, applied, *metrics, seconds)

  def measure_widths(self, arch: ArchSpec, candidates: Sequence[int] = WIDTH_CANDIDATES
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
    if self.cohort_width != "auto":
      return self.cohort_width
    candidates = self.width_candidates
    if num_trials is not None:
      if num_trials <= 1:
        return 1
      candidates = [w for w in candidates if w <= num_trials] or [1]
    rates = self.measure_widths(arch, candidates)
    return max(sorted(rates), key=lambda w: rates[w])

  def run(self, arch: ArchSpec | Sequence[ArchSpec], hparams: Sequence[Mapping[str, float]],
          seeds: Sequence[int], start_steps: Sequence[int], end_steps: Sequence[int] | int,
          init_states: Sequence[Any], ragged: bool | None = None) -> list[TrialResult]:
    """Runs trials of one architecture, or of one shape bucket; results in input order.

    Args:
      arch: the trials' ArchSpec, or one ArchSpec per trial. Trials of one bucket
        (`padded.bucket_key`) whose architectures differ share a padded program
        (`sfjax.cohorts.buckets`); trials of other buckets run apart. Trials of
        one bucket with different step ranges share a program only when the
        run is `ragged` (`group_trials`).
      hparams: per trial, dynamic hyperparameters (`arch.DYNAMIC_KEYS`; missing -> defaults).
      seeds: per trial, its initialisation seed.
      start_steps: per trial, the global step it starts at (0 for a fresh trial).
      end_steps: per trial (or one int for all), the global step it stops at.
      init_states: per trial, None (fresh) or the host state of an earlier
        TrialResult at step `start_steps[i]` (resume: training continues), in the
        trial's own shapes.
      ragged: group by bucket alone (`group_trials`); None: the runner's `ragged`.

    Returns:
      One TrialResult per trial; states in each trial's own shapes.
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
    groups = group_trials([padded.bucket_key(a) for a in archs], start_steps, end_steps,
                          [s is not None for s in init_states],
                          self.ragged if ragged is None else ragged)
    stacked = stack_hparams(hparams)
    results: list[TrialResult | None] = [None] * n
    for members in groups:
      width = self.width_for(archs[members[0]], len(members))
      for lo in range(0, len(members), width):
        chunk = members[lo:lo + width]
        padded_chunk = chunk + [chunk[0]] * (_chunk_width(len(chunk), width) - len(chunk))
        chunk_hparams = {k: v[padded_chunk] for k, v in stacked.items()}
        chunk_seeds = np.asarray(seeds)[padded_chunk]
        ranges = {(int(start_steps[i]), int(end_steps[i]), init_states[i] is not None)
                  for i in chunk}
        if len(ranges) == 1:  # one range (and resume): the shared-range program
          (start, end, resume), = ranges
        else:  # a ragged chunk: per-trial ranges, every trial from a (host) state
          start = np.asarray([int(start_steps[i]) for i in padded_chunk])
          end = np.asarray([int(end_steps[i]) for i in padded_chunk])
          resume = True
        if len({archs[i] for i in chunk}) == 1:
          states = None
          if resume:
            states = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]),
                                  *self._host_states([archs[i] for i in padded_chunk],
                                                     chunk_hparams, chunk_seeds,
                                                     [init_states[i] for i in padded_chunk]))
          chunk_results = self._run_chunk(archs[chunk[0]], chunk_hparams, chunk_seeds, start,
                                          end, states, len(chunk))
        else:
          chunk_results = self._run_padded_chunk(
              [archs[i] for i in padded_chunk], chunk_hparams, chunk_seeds, start, end,
              [init_states[i] for i in padded_chunk], len(chunk))
        for i, result in zip(chunk, chunk_results):
          results[i] = result
    return results

  def _run_padded_chunk(self, archs, hparams, seeds, start, end, init_states,
                        num_real) -> list[TrialResult]:
    """One chunk of a bucket's trials with different architectures: each trial's exact
    state (its resume state, or its fresh init drawn from its seed) padded to the
    chunk's superset, one masked program call, results cut back to exact shapes."""
    sup = padded.superset(archs)
    template = self.state_template(sup)
    states, masks = [], []
    for arch, state in zip(archs, self._host_states(archs, hparams, seeds, init_states)):
      state, mask = padded.pad_state(state, template, arch=arch, sup_arch=sup)
      states.append(state)
      masks.append(mask)
    stack = lambda trees: jax.tree.map(lambda *xs: np.stack(xs), *trees)
    results = self._run_chunk(sup, hparams, seeds, start, end, stack(states), num_real,
                              dense_masks=stack(masks), archs=archs)
    return [r._replace(state=padded.unpad_state(r.state, self.state_template(arch), arch=arch,
                                                sup_arch=sup))
            if r.state is not None else r for r, arch in zip(results, archs)]

  def _host_states(self, archs, hparams, seeds, init_states) -> list[Any]:
    """Each trial's host state in its own shapes: its resume state, or its fresh init
    drawn from its seed (the state the program would draw, `init_trial_state`)."""
    out = []
    for i, (arch, state) in enumerate(zip(archs, init_states)):
      if state is None:
        trial_hparams = {k: jnp.float32(v[i]) for k, v in hparams.items()}
        state = jax.device_get(trial_program.init_trial_state(
            arch, self.spec, trial_hparams, jax.random.key(int(seeds[i])), self.data.num_rows))
      out.append(state)
    return out

  def state_template(self, arch: ArchSpec):
    """The abstract TrainState of `arch` on this task's data set (cached)."""
    if arch not in self._templates:
      self._templates[arch] = trial_states.state_template(arch, self.spec, self.data.num_rows)
    return self._templates[arch]

  def _run_chunk(self, arch, hparams, seeds, start, end, states, num_real, dense_masks=None,
                 archs=None) -> list[TrialResult]:
    """One program call; `archs` (padded chunks) names each trial's own architecture,
    whose cost metrics it reports (else every trial's is `arch`)."""
    archs = archs if archs is not None else [arch] * num_real
    try:
      out = self.run_stacked(arch, hparams, seeds, start, end, states, dense_masks)
    except jax.errors.JaxRuntimeError as e:  # e.g. out of device memory: the chunk fails, not the study
      return [TrialResult({"auc": float("nan"), "logloss": float("nan"),
                           "test_auc": float("nan"), "test_logloss": float("nan"),
                           "train_loss": float("nan"), "steps": start,
                           "params": self.count_params(archs[i]),
                           "flops": self.count_flops(archs[i]), "seconds": 0.0},
                          TrialStatus.FAILED, None, f"{type(e).__name__}: {e}")
              for i in range(num_real)]
    host_states = jax.device_get(out.states)
    results = []
    for i in range(num_real):
      costs = self.cost_metrics(archs[i])
      ok = out.applied[i]
      metrics = {"auc": float(out.auc[i]), "logloss": float(out.logloss[i]),
                 "test_auc": float(out.test_auc[i]), "test_logloss": float(out.test_logloss[i]),
                 "train_loss": float(np.mean(out.losses[i][ok])) if ok.any() else float("nan"),
                 "steps": int(out.steps[i]), **costs, "seconds": out.seconds / num_real}
      if out.alive[i]:
        state = jax.tree.map(lambda x: x[i].copy(), host_states)
        results.append(TrialResult(metrics, TrialStatus.DONE, state, None))
      else:
        results.append(TrialResult(metrics, TrialStatus.FAILED, None,
                                   f"loss or parameters became non-finite at step {int(out.steps[i]) + 1}"))
    return results
