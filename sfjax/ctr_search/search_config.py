"""Search settings: the config of `experiments/configs/search_ctr.py`, parsed and checked.

Builds the space, task and algorithm a search runs, and guards a workdir against
being resumed with different settings (`workdir/search.json`): the `Study`
journal already refuses a changed space or algorithm; this adds the task, seed
and space options, naming every differing field.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from sfjax.automl.algorithms import ALGORITHMS, PBT, AlgorithmSpec
from sfjax.automl.space import Space
from sfjax.core import names
from sfjax.core.atomic import atomic_write
from sfjax.core.errors import ConfigError
from sfjax.ctr_search import arch as arch_lib
from sfjax.ctr_search.space_provider import CTRSearchSpace
from sfjax.ctr_search.trial_data import CTRTask

SETTINGS_FILE = "search.json"


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
  """The `CTRTask` of `config.task` (data seed = `config.seed`)."""
  t = config.task
  try:
    return CTRTask(data=t.data, seed=config.seed, batch_size=t.batch_size, eval_rows=t.eval_rows,
                   steps_per_budget_unit=t.steps_per_budget_unit,
                   eval_batch_size=t.eval_batch_size)
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
  """Checks the `study` block's numbers (counts, budgets, the PBT schedule).

  Raises:
    SearchConfigError: naming the first bad `study.*` field.
  """
  st = config.study
  for field, low in (("num_trials", 1), ("leaderboard_size", 0), ("ask_batch", 0),
                     ("max_params", 0)):
    value = getattr(st, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise SearchConfigError(f"study.{field}: expected an integer >= {low}, got {value!r}")
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
