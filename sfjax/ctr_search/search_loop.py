"""The search driver: `run_search(config, workdir) -> summary`, resumable after SIGKILL.

One round of the loop (VEGA's search step, arXiv 2011.01507):

  study.ask(n)            the round's n trials, every one the algorithm's own
                          free proposal (`search_round.ask_round`; never resampled inside a
                          bucket, issue #26); quota filters (`study.max_params`,
                          `max_flops`, `max_latency_ms`) reject configs before
                          training (recorded, not counted);
  group by bucket         cohorts are formed from those proposals: trials whose
                          architectures differ only in MLP widths / depth, cross
                          layers or (where `bucket_layout` can remap it) embed_dim
                          share one padded vmapped program (`sfjax.cohorts.shape_buckets.buckets`),
                          one `executor.CohortJob` per bucket; `study.fill_cohorts`
                          merges proposals into as few programs as possible: the
                          row optimizer leaves the bucket too (each lane picks its
                          own, `sfjax.cohorts.lane_optimizers`); lanes no proposal
                          fills stay empty (power-of-two padding);
  executor.map            `study.executor`: 'local' runs `CohortRunner.run` here, 'dask'
                          as Dask tasks (`executor_dask`); promotions (`resume_from`)
                          continue from the parent's saved state
                          `workdir/states/<id>.npz` up to their new budget (or
                          `study.dispatch=async`: a queue free workers take, dispatch.py);
  study.tell              every result in group order (async: as its job ends), whatever
                          the executor, failed ones as 'failed' (never fatal);
                          each result names the chunk (program call) that ran it,
                          from which the summary's cohort width and lane use come;
  leaderboard             top-k trials by held-out AUC, to stderr.

Objectives (`study.objectives`, default 'auc:max'): several need a multi-objective
algorithm (nsga2, motpe); the first one picks the best trial. Trials report
`params`, `flops` and (when an objective or quota needs it) `latency_ms` besides
the AUCs; `best.json` and the summary hold the Pareto front (per budget in
`best.json`), printed to stderr at the end of a multi-objective search. The driver
alone writes the journal and the saved states, whichever executor runs the trials.

How the suggestions run is the algorithm's hook, not its name: a
`population_based` algorithm (PBT) trains each asked batch as one population
(`search_pbt.run_population`); the others run cohorts, keeping trial states when
the algorithm is `multi_fidelity` (ASHA, Hyperband: promotions resume them); with
`study.pruner`, members are pruned at eval points and lanes refilled (`search_pruning`).

The concrete space is passed in (`space_provider.CTRSearchSpace`; the library
never imports `search_spaces/`). At the end `study.export()` writes
`trials.jsonl` and `best.json`. The space's default config (the trainer's
default model) is trained once at the full budget and cached in
`workdir/default.json`, so the summary says whether the search beat it on the
valid half of the eval rows, the split every selection reads.

Resume: the `Study` journal records every ask and tell durably, so rerunning the
same command on the same workdir skips finished trials, re-runs the ones that
were in flight, and restores the algorithm's state. A state file is written
(atomically) before its trial is told, so a told trial's state is never missing
unless deleted. `workdir/search.json` records the task, seed, space and algorithm
settings; rerunning with different ones is an error naming the fields.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from absl import logging

from sfjax.automl.algorithms import (
  ENDED_STATUSES,
  Objective,
  Objectives,
  TrialStatus,
  directions_of,
)
from sfjax.automl.algorithms.pbt import PBT
from sfjax.automl.study import Study, TrialRecord, limit_quotas
from sfjax.cohorts import chunk_plan
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.latency import LatencySettings
from sfjax.core import workdir_lock
from sfjax.ctr_search import (
  dispatch,
  search_config,
  search_events,
  search_pbt,
  search_report,
  search_round,
)
from sfjax.ctr_search.executor import CohortJob, make_executor
from sfjax.ctr_search.search_config import SearchConfigError
from sfjax.ctr_search.search_pruning import pruner_of, pruning_summary, run_pruned_round
from sfjax.ctr_search.space_provider import CTRSearchSpace

_AUTO_ASK_BATCH = 8  # trials asked per round with cohort_width='auto'
OBJECTIVE = Objective("auc", "maximize")
DIRECTIONS = {"auc": "maximize", "params": "minimize"}
_DEFAULT_FILE = "default.json"


def run_search(config, workdir: str, search_space: CTRSearchSpace,
               runner: CohortRunner | None = None) -> dict[str, Any]:
  """Runs (or resumes) the search that `config` describes in `workdir`.

  Args:
    config: the `experiments/configs/search_ctr.py` ConfigDict.
    workdir: the study's directory (journal, states, exports, default.json).
    search_space: the concrete space (e.g. `search_spaces.ctr.SEARCH_SPACE`).
    runner: a `CohortRunner` for `search_config.make_task(config)` to reuse
      (default: built here with `study.cohort_width`).

  Returns:
    `{'best_trial_id', 'best_config', 'best_metrics', 'num_trials_done', 'num_failed',
    'default_metrics', 'beats_default', 'pareto_front', 'mean_cohort_width',
    'lane_utilization'}` (`chunk_plan.program_summary` of the chunks that ran).
    `mean_cohort_width` is the mean number of trials trained together as one vmapped
    program call (one shape bucket) over this process's rounds (None if it ran none), and
    `lane_utilization` the share of the trial-steps those calls ran (every lane, padding
    included, over the whole scan) that trained a trial (below 1 when ragged programs
    held trials of different lengths or a partial chunk was padded). `num_trials_done` counts
    trials trained to a final status (done or failed; quota rejections excluded),
    `num_failed` those that failed; the best trial is the best DONE one among the
    largest budget reached (selected on the first objective, by default `auc`, the
    valid half of the eval rows); `beats_default` compares its `auc` with the default
    config's on that same split (one selection split, issue #26); `pareto_front` lists
    the trial ids of the front at that budget over the objectives (AUC and params for
    one objective).
    Latency quotas are measured on the driver's device.

  The call holds `workdir`'s lock (`sfjax.core.workdir_lock`, issue #25) throughout, so the
  caller must not hold it (the search CLI leaves it to this call).

  Raises:
    SearchConfigError: a bad config, or a workdir made with a different one.
    ConnectionError: `study.dask_address` names no reachable scheduler.
    WorkdirLockedError: another run (or handle) holds `workdir`; the message names it.
  """
  with workdir_lock.hold_workdir(workdir, "run_search"):
    return _run_search(config, workdir, search_space, runner)


def _run_search(config, workdir: str, search_space: CTRSearchSpace,
                runner: CohortRunner | None) -> dict[str, Any]:
  """`run_search` once `workdir` is held."""
  search_config.check_study_settings(config)
  width = search_config.parse_cohort_width(config.study.cohort_width)
  space = search_config.make_space(config, search_space)
  algorithm = search_config.make_algorithm(config)
  objective = search_config.make_objective(config)
  # One objective: the front reported is AUC up, parameters down, as always.
  directions = directions_of(objective) if isinstance(objective, Objectives) else DIRECTIONS

  def field(name):
    return search_config.study_field(config, name)

  needs_latency = "latency_ms" in directions or field("max_latency_ms") > 0
  try:  # how latency_ms is obtained (sfjax.cohorts.latency)
    latency = LatencySettings(field("latency_source"), field("latency_batch_size"),
                              field("latency_repeats"))
  except ValueError as e:
    raise SearchConfigError(str(e)) from None
  task = search_config.make_task(config)
  if runner is None:
    runner = CohortRunner(task, cohort_width=width, measure_latency=needs_latency)
  if runner.task == task:  # before the workdir records the study
    search_config.check_space_data(space, runner.spec)
  os.makedirs(workdir, exist_ok=True)
  search_config.check_search_settings(workdir, search_config.search_settings_record(config))
  if runner.task != task:
    raise SearchConfigError("run_search: the given runner was built for a different task "
                            "than config.task")
  if needs_latency:
    runner.costs.measure_latency = True
  runner.ragged = bool(field("ragged_cohorts"))
  runner.costs.set_latency_settings(latency)

  def split(c):
    return split_config(search_space.runner_config(c))

  def arch_of(c):
    return split(c)[0]

  quotas = limit_quotas(
      {"params": config.study.max_params, "flops": field("max_flops"),
       "latency_ms": field("max_latency_ms")},
      {"params": lambda c: runner.costs.count_params(arch_of(c)),
       "flops": lambda c: runner.costs.count_flops(arch_of(c)),
       "latency_ms": lambda c: runner.costs.latency_ms(arch_of(c))})
  max_steps = task.steps_for_budget(config.study.max_budget)
  ask_batch = config.study.ask_batch or (width if width != "auto" else _AUTO_ASK_BATCH)
  schedule = dispatch.choose_schedule(field("dispatch"), field("executor"), algorithm)
  pruner = pruner_of(config, objective, task.steps_for_budget, algorithm, schedule)
  executor = make_executor(field("executor"), runner, address=field("dask_address"),
                           num_workers=field("dask_workers"))
  if isinstance(algorithm, PBT):  # the `population_based` algorithm
    ask_batch = algorithm.population_size
    pbt = algorithm

    def run_round(study, batch):  # one vmapped population: every member in one program
      seeds = [search_round.trial_seed(config.seed, s.trial_id) for s in batch]
      return search_pbt.run_population(
          study, runner, batch, seeds, pbt.rounds(config.study.max_budget),
          task.steps_for_budget(pbt.pbt_interval), (config.seed, batch[0].trial_id),
          search_pbt.pbt_bounds(space, search_space.zero_allowed), search_space.runner_config,
          pbt.quantile)
  else:
    states_dir = search_round.states_dir_of(workdir)

    def run_round(study, batch):
      if pruner is not None:  # study.pruner: members pruned at eval points, lanes refilled
        return run_pruned_round(
            study, runner, batch, pruner, config, max_steps,
            lambda ss: search_round.batch_jobs(study, runner, ss, workdir, config.seed,
                                               max_steps, split, False),
            lambda s, result, end: search_round.record_result(
                study, s, result, states_dir, algorithm.multi_fidelity and end < max_steps))
      return search_round.run_batch(study, executor, runner, batch, workdir, config.seed,
                                    max_steps, keep_states=algorithm.multi_fidelity,
                                    split=split, merge_optimizers=bool(field("fill_cohorts")))

    def cohort_jobs(study, batch):  # the asynchronous schedule's cohorts of one ask
      return search_round.batch_jobs(study, runner, batch, workdir, config.seed, max_steps,
                                     split, bool(field("fill_cohorts")))
  started = time.perf_counter()
  events = search_events.SearchEvents(workdir, objective.metric, objective.direction,
                                      mirror=search_events.open_mirror(
                                          config, workdir, space, objective,
                                          task.steps_for_budget))
  with executor, Study.open(workdir, space, algorithm, objective, directions,
                            quotas=quotas) as study, contextlib.closing(events):
    default = default_metrics(workdir, executor, config.seed, max_steps, search_space)
    events.update(study.trials())
    programs: list[Chunk] = []  # the program calls of this process's rounds

    def told(chunks):  # after each round (or, async, each job): events and leaderboard
      programs.extend(chunks)
      events.update(study.trials())
      sys.stderr.write(search_report.leaderboard(
          study.trials(), config.study.leaderboard_size, default.get("auc"),
          config.study.num_trials, time.perf_counter() - started))
      sys.stderr.flush()

    loop = dispatch.Loop(study, search_round.ask_round, int(ask_batch),
                         config.study.num_trials, executor,
                         on_asked=lambda: events.update(study.trials()))  # mirror: running
    if schedule == "async":  # a queue of cohorts that free workers take (`dispatch.py`)
      loop.run_async(lambda batch: cohort_jobs(study, batch), lambda job, members, results: told(
          search_round.tell_job(study, job, members, results, workdir, max_steps,
                                algorithm.multi_fidelity)))
    else:
      loop.run_rounds(lambda batch: told(run_round(study, batch)))
    if not isinstance(algorithm, PBT):  # PBT trains in the driver: no workers to measure
      sys.stderr.write(search_report.dispatch_line(loop.save(workdir, schedule)))
    study.export()
    if isinstance(objective, Objectives):
      sys.stderr.write(search_report.pareto_report(study.pareto_fronts(), directions))
    pruned = {} if pruner is None else pruning_summary(study.trials(), task.steps_for_budget,
                                                        max_steps)
    return dict(_summarize(study, default), **chunk_plan.program_summary(programs), **pruned)


def default_metrics(workdir: str, executor, seed: int, steps: int,
                    search_space: CTRSearchSpace) -> dict[str, float]:
  """Held-out metrics of the space's default config at `steps` steps, cached in default.json.

  `executor` runs it (`executor.make_executor`), like any trial.
  """
  path = os.path.join(workdir, _DEFAULT_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return json.load(f)["metrics"]
  config = search_space.default_config(None)
  arch, hparams = split_config(search_space.runner_config(config))
  logging.info("training the default config (%s) for %d steps", arch.describe(), steps)
  job = CohortJob(arch, [hparams], [search_round.trial_seed(seed, -1)], [0], [steps], [None], [-1])
  result = next(iter(executor.map([job])))[0]
  if result.status != TrialStatus.DONE:
    logging.warning("the default config failed: %s", result.error)
  search_config.write_json(path, {"config": config.to_dict(), "status": result.status.value,
                                  "metrics": result.metrics, "error": result.error})
  return dict(result.metrics)


def _summarize(study: Study, default: Mapping[str, float]) -> dict[str, Any]:
  """The summary dict `run_search` returns."""
  trials = study.trials()
  best: TrialRecord | None = study.best()
  # One selection split (issue #26): the leaderboard, best.json and this comparison all read
  # 'auc', the valid half of the eval rows; test AUC is reported for the final model only.
  best_auc = best.metrics.get("auc") if best is not None else None
  default_auc = default.get("auc")
  # A default without a finite valid AUC (failed, or never measured) is never beaten.
  beats = (best_auc is not None and default_auc is not None and math.isfinite(best_auc)
           and math.isfinite(default_auc) and best_auc > default_auc)
  return {
      "best_trial_id": best.trial_id if best is not None else None,
      "best_config": best.config.to_dict() if best is not None else None,
      "best_metrics": dict(best.metrics) if best is not None else None,
      "num_trials_done": sum(t.status in ENDED_STATUSES for t in trials),
      "num_failed": sum(t.status == TrialStatus.FAILED for t in trials),
      "default_metrics": dict(default),
      "beats_default": bool(beats),
      # non-dominated trials at the largest budget reached, over the study's directions
      # (its objectives; AUC up / parameters down for a single-objective search)
      "pareto_front": [t.trial_id for t in study.pareto_front()] if study.directions else [],
  }
