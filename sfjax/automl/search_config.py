"""Search settings: the config of `experiments/configs/search_ctr.py`, parsed and checked.

Builds the space, task and algorithm a search runs, and guards a workdir against
being resumed with different settings (`workdir/search.json`): the `Study`
journal already refuses a changed space or algorithm; this adds the task, seed
and space options, naming every differing field.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from search_spaces import ctr as ctr_space_lib
from sfjax.automl import search_pbt
from sfjax.automl.algorithms import (ASHA, GP, TPE, AlgorithmSpec, GridSearch, Hyperband,
                                     QuasiRandomSearch, RandomSearch, RegularizedEvolution)
from sfjax.automl.cohort import CTRTask
from sfjax.automl.space import Space

ALGORITHMS = ("random", "grid", "qmc", "evolution", "tpe", "gp", "asha", "hyperband", "pbt")
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


def _int_list(field: str, text: Any) -> tuple[int, ...]:
  try:
    values = tuple(int(v) for v in str(text).split(",") if v.strip())
  except ValueError:
    values = ()
  if not values or min(values) < 1:
    raise SearchConfigError(f"{field}: expected comma-separated positive integers, got {text!r}")
  return values


def make_space(config) -> Space:
  """The search space: `ctr_space` of `config.space`, or for PBT the hyperparameters of
  one architecture (`fixed_arch_space` of `study.pbt_model`)."""
  try:
    if config.study.algorithm == "pbt":
      return ctr_space_lib.fixed_arch_space(search_pbt.pbt_arch_config(config.study.pbt_model))
    return ctr_space_lib.ctr_space(config.space.families,
                                   _int_list("space.mlp_widths", config.space.mlp_widths))
  except ValueError as e:
    if isinstance(e, SearchConfigError):
      raise
    field = "study.pbt_model" if config.study.algorithm == "pbt" else "space.families / mlp_widths"
    raise SearchConfigError(f"{field}: {e}") from None


def make_task(config) -> CTRTask:
  """The `CTRTask` of `config.task` (data seed = `config.seed`)."""
  t = config.task
  try:
    return CTRTask(data=t.data, seed=config.seed, batch_size=t.batch_size, eval_rows=t.eval_rows,
                   steps_per_budget_unit=t.steps_per_budget_unit,
                   eval_batch_size=t.eval_batch_size)
  except ValueError as e:
    raise SearchConfigError(f"task: {e}") from None


def make_algorithm(config) -> AlgorithmSpec:
  """The algorithm named by `config.study.algorithm`, seeded by `config.seed`.

  For 'pbt' this is the random search that draws each population's initial
  hyperparameters (`search_pbt` runs the population).

  Raises:
    SearchConfigError: naming `study.algorithm` (or the bad setting).
  """
  st, seed = config.study, config.seed
  name = st.algorithm
  budgets = dict(min_budget=st.min_budget, max_budget=st.max_budget, eta=st.eta, seed=seed)
  builders = {
      "random": lambda: RandomSearch(seed=seed),
      "grid": lambda: GridSearch(num_points_per_float=st.grid_points_per_float, shuffle=True,
                                 seed=seed),
      "qmc": lambda: QuasiRandomSearch(seed=seed),
      "evolution": lambda: RegularizedEvolution(population_size=st.population_size,
                                                sample_size=st.sample_size, seed=seed),
      "tpe": lambda: TPE(seed=seed, n_startup_trials=st.n_startup_trials),
      "gp": lambda: GP(seed=seed, n_startup_trials=st.n_startup_trials),
      "asha": lambda: ASHA(**budgets),
      "hyperband": lambda: Hyperband(**budgets, num_iterations=st.hyperband_iterations),
  }
  if name == "pbt":
    return RandomSearch(seed=seed)
  if name not in builders:
    raise SearchConfigError(f"study.algorithm: unknown algorithm {name!r} (known: "
                            f"{', '.join(ALGORITHMS)})")
  try:
    return builders[name]()
  except ValueError as e:
    raise SearchConfigError(f"study ({name}): {e}") from None


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
  if st.algorithm == "pbt":
    rounds = st.max_budget / st.pbt_interval if st.pbt_interval > 0 else 0.0
    if rounds < 1 or abs(rounds - round(rounds)) > 1e-9:
      raise SearchConfigError(f"study.pbt_interval: {st.pbt_interval} must divide study.max_budget "
                              f"({st.max_budget}) into a whole number of rounds")
    if st.population_size < 2:
      raise SearchConfigError(f"study.population_size: PBT needs >= 2 members, got "
                              f"{st.population_size}")


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
  """Writes `data` as JSON to `path` atomically (temporary file, fsync, rename)."""
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(json.dumps(data, indent=2, sort_keys=True, allow_nan=True) + "\n")
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
