"""The search driver: `run_search(config, workdir) -> summary`, resumable after SIGKILL.

One round of the loop (VEGA's search step, arXiv 2011.01507):

  study.ask(n)            n fills a cohort; quota filters (`study.max_params`) reject
                          configs before training (recorded, not counted);
  group by ArchSpec       trials with equal architecture share one vmapped program;
  CohortRunner.run        promotions (`resume_from`) continue from the parent's saved
                          state `workdir/states/<id>.npz` up to their new budget;
  study.tell              every result, failed ones as 'failed' (never fatal);
  leaderboard             top-k trials by held-out AUC, to stderr.

How the suggestions run is the algorithm's hook, not its name: a
`population_based` algorithm (PBT) trains each asked batch as one population
(`search_pbt.run_population`); the others run cohorts, keeping trial states when
the algorithm is `multi_fidelity` (ASHA, Hyperband: promotions resume them).

The concrete space is passed in (`space_provider.CTRSearchSpace`; the library
never imports `search_spaces/`). At the end `study.export()` writes
`trials.jsonl` and `best.json`. The space's default config (the trainer's
default model) is trained once at the full budget and cached in
`workdir/default.json`, so the summary says whether the search beat it on the
held-out test half of the eval rows.

Resume: the `Study` journal records every ask and tell durably, so rerunning the
same command on the same workdir skips finished trials, re-runs the ones that
were in flight, and restores the algorithm's state. A state file is written
(atomically) before its trial is told, so a told trial's state is never missing
unless deleted. `workdir/search.json` records the task, seed, space and algorithm
settings; rerunning with different ones is an error naming the fields.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from absl import logging

from sfjax.automl.algorithms import Objective, Suggestion, TrialStatus
from sfjax.automl.study import Quota, Study, TrialRecord
from sfjax.ctr_search import search_config, search_pbt, search_report, trial_states
from sfjax.ctr_search.arch import ArchSpec, split_config
from sfjax.ctr_search.cohort import CohortRunner, TrialResult
from sfjax.ctr_search.search_config import SearchConfigError
from sfjax.ctr_search.space_provider import CTRSearchSpace

AUTO_ASK_BATCH = 8  # trials asked per round with cohort_width='auto'
OBJECTIVE = Objective("auc", "maximize")
DIRECTIONS = {"auc": "maximize", "params": "minimize"}
DEFAULT_FILE = "default.json"
STATES_DIR = "states"


def trial_seed(base_seed: int, trial_id: int) -> int:
  """Init seed of a fresh trial: distinct per trial and per study seed, < 2^31."""
  return (base_seed * 1_000_003 + trial_id + 1) % (2**31 - 1)


class _Runners:
  """The cohort runner, plus a width-1 runner on the same data for lone trials.

  With 'auto' width a group of one trial would otherwise pay for measuring every
  candidate width (compiling each) although any width runs it alone.
  """

  def __init__(self, runner: CohortRunner):
    self.main = runner
    self._single = None

  def for_group(self, size: int) -> CohortRunner:
    """The runner for a group of `size` trials of one architecture."""
    if size > 1 or self.main.cohort_width != "auto":
      return self.main
    if self._single is None:
      self._single = CohortRunner(self.main.task, cohort_width=1, mesh=self.main.mesh,
                                  data=self.main.data)
    return self._single


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
    'default_metrics', 'beats_default'}`. `num_trials_done` counts trials trained to
    a final status (done or failed; quota rejections excluded), `num_failed` those
    that failed; the best trial is the best DONE one among the largest budget
    reached (selected on `auc`, the valid half of the eval rows); `beats_default`
    compares its `test_auc` (the test half) with the default config's.

  Raises:
    SearchConfigError: a bad config, or a workdir made with a different one.
  """
  search_config.check_study_settings(config)
  width = search_config.parse_cohort_width(config.study.cohort_width)
  space = search_config.make_space(config, search_space)
  algorithm = search_config.make_algorithm(config)
  task = search_config.make_task(config)
  os.makedirs(workdir, exist_ok=True)
  search_config.check_settings(workdir, search_config.settings_record(config))
  if runner is None:
    runner = CohortRunner(task, cohort_width=width)
  elif runner.task != task:
    raise SearchConfigError("run_search: the given runner was built for a different task "
                            "than config.task")
  runners = _Runners(runner)
  split = lambda c: split_config(search_space.runner_config(c))
  quotas = []
  if config.study.max_params:
    quotas.append(Quota(f"params <= {config.study.max_params}",
                        {"params": lambda c: runner.count_params(split(c)[0])}))
  max_steps = task.steps_for_budget(config.study.max_budget)
  ask_batch = config.study.ask_batch or (width if width != "auto" else AUTO_ASK_BATCH)
  if algorithm.population_based:
    ask_batch = algorithm.population_size
    run_round = lambda study, batch: search_pbt.run_population(
        study, runner, batch, [trial_seed(config.seed, s.trial_id) for s in batch],
        algorithm.rounds(config.study.max_budget),
        task.steps_for_budget(algorithm.pbt_interval), (config.seed, batch[0].trial_id),
        search_pbt.pbt_bounds(space, search_space.zero_allowed), search_space.runner_config,
        algorithm.quantile)
  else:
    run_round = lambda study, batch: run_batch(
        study, runners, batch, workdir, config.seed, max_steps,
        keep_states=algorithm.multi_fidelity, split=split)
  started = time.perf_counter()
  with Study.open(workdir, space, algorithm, OBJECTIVE, DIRECTIONS, quotas=quotas) as study:
    default = default_metrics(workdir, runners.for_group(1), config.seed, max_steps, search_space)
    while True:
      final = _num_final(study)
      if final >= config.study.num_trials:
        break
      batch = study.ask(min(ask_batch, config.study.num_trials - final))
      if not batch:
        break
      run_round(study, batch)
      sys.stderr.write(search_report.leaderboard(
          study.trials(), config.study.leaderboard_size, default.get("auc"),
          config.study.num_trials, time.perf_counter() - started))
      sys.stderr.flush()
    study.export()
    return summarize(study, default)


def _num_final(study: Study) -> int:
  return sum(t.status in (TrialStatus.DONE, TrialStatus.FAILED, TrialStatus.PRUNED)
             for t in study.trials())


def default_metrics(workdir: str, runner: CohortRunner, seed: int, steps: int,
                    search_space: CTRSearchSpace) -> dict[str, float]:
  """Held-out metrics of the space's default config at `steps` steps, cached in default.json."""
  path = os.path.join(workdir, DEFAULT_FILE)
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return json.load(f)["metrics"]
  config = search_space.default_config(None)
  arch, hparams = split_config(search_space.runner_config(config))
  logging.info("training the default config (%s) for %d steps", arch.describe(), steps)
  result = runner.run(arch, [hparams], [trial_seed(seed, -1)], [0], [steps], [None])[0]
  if result.status != TrialStatus.DONE:
    logging.warning("the default config failed: %s", result.error)
  search_config.write_json(path, {"config": config.to_dict(), "status": result.status.value,
                     "metrics": result.metrics, "error": result.error})
  return dict(result.metrics)


def run_batch(study: Study, runners: _Runners, batch: Sequence[Suggestion], workdir: str,
              seed: int, max_steps: int, keep_states: bool,
              split: Callable[[Any], tuple[ArchSpec, dict[str, float]]]) -> None:
  """Trains `batch` grouped by architecture and tells the study every result.

  With `keep_states` (multi-fidelity algorithms), the state of each successful
  trial below the full budget is saved for a later promotion. `split` maps a
  point of the space to its (ArchSpec, hyperparameters).
  """
  states_dir = os.path.join(workdir, STATES_DIR)
  groups: dict[ArchSpec, list[tuple[Suggestion, dict[str, float]]]] = {}
  for s in batch:
    try:
      arch, hparams = split(s.config)
    except ValueError as e:  # a config the runner cannot build: that trial fails
      study.tell(s.trial_id, {}, TrialStatus.FAILED, reason=f"bad config: {e}")
      continue
    groups.setdefault(arch, []).append((s, hparams))
  for arch, members in groups.items():
    runner = runners.for_group(len(members))
    starts, ends, init_states = [], [], []
    for s, _ in members:
      start, state = _resume_point(runner, arch, s, states_dir)
      end = max_steps if s.budget is None else runner.task.steps_for_budget(s.budget)
      starts.append(start)
      ends.append(max(end, start))
      init_states.append(state)
    seeds = [trial_seed(seed, s.trial_id) for s, _ in members]
    try:
      results = runner.run(arch, [h for _, h in members], seeds, starts, ends, init_states)
    except Exception as e:  # pylint: disable=broad-except  (a trial's failure is never fatal)
      logging.exception("cohort of %d trials (%s) failed", len(members), arch.describe())
      results = [TrialResult({}, TrialStatus.FAILED, None, f"{type(e).__name__}: {e}")] * len(members)
    for (s, _), result, end in zip(members, results, ends):
      _record(study, s, result, states_dir, keep_states and end < max_steps)


def _resume_point(runner: CohortRunner, arch: ArchSpec, s: Suggestion,
                  states_dir: str) -> tuple[int, Any]:
  """(start step, init state) of a trial: the parent's saved state for a promotion."""
  if s.resume_from is None:
    return 0, None
  path = trial_states.state_path(states_dir, s.resume_from)
  try:
    state = trial_states.load_state(path, trial_states.state_template(arch, runner.spec))
  except (FileNotFoundError, trial_states.StateFileError) as e:
    logging.warning("trial %d: cannot resume from trial %d (%s); training from scratch",
                    s.trial_id, s.resume_from, e)
    return 0, None
  return int(state.step), state


def _record(study: Study, s: Suggestion, result: TrialResult, states_dir: str,
            keep_state: bool) -> None:
  """Saves the trial's state if it may be promoted, tells the study, drops the parent's.

  A trial that trained to the end but has no finite held-out AUC (e.g. one class only
  in the valid half) is told as FAILED: the study needs the objective of a DONE trial.
  """
  status, reason = result.status, result.error
  if status == TrialStatus.DONE and not math.isfinite(float(result.metrics.get("auc", math.nan))):
    status, reason = TrialStatus.FAILED, "held-out AUC is not finite"
  if status == TrialStatus.DONE and keep_state and result.state is not None:
    trial_states.save_state(trial_states.state_path(states_dir, s.trial_id), result.state)
  metrics = {k: float(v) for k, v in result.metrics.items() if math.isfinite(float(v))}
  study.tell(s.trial_id, metrics, status, elapsed_s=result.metrics.get("seconds"), reason=reason)
  if s.resume_from is not None:  # each trial is promoted at most once (ASHA, Hyperband)
    parent = trial_states.state_path(states_dir, s.resume_from)
    if os.path.exists(parent):
      os.remove(parent)


def summarize(study: Study, default: Mapping[str, float]) -> dict[str, Any]:
  """The summary dict `run_search` returns."""
  trials = study.trials()
  best: TrialRecord | None = study.best()
  # Selection used 'auc' (the valid half of the eval rows); the comparison with the default
  # uses the test half, which no selection saw.
  best_auc = best.metrics.get("test_auc") if best is not None else None
  default_auc = default.get("test_auc")
  # A default without a finite test AUC (failed, or never measured) is never beaten.
  beats = (best_auc is not None and default_auc is not None and math.isfinite(best_auc)
           and math.isfinite(default_auc) and best_auc > default_auc)
  return {
      "best_trial_id": best.trial_id if best is not None else None,
      "best_config": best.config.to_dict() if best is not None else None,
      "best_metrics": dict(best.metrics) if best is not None else None,
      "num_trials_done": sum(t.status in (TrialStatus.DONE, TrialStatus.FAILED, TrialStatus.PRUNED)
                             for t in trials),
      "num_failed": sum(t.status == TrialStatus.FAILED for t in trials),
      "default_metrics": dict(default),
      "beats_default": bool(beats),
  }
