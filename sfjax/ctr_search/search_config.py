"""Search settings: the config of `experiments/configs/search_ctr.py`, parsed and checked.

Builds the space, task and algorithm a search runs, and guards a workdir against
being resumed with different settings (`workdir/search.json`): the `Study`
journal already refuses a changed space or algorithm; this adds the task, seed
and space options, naming every differing field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from sfjax.automl.algorithms import ALGORITHMS, PBT, AlgorithmSpec, Objective, Objectives
from sfjax.automl.space import Space
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts.task import CTRTask
from sfjax.core import names
from sfjax.core.atomic import atomic_write
from sfjax.core.errors import ConfigError
from sfjax.ctr_search.executor import EXECUTORS
from sfjax.ctr_search.space_provider import CTRSearchSpace

SETTINGS_FILE = "search.json"
# Metrics every CTR trial reports that a search may optimise ('test_auc' is never
# selected on: it is the held-out half that judges the search). `latency_ms` is
# measured only when an objective or a quota needs it.
OBJECTIVE_METRICS = ("auc", "logloss", "train_loss", "params", "flops", "latency_ms")
DEFAULT_OBJECTIVES = "auc:max"
_DIRECTION_NAMES = {"max": "maximize", "maximize": "maximize", "min": "minimize",
                    "minimize": "minimize"}
# New study fields and their defaults (configs written before them still load).
STUDY_DEFAULTS = {"objectives": "", "max_flops": 0.0, "max_latency_ms": 0.0,
                  "executor": "local", "dask_address": "", "dask_workers": 2,
                  "fill_cohorts": True, "ragged_cohorts": True}


class SearchConfigError(ValueError):
  """A bad search config, or a workdir created with a different one; names the field."""


def parse_cohort_width(value: Any) -> int | str:
  """`study.cohort_width`: 'auto' or a positive integer (given as a string or an int)."""
  text = str(value).strip()
  if text == "auto":
    return "auto"
  if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
    raise SearchConfigError(f"study.cohort_width: expected 'auto' or a positive integer, "
                            f"got {value!r}")
  return int(text)


def study_field(config, name: str) -> Any:
  """`config.study.<name>`, or its default (`STUDY_DEFAULTS`) when the config predates it."""
  return config.study.get(name, STUDY_DEFAULTS[name])


def parse_objectives(value: Any) -> Objective:
  """`study.objectives`, e.g. 'auc:max,params:min' ('' = 'auc:max', the single default).

  Returns:
    The `Objective`, or an `Objectives` for several (the first one is primary: it
    picks `best_trial_id` and sorts the leaderboard).

  Raises:
    SearchConfigError: naming `study.objectives` (bad syntax, unknown metric or
      direction, a metric named twice).
  """
  text = DEFAULT_OBJECTIVES if value is None or not str(value).strip() else str(value)
  if not isinstance(value, str) and value is not None:
    raise SearchConfigError(f"study.objectives: expected a string like 'auc:max,params:min', "
                            f"got {value!r}")
  objectives = []
  for part in text.split(","):
    metric, sep, direction = (x.strip() for x in part.partition(":"))
    if not sep or not metric:
      raise SearchConfigError(f"study.objectives: {part.strip()!r} is not '<metric>:max' or "
                              f"'<metric>:min' (in {text!r})")
    if metric not in OBJECTIVE_METRICS:
      raise SearchConfigError(f"study.objectives: unknown metric {metric!r}; known: "
                              f"{list(OBJECTIVE_METRICS)}")
    if direction not in _DIRECTION_NAMES:
      raise SearchConfigError(f"study.objectives: direction {direction!r} of {metric!r} is not "
                              "'max' or 'min'")
    objectives.append(Objective(metric, _DIRECTION_NAMES[direction]))
  try:
    return Objectives.of(objectives)
  except ValueError as e:
    raise SearchConfigError(f"study.objectives: {e}") from None


def make_objective(config) -> Objective:
  """The search's objective(s) (`parse_objectives`), checked against the algorithm.

  Raises:
    SearchConfigError: several objectives for a single-objective algorithm (naming
      `study.objectives` and the algorithms that take several).
  """
  objective = parse_objectives(study_field(config, "objectives"))
  cls = _algorithm_class(config)
  if isinstance(objective, Objectives) and not getattr(cls, "multi_objective", False):
    multi = sorted(n for n, c in ALGORITHMS.items() if getattr(c, "multi_objective", False))
    raise SearchConfigError(f"study.objectives: {len(objective.all)} objectives, but "
                            f"study.algorithm={cls.name!r} optimises one; use one of {multi}")
  return objective


def make_space(config, search_space: CTRSearchSpace) -> Space:
  """The search space: `search_space.from_config(config.space)`, or for a population-based
  algorithm (PBT) the hyperparameters of one architecture (`study.pbt_model`)."""
  population = _algorithm_class(config).population_based
  try:
    if population:
      return search_space.fixed_arch_space(pbt_arch_config(search_space, config.study.pbt_model))
    return search_space.from_config(config.space)
  except ValueError as e:
    if isinstance(e, SearchConfigError):
      raise
    field = "study.pbt_model" if population else "space"
    raise SearchConfigError(f"{field}: {e}") from None


def pbt_arch_config(search_space: CTRSearchSpace, model_name: str) -> dict[str, Any]:
  """The architecture PBT trains: the default config's, with `model.name` = `model_name`
  when given ('' keeps the default model)."""
  arch = search_space.arch_part(search_space.default_config(None))
  if model_name:
    arch["model.name"] = model_name
    arch_lib.split_config(search_space.runner_config(arch))  # checks the name
  return arch


def make_task(config) -> CTRTask:
  """The `CTRTask` of `config.task` (data seed = `config.seed`).

  With `task.compact_rows` (trial tables of the touched rows only), the train steps
  of `study.max_budget` are fixed up front (`CTRTask.max_steps`).
  """
  t = config.task
  compact = t.get("compact_rows", False)
  try:
    max_steps = int(round(float(config.study.max_budget) * t.steps_per_budget_unit)) if compact else 0
    return CTRTask(data=t.data, seed=config.seed, batch_size=t.batch_size, eval_rows=t.eval_rows,
                   steps_per_budget_unit=t.steps_per_budget_unit,
                   eval_batch_size=t.eval_batch_size, max_steps=max_steps, compact_rows=compact)
  except ValueError as e:
    raise SearchConfigError(f"task: {e}") from None


def _algorithm_class(config) -> type[AlgorithmSpec]:
  try:
    return names.lookup(ALGORITHMS, config.study.algorithm, "study.algorithm", "algorithm")
  except ConfigError as e:
    raise SearchConfigError(str(e)) from None


def make_algorithm(config) -> AlgorithmSpec:
  """The algorithm named by `config.study.algorithm`, seeded by `config.seed`.

  Its settings are the `study` fields named like the algorithm's own fields
  (`sfjax.automl.algorithms`: e.g. `eta`, `population_size`, `n_startup_trials`);
  the others keep the algorithm's defaults.

  Raises:
    SearchConfigError: naming `study.algorithm` (or the bad setting).
  """
  cls = _algorithm_class(config)
  settings = {f.name: config.study[f.name] for f in dataclasses.fields(cls)
              if f.name != "seed" and f.name in config.study}
  try:
    return cls(**settings, seed=config.seed)
  except (TypeError, ValueError) as e:
    raise SearchConfigError(f"study ({cls.name}): {e}") from None


def check_study_settings(config) -> None:
  """Checks the `study` block (counts, budgets, quotas, objectives, executor, PBT schedule).

  Raises:
    SearchConfigError: naming the first bad `study.*` field.
  """
  st = config.study
  for field, low in (("num_trials", 1), ("leaderboard_size", 0), ("ask_batch", 0),
                     ("max_params", 0), ("dask_workers", 1)):
    value = getattr(st, field) if field in st else STUDY_DEFAULTS[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise SearchConfigError(f"study.{field}: expected an integer >= {low}, got {value!r}")
  for field in ("max_flops", "max_latency_ms"):
    value = study_field(config, field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
      raise SearchConfigError(f"study.{field}: expected a finite number >= 0 (0: no quota), "
                              f"got {value!r}")
  executor = study_field(config, "executor")
  if executor not in EXECUTORS:
    raise SearchConfigError(f"study.executor: unknown executor {executor!r}; known: "
                            f"{list(EXECUTORS)}")
  if not isinstance(study_field(config, "dask_address"), str):
    raise SearchConfigError(f"study.dask_address: expected a string ('' = start a local "
                            f"cluster), got {study_field(config, 'dask_address')!r}")
  if executor != "local" and _algorithm_class(config).population_based:
    raise SearchConfigError(f"study.executor={executor!r}: a population-based algorithm "
                            f"({st.algorithm}) trains its population in the driver; use 'local'")
  make_objective(config)
  if not 0 < st.min_budget <= st.max_budget:
    raise SearchConfigError(f"study.min_budget / study.max_budget: need 0 < min_budget "
                            f"({st.min_budget}) <= max_budget ({st.max_budget})")
  algorithm = make_algorithm(config)
  if isinstance(algorithm, PBT):
    try:
      algorithm.rounds(st.max_budget)
    except ValueError as e:
      raise SearchConfigError(f"study.pbt_interval: {e}") from None


def settings_record(config) -> dict[str, Any]:
  """What a workdir's trials depend on: task, seed, space, algorithm and budgets.

  `study.num_trials`, the cohort width, quotas and the leaderboard may change
  between runs of one study (extending it, or running it on other hardware).
  """
  record = {"task": config.task.to_dict(), "seed": config.seed, "space": config.space.to_dict(),
            "study": {k: config.study[k] for k in ("algorithm", "max_budget", "pbt_model",
                                                   "pbt_interval")}}
  return json.loads(json.dumps(record))


def check_settings(workdir: str, record: Mapping[str, Any]) -> None:
  """Writes `workdir/search.json`, or checks it against `record`.

  Raises:
    SearchConfigError: the workdir holds a study made with different settings;
      the message lists each differing field with both values.
  """
  path = os.path.join(workdir, SETTINGS_FILE)
  if not os.path.exists(path):
    write_json(path, record)
    return
  with open(path, encoding="utf-8") as f:
    stored = json.load(f)
  diffs = _differences(stored, dict(record))
  if diffs:
    raise SearchConfigError(f"{path}: this workdir holds a study with different settings; use "
                            f"another --workdir or the same config. Differences: "
                            + "; ".join(diffs[:20]))


def _differences(stored, given, prefix: str = "") -> list[str]:
  if isinstance(stored, dict) and isinstance(given, dict):
    out = []
    for key in sorted(set(stored) | set(given)):
      out += _differences(stored.get(key), given.get(key), f"{prefix}{key}.")
    return out
  return [] if stored == given else [f"{prefix[:-1]}: stored {stored!r}, given {given!r}"]


def write_json(path: str, data: Any) -> None:
  """Writes `data` as JSON to `path` atomically (`sfjax.core.atomic.atomic_write`)."""
  atomic_write(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=True) + "\n")
