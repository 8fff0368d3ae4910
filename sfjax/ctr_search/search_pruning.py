"""Pruning inside a CTR search's cohorts (`study.pruner`, issue #26 item 5): the driver's side.

`pruner_of` reads `study.pruner` (`sfjax.cohorts.pruning.from_config`; kind 'none', the
default, returns None and the search runs exactly as without it). `run_pruned_round` runs a
round's suggestions as pruned cohorts (`sfjax.cohorts.pruned_cohort`):

  * every ended trial (done, pruned, failed) is told at once, so the algorithm and the
    pruner see it before the next refill;
  * the pruner judges a member against the study's DONE trials' reports (metrics
    `'<objective>/<step>'`, kept in the journal: a resumed search prunes alike);
  * a freed lane is refilled by `study.ask(1)`, the algorithm's own free proposal
    (never resampled inside the lane's bucket, issue #26): one of the bucket joins the
    lane at the next call, one of another bucket is queued and runs later in the
    round; asks stop once the ended plus running trials reach `study.num_trials`.

`pruning_summary` adds `num_pruned` and `trial_steps_saved` to a search's summary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sfjax.automl.algorithms import ENDED_STATUSES, AlgorithmSpec, Suggestion, TrialStatus
from sfjax.automl.study import Study, TrialRecord
from sfjax.automl.study.optuna_mirror import reported_values
from sfjax.cohorts import pruning
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.pruned_cohort import LaneTrial, run_trials
from sfjax.cohorts.pruning import PrunerSpec
from sfjax.cohorts.trial_result import CohortTrialResult
from sfjax.ctr_search import search_config
from sfjax.ctr_search.search_config import SearchConfigError

# suggestions -> `(CohortJob, members)` pairs, members `(suggestion, arch, hparams)`
# (`search_round.batch_jobs`: a config that cannot be built is told failed there)
JobsOf = Callable[[Sequence[Suggestion]], Sequence[tuple[Any, Sequence[tuple]]]]
# (suggestion, result, its end step) -> the study is told (`search_round.record_result`)
Record = Callable[[Suggestion, CohortTrialResult, int], None]


def pruner_of(config, objective, steps_for_budget: Callable[[float], int],
              algorithm: AlgorithmSpec, schedule: str) -> PrunerSpec | None:
  """The search's pruner (None: kind 'none').

  Raises:
    SearchConfigError: naming the bad `study.pruner.*` field or the clashing setting.
  """
  try:
    return pruning.from_config(search_config.study_field(config, "pruner"), objective,
                               steps_for_budget,
                               executor=search_config.study_field(config, "executor"),
                               schedule=schedule, population_based=algorithm.population_based)
  except ValueError as e:
    raise SearchConfigError(str(e)) from None


def lanes_of(pairs: Sequence[tuple[Any, Sequence[tuple]]]) -> list[LaneTrial]:
  """The lanes of jobs' trials (`JobsOf` pairs), in job order."""
  return [LaneTrial(s, arch, hparams, seed, start, end, state)
          for job, members in pairs
          for (s, arch, hparams), seed, start, end, state in zip(
              members, job.seeds, job.start_steps, job.end_steps, job.init_states, strict=True)]


def run_pruned_round(study: Study, runner: CohortRunner, batch: Sequence[Suggestion],
              spec: PrunerSpec, config, max_steps: int, jobs_of: JobsOf,
              record: Record) -> list[Chunk]:
  """Runs one round's suggestions as pruned cohorts, refilling freed lanes from `study`.

  Args:
    study, runner: the search's.
    batch: the round's suggestions.
    spec: the pruner (`pruner_of`).
    config: the search config (`study.num_trials`, `study.fill_cohorts`).
    max_steps: steps of a full trial: the cohorts' clock period (the task's
      precomputed steps).
    jobs_of: builds the suggestions' jobs (see `JobsOf`).
    record: tells the study an ended trial's result (see `Record`).

  Returns:
    The chunks (program calls) that ran.
  """
  num_trials = int(config.study.num_trials)

  def history() -> list[dict[int, float]]:
    return [reported_values(t.metrics, spec.metric) for t in study.trials()
            if t.status == TrialStatus.DONE]

  def ask() -> LaneTrial | None:
    ended = sum(t.status in ENDED_STATUSES for t in study.trials())
    if ended + len(study.running()) >= num_trials:
      return None
    got = study.ask(1)
    lanes = lanes_of(jobs_of(got)) if got else []
    return lanes[0] if lanes else None

  return run_trials(runner, lanes_of(jobs_of(batch)), spec, period=max_steps, history=history,
                    ask=ask, on_end=lambda lane, result: record(lane.handle, result, lane.end),
                    merge_optimizers=bool(search_config.study_field(config, "fill_cohorts")))


def pruning_summary(trials: Sequence[TrialRecord], steps_for_budget: Callable[[float], int],
            max_steps: int) -> dict[str, int]:
  """`num_pruned` and `trial_steps_saved` (`pruning.summary`; a trial's planned end is its
  budget's steps, a full trial's `max_steps`)."""
  return pruning.summary(trials, lambda t: max_steps if t.suggestion.budget is None
                         else steps_for_budget(t.suggestion.budget))
