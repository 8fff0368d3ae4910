"""Search settings: a search config (`defaults.search_defaults()` and its variants), checked.

Builds the space, task and algorithm a search runs, and guards a workdir against
being resumed with different settings (`workdir/search.json`): the `Study`
journal already refuses a changed space or algorithm; this adds the task, seed
and space options, naming every differing field.

An algorithm's settings live in its own block, `study.<algorithm>.<field>`
(`study.asha.eta`, `study.pbt.population_size`); the settings every algorithm
shares stay at `study.*`. A study setting the config lacks takes the library's
default (`defaults.search_defaults()`); an unknown one is an error naming the
closest known key, and a setting of the old flat layout (`study.eta`) names
its new path. A workdir made before the blocks resumes: its `search.json`
records the same fields.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sfjax.automl.algorithms import ALGORITHMS, PBT, AlgorithmSpec, Objective, Objectives
from sfjax.automl.pipeline.engine import config_differences
from sfjax.automl.space import Space
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts.table_choices import bag_pooling, table_dims
from sfjax.cohorts.task import CTRTask
from sfjax.core import names, without_xla_cpu_dots
from sfjax.core.atomic import atomic_write
from sfjax.core.errors import ConfigError, unknown_key_error
from sfjax.ctr_search import defaults
from sfjax.ctr_search.executor import EXECUTORS
from sfjax.ctr_search.space_provider import CTRSearchSpace

SETTINGS_FILE = "search.json"
# Metrics every CTR trial reports that a search may optimise ('test_auc' is never
# selected on: it is the held-out half that judges the search). `latency_ms` is
# measured only when an objective or a quota needs it.
_OBJECTIVE_METRICS = ("auc", "logloss", "train_loss", "params", "flops", "latency_ms")
_DEFAULT_OBJECTIVES = "auc:max"
_DIRECTION_NAMES = {"max": "maximize", "maximize": "maximize", "min": "minimize",
                    "minimize": "minimize"}


class SearchConfigError(ConfigError):
  """A bad search config, or a workdir created with a different one; names the field."""


@functools.cache
def _default_study() -> dict[str, Any]:
  return defaults.study_defaults().to_dict()


def _shared_study_keys() -> tuple[str, ...]:
  """The `study.*` settings every algorithm shares (the others are algorithm blocks)."""
  return tuple(k for k in _default_study() if k not in ALGORITHMS)


def _moved_setting_error(key: str, algorithm: Any = None,
                         field: str = "study") -> SearchConfigError | None:
  """The error of a flat `study.<key>` that is now an algorithm's setting, else None.

  Args:
    key: a key given under `study`.
    algorithm: the config's `study.algorithm`: its block is named when it has `key`.
    field: how the message names the study block (e.g. `--config.steps.hpo.study`).
  """
  owners = [n for n in ALGORITHMS if key in _default_study()[n]]
  if not owners or key in _default_study():
    return None
  first = algorithm if algorithm in owners else owners[0]
  return SearchConfigError(f"{field}.{key}: algorithm settings live in their algorithm's block "
                           f"now: use {field}.{first}.{key} ({key} is a setting of "
                           f"{', '.join(owners)})")


def check_flag_overrides(argv: Sequence[str], flag: str = "config") -> None:
  """Refuses a command-line override of a flat algorithm setting, before flags are parsed.

  `--config.study.eta=2` (or `--config.steps.hpo.study.eta=2`) would otherwise stop
  ml_collections with a traceback; this names the new path (`_moved_setting_error`).

  Raises:
    SearchConfigError: the first such override, naming its new path.
  """
  pattern = re.compile(rf"^--?(?:no)?{re.escape(flag)}\.([\w.]+)(?:=(.*))?$")
  given = [m.groups() for m in map(pattern.match, argv) if m]
  algorithms = {path.rpartition(".")[0]: value for path, value in given
                if path.rpartition(".")[2] == "algorithm" and value}
  for path, _ in given:
    block, _, key = path.rpartition(".")
    if block == "study" or block.endswith(".study"):
      algorithm = algorithms.get(block, _default_study()["algorithm"])
      error = _moved_setting_error(key, algorithm, f"--{flag}.{block}")
      if error is not None:
        raise error


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
  """`config.study.<name>`, or the library's default when the config lacks it."""
  return config.study.get(name, _default_study()[name])


def _algorithm_settings(config, name: str) -> dict[str, Any]:
  """The settings of algorithm `name`: its block `study.<name>` over the library's defaults.

  Raises:
    SearchConfigError: the block is not a block, or holds a key its algorithm lacks
      (naming `study.<name>.<key>` and the closest setting).
  """
  settings = dict(_default_study()[name])
  block = config.study.get(name, {})
  if not hasattr(block, "items"):
    raise SearchConfigError(f"study.{name}: expected the block of {name}'s settings "
                            f"({', '.join(settings) or 'none'}), got {block!r}")
  for key, value in block.items():
    if key not in settings:
      error = unknown_key_error(f"study.{name}", key, settings, f"{name} setting")
      raise SearchConfigError(str(error).removeprefix("config field "))
    settings[key] = value
  return settings


def _check_study_keys(config) -> None:
  """Every key of `config.study` is a shared setting or an algorithm's block.

  Raises:
    SearchConfigError: a flat algorithm setting (naming its new path) or an unknown
      key (naming the closest known one).
  """
  known = (*_shared_study_keys(), *ALGORITHMS)
  for key in config.study:
    if key in known:
      continue
    moved = _moved_setting_error(key, config.study.get("algorithm"))
    if moved is not None:
      raise moved
    raise SearchConfigError(str(unknown_key_error("study", key, known, "study setting"))
                            .removeprefix("config field "))
  for name in ALGORITHMS:
    _algorithm_settings(config, name)


def _parse_objectives(value: Any) -> Objective:
  """`study.objectives`, e.g. 'auc:max,params:min' ('' = 'auc:max', the single default).

  Returns:
    The `Objective`, or an `Objectives` for several (the first one is primary: it
    picks `best_trial_id` and sorts the leaderboard).

  Raises:
    SearchConfigError: naming `study.objectives` (bad syntax, unknown metric or
      direction, a metric named twice).
  """
  text = _DEFAULT_OBJECTIVES if value is None or not str(value).strip() else str(value)
  if not isinstance(value, str) and value is not None:
    raise SearchConfigError(f"study.objectives: expected a string like 'auc:max,params:min', "
                            f"got {value!r}")
  objectives = []
  for part in text.split(","):
    metric, sep, direction = (x.strip() for x in part.partition(":"))
    if not sep or not metric:
      raise SearchConfigError(f"study.objectives: {part.strip()!r} is not '<metric>:max' or "
                              f"'<metric>:min' (in {text!r})")
    if metric not in _OBJECTIVE_METRICS:
      raise SearchConfigError(f"study.objectives: unknown metric {metric!r}; known: "
                              f"{list(_OBJECTIVE_METRICS)}")
    if direction not in _DIRECTION_NAMES:
      raise SearchConfigError(f"study.objectives: direction {direction!r} of {metric!r} is not "
                              "'max' or 'min'")
    objectives.append(Objective(metric, _DIRECTION_NAMES[direction]))
  try:
    return Objectives.of(objectives)
  except ValueError as e:
    raise SearchConfigError(f"study.objectives: {e}") from None


def make_objective(config) -> Objective:
  """The search's objective(s) (`_parse_objectives`), checked against the algorithm.

  Raises:
    SearchConfigError: several objectives for a single-objective algorithm (naming
      `study.objectives` and the algorithms that take several).
  """
  objective = _parse_objectives(study_field(config, "objectives"))
  cls = _algorithm_class(config)
  if isinstance(objective, Objectives) and not getattr(cls, "multi_objective", False):
    multi = sorted(n for n, c in ALGORITHMS.items() if getattr(c, "multi_objective", False))
    raise SearchConfigError(f"study.objectives: {len(objective.all)} objectives, but "
                            f"study.algorithm={cls.name!r} optimises one; use one of {multi}")
  return objective


def make_space(config, search_space: CTRSearchSpace) -> Space:
  """The search space: `search_space.from_config(config.space)`, or for a population-based
  algorithm (PBT) the hyperparameters of one architecture (`study.pbt_model`).

  Raises:
    SearchConfigError: naming the field the space came from.
    ConfigError: the space holds a key of the old `optim.*` trial vocabulary (naming
      its trainer path).
  """
  population = _algorithm_class(config).population_based
  try:
    if population:
      space = search_space.fixed_arch_space(_pbt_arch_config(search_space, config.study.pbt_model))
    else:
      space = search_space.from_config(config.space)
  except ValueError as e:
    if isinstance(e, SearchConfigError):
      raise
    field = "study.pbt_model" if population else "space"
    raise SearchConfigError(f"{field}: {e}") from None
  arch_lib.check_not_renamed(space.keys, "search space")
  return space


def check_space_data(space: Space, spec) -> None:
  """Raises SearchConfigError naming the first key of `space` that the data set cannot take:
  a bag's pooling (`space.poolings`) of a feature that is not a multi_hot bag of `spec`, or a
  table's dim (`space.table_dims`) of a table `spec` does not have (else every trial fails).
  """
  try:
    bag_pooling.check_pooling_keys(spec, space.keys)
    table_dims.check_dim_keys(spec, space.keys)
  except ConfigError as e:
    raise SearchConfigError(str(e).replace("config field ", "space: ", 1)) from None


def _pbt_arch_config(search_space: CTRSearchSpace, model_name: str) -> dict[str, Any]:
  """The architecture PBT trains: the default config's, with `model.name` = `model_name`
  when given ('' keeps the default model)."""
  arch = search_space.arch_part(search_space.default_config(None))
  if model_name:
    arch["model.name"] = model_name
    arch_lib.split_config(search_space.runner_config(arch))  # checks the name
  return arch


# config.task fields of the 'cache' embedding backend (recorded only when it is on).
_CACHE_TASK_FIELDS = ("embedding_backend", "cache_rows", "cache_lookahead")
# config.task fields passed to the task when set; never recorded (`without_xla_cpu_dots`).
_COMPUTE_TASK_FIELDS = ("xla_cpu_dots",)


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
                   eval_batch_size=t.eval_batch_size, max_steps=max_steps, compact_rows=compact,
                   **{k: t[k] for k in _CACHE_TASK_FIELDS + _COMPUTE_TASK_FIELDS if k in t})
  except ValueError as e:
    raise SearchConfigError(f"task: {e}") from None


def _algorithm_class(config) -> type[AlgorithmSpec]:
  try:
    return names.lookup(ALGORITHMS, config.study.algorithm, "study.algorithm", "algorithm")
  except ConfigError as e:
    raise SearchConfigError(str(e)) from None


def make_algorithm(config) -> AlgorithmSpec:
  """The algorithm named by `config.study.algorithm`, seeded by `config.seed`.

  Its settings are its block `study.<algorithm>` (`_algorithm_settings`); the spec
  fields of `defaults.SHARED_SPEC_FIELDS` come from the config's seed and the shared
  `study.min_budget` / `study.max_budget`.

  Raises:
    SearchConfigError: naming `study.algorithm` (or the bad setting).
  """
  cls = _algorithm_class(config)
  settings = _algorithm_settings(config, cls.name)
  fields = cls.__dataclass_fields__
  shared = {k: config.seed if k == "seed" else config.study[k]
            for k in defaults.SHARED_SPEC_FIELDS if k in fields}
  try:
    return cls(**settings, **shared)
  except (TypeError, ValueError) as e:
    raise SearchConfigError(f"study.{cls.name}: {e}") from None


def check_study_settings(config) -> None:
  """Checks the `study` block (counts, budgets, quotas, objectives, executor, PBT schedule).

  Raises:
    SearchConfigError: naming the first bad `study.*` field.
  """
  st = config.study
  _check_study_keys(config)
  for field, low in (("num_trials", 1), ("leaderboard_size", 0), ("ask_batch", 0),
                     ("max_params", 0), ("dask_workers", 1)):
    value = study_field(config, field)
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
  task = config.get("task") or {}  # a pipeline step's search block may have none
  if task.get("embedding_backend", "device") == "cache" and (
      algorithm.multi_fidelity or isinstance(algorithm, PBT)
      or study_field(config, "pruner").kind != "none"):
    raise SearchConfigError(f"task.embedding_backend=cache: trials cannot resume, so "
                            f"study.algorithm={st.algorithm} (multi-fidelity or PBT) and "
                            f"study.pruner are not supported; use random, tpe, evolution, ...")
  if isinstance(algorithm, PBT):
    try:
      algorithm.rounds(st.max_budget)
    except ValueError as e:
      raise SearchConfigError(f"study.pbt.pbt_interval: {e}") from None


def search_settings_record(config) -> dict[str, Any]:
  """What a workdir's trials depend on: task, seed, space, algorithm and budgets.

  `study.num_trials`, the cohort width, quotas, the leaderboard and `task.xla_cpu_dots`
  may change between runs of one study (extending it, or running it on other hardware); the
  algorithm's settings are checked by the study journal. The record keeps the
  fields of the flat layout (`study.pbt_interval` is `study.pbt.pbt_interval`),
  so a workdir made before the algorithm blocks resumes.
  """
  study = {k: config.study[k] for k in ("algorithm", "max_budget", "pbt_model")}
  study["pbt_interval"] = _algorithm_settings(config, "pbt")["pbt_interval"]
  task = without_xla_cpu_dots(config.task.to_dict())
  if task.get("embedding_backend", "device") == "device":  # workdirs from before the field
    task = {k: v for k, v in task.items() if k not in _CACHE_TASK_FIELDS}
  record = {"task": task, "seed": config.seed, "space": config.space.to_dict(),
            "study": study}
  return json.loads(json.dumps(record))


def check_search_settings(workdir: str, record: Mapping[str, Any]) -> None:
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
  diffs = config_differences(stored, dict(record))
  if diffs:
    raise SearchConfigError(f"{path}: this workdir holds a study with different settings; use "
                            f"another --workdir or the same config. Differences: "
                            + "; ".join(diffs[:20]))


def write_json(path: str, data: Any) -> None:
  """Writes `data` as JSON to `path` atomically (`sfjax.core.atomic.atomic_write`)."""
  atomic_write(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=True) + "\n")
