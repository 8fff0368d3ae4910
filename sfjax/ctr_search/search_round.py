"""One round of a cohort search: its suggestions trained as cohort jobs and told.

`ask_round` takes the algorithm's own proposals; `form_cohorts` groups them by shape
bucket (`sfjax.cohorts.shape_buckets.buckets`; with `study.fill_cohorts` row optimizers share a program
too); `batch_jobs` makes one `executor.CohortJob` per group, promotions resuming their
parent's saved state (`resume_point`); `run_batch` runs the jobs on an executor and tells
the study every result in group order (`tell_job`, `record_result`: a state kept for a
later promotion is saved before its trial is told). The driver (`search_loop.run_search`)
calls these each round; the pruned and async schedules reuse `batch_jobs` and
`record_result`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

from sfjax.automl.algorithms import Suggestion, TrialStatus, all_objectives
from sfjax.automl.study import Study
from sfjax.cohorts import trial_states
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.shape_buckets import buckets
from sfjax.cohorts.trial_result import CohortTrialResult
from sfjax.ctr_search.executor import CohortJob

_STATES_DIR = "states"


def states_dir_of(workdir: str) -> str:
  """Where a search keeps trial states for promotions: `workdir/states/<trial id>.npz`."""
  return os.path.join(workdir, _STATES_DIR)


def trial_seed(base_seed: int, trial_id: int) -> int:
  """Init seed of a fresh trial: distinct per trial and per study seed, < 2^31."""
  return (base_seed * 1_000_003 + trial_id + 1) % (2**31 - 1)


def ask_round(study: Study, n: int) -> list[Suggestion]:
  """Up to `n` suggestions for one round: the algorithm's own proposals, asked freely.

  Cohorts are formed from them afterwards (`run_batch` groups them by shape bucket,
  `form_cohorts`), never by resampling inside a bucket (issue #26: fixing a round to
  its first trial's bucket narrowed a 16-trial smoke search to one family and one
  row optimizer). So `study.fill_cohorts` never changes what is asked: a round's
  suggestions are those of `study.ask(n)` whatever it is (for a seed, the same).
  Promotions of multi-fidelity algorithms come back as they are (they resume a
  saved state).
  """
  return study.ask(n)


def form_cohorts(archs: Sequence[ArchSpec], merge_optimizers: bool, num_dense: int | None = None,
                 num_fields: int | None = None) -> list[list[int]]:
  """Indices of a round's trials grouped into cohorts (one `CohortJob` each), in order of
  each cohort's first trial (`num_dense`, `num_fields`: the data's, `buckets.bucket_key`).
  Trials of one shape bucket (`buckets.bucket_key`) share a group; with
  `merge_optimizers` (`study.fill_cohorts`) the row optimizer leaves the key, so trials
  that differ only in it (and in the bucket's masked sizes) share one program, each
  lane taking its own (`sfjax.cohorts.lane_optimizers`). Only grouping: the trials
  are the ones given, none added, dropped or changed.
  """
  groups: dict[ArchSpec, list[int]] = {}
  for i, arch in enumerate(archs):
    groups.setdefault(buckets.bucket_key(arch, merge_optimizers, num_dense, num_fields),
                      []).append(i)
  return list(groups.values())


def batch_jobs(study: Study, runner: CohortRunner, batch: Sequence[Suggestion], workdir: str,
               seed: int, max_steps: int, split: Callable[[Any], tuple[ArchSpec, dict[str, float]]],
               merge_optimizers: bool) -> list[tuple[CohortJob, list]]:
  """`batch` as `(job, members)` pairs, one job per cohort (`form_cohorts`: trials whose
  architectures differ only in sizes a superset can hold, `buckets.bucket_key`, and with
  `merge_optimizers` in row optimizers, run as one padded vmapped program per chunk).

  The driver's `runner` reads saved states for promotions; `split` maps a point of the
  space to its (ArchSpec, hyperparameters); a config it cannot build is told FAILED.
  """
  states_dir = states_dir_of(workdir)
  built: list[tuple[Suggestion, ArchSpec, dict[str, float]]] = []
  for s in batch:
    try:
      arch, hparams = split(s.config)
    except ValueError as e:  # a config the runner cannot build: that trial fails
      study.tell(s.trial_id, {}, TrialStatus.FAILED, reason=f"bad config: {e}")
      continue
    built.append((s, arch, hparams))
  pairs = []  # equal architectures run unpadded
  data = runner.spec.num_dense, runner.spec.num_fields
  for group in form_cohorts([a for _, a, _ in built], merge_optimizers, *data):
    members = [built[i] for i in group]
    starts, ends, init_states = [], [], []
    for s, arch, _ in members:
      start, state = resume_point(runner, arch, s, states_dir)
      end = max_steps if s.budget is None else runner.task.steps_for_budget(s.budget)
      starts.append(start)
      ends.append(max(end, start))
      init_states.append(state)
    archs = tuple(arch for _, arch, _ in members)
    pairs.append((CohortJob(archs[0] if len(set(archs)) == 1 else archs,
                            [h for _, _, h in members],
                            [trial_seed(seed, s.trial_id) for s, _, _ in members], starts, ends,
                            init_states, [s.trial_id for s, _, _ in members], runner.ragged,
                            merge_optimizers), members))
  return pairs


def tell_job(study: Study, job: CohortJob, members: list, results: list[CohortTrialResult],
             workdir: str, max_steps: int, keep_states: bool) -> list[Chunk]:
  """Records one job's results (`record_result`); the chunks (program calls) that ran it, each once
  (chunk mates share it; its trial indices are its own)."""
  states_dir = states_dir_of(workdir)
  for (s, _, _), result, end in zip(members, results, job.end_steps, strict=True):
    record_result(study, s, result, states_dir, keep_states and end < max_steps)
  return list(dict.fromkeys(r.chunk for r in results if r.chunk is not None))


def run_batch(study: Study, executor, runner: CohortRunner, batch: Sequence[Suggestion],
              workdir: str, seed: int, max_steps: int, keep_states: bool,
              split: Callable[[Any], tuple[ArchSpec, dict[str, float]]],
              merge_optimizers: bool = False) -> list[Chunk]:
  """Trains `batch` grouped by shape bucket (`batch_jobs`) and tells the study.

  `executor` runs the jobs (`executor.make_executor`); results are told in group
  order whatever the executor. With `keep_states` (multi-fidelity algorithms), the
  state of each successful trial below the full budget is saved for a later
  promotion. A job submitted again after its worker died is journaled as a re-queue
  of its trials.

  Returns:
    The chunks (program calls) that ran the batch, as its results name them
    (`CohortTrialResult.chunk`; whichever executor ran them), for `mean_cohort_width`
    and `lane_utilization`.
  """
  pairs = batch_jobs(study, runner, batch, workdir, seed, max_steps, split, merge_optimizers)
  programs: list[Chunk] = []
  results_of = executor.map([job for job, _ in pairs],
                            lambda job, _: study.record_retry(job.trial_ids))
  for (job, members), results in zip(pairs, results_of, strict=True):
    programs += tell_job(study, job, members, results, workdir, max_steps, keep_states)
  return programs


def resume_point(runner: CohortRunner, arch: ArchSpec, s: Suggestion,
                 states_dir: str) -> tuple[int, Any]:
  """(start step, init state) of a trial: the parent's saved state for a promotion."""
  if s.resume_from is None:
    return 0, None
  path = trial_states.state_path(states_dir, s.resume_from)
  try:
    state = trial_states.load_state(path, runner.state_template(arch))
  except (FileNotFoundError, trial_states.StateFileError) as e:
    logging.warning("trial %d: cannot resume from trial %d (%s); training from scratch",
                    s.trial_id, s.resume_from, e)
    return 0, None
  return int(state.step), state


def record_result(study: Study, s: Suggestion, result: CohortTrialResult, states_dir: str,
                  keep_state: bool) -> None:
  """Saves the trial's state if it may be promoted, tells the study, drops the parent's.

  A trial that trained to the end but has no finite held-out AUC (e.g. one class only
  in the valid half) is told as FAILED: the study needs the objective of a DONE trial.
  """
  status, reason = result.status, result.error
  if status == TrialStatus.DONE and not math.isfinite(float(result.metrics.get("auc", math.nan))):
    status, reason = TrialStatus.FAILED, "held-out AUC is not finite"
  for o in all_objectives(study.objective):
    value = float(result.metrics.get(o.metric, math.nan))
    if status == TrialStatus.DONE and not math.isfinite(value):
      status, reason = TrialStatus.FAILED, f"objective metric {o.metric!r} is not finite"
  if status == TrialStatus.DONE and keep_state and result.state is not None:
    trial_states.save_state(trial_states.state_path(states_dir, s.trial_id), result.state)
  metrics = {k: float(v) for k, v in result.metrics.items() if math.isfinite(float(v))}
  study.tell(s.trial_id, metrics, status, elapsed_s=result.metrics.get("seconds"), reason=reason)
  if s.resume_from is not None:  # each trial is promoted at most once (ASHA, Hyperband)
    parent = trial_states.state_path(states_dir, s.resume_from)
    if os.path.exists(parent):
      os.remove(parent)
