"""Search algorithms behind one batched ask/tell interface (`base.Searcher`)."""

from sfjax.automl.algorithms.base import (
  ENDED_STATUSES,
  AlgorithmSpec,
  Objective,
  Searcher,
  Suggestion,
  TrialResult,
  TrialStatus,
)
from sfjax.automl.algorithms.bohb import BOHB
from sfjax.automl.algorithms.evolution import RegularizedEvolution, mutate, project
from sfjax.automl.algorithms.hyperband import (
  ASHA,
  Hyperband,
  SuccessiveHalving,
  hyperband_brackets,
  rung_budgets,
)
from sfjax.automl.algorithms.multi_objective import (
  MOTPE,
  NSGA2,
  Objectives,
  all_objectives,
  directions_of,
)
from sfjax.automl.algorithms.optuna_search import GP, TPE
from sfjax.automl.algorithms.pbt import PBT, pbt_exploit_explore
from sfjax.automl.algorithms.random_search import GridSearch, QuasiRandomSearch, RandomSearch
from sfjax.automl.algorithms.spec_settings import default_block, default_blocks, setting_types

# name -> spec class: the registry every algorithm name list (and `study.algorithm`) derives from.
ALGORITHMS = {spec.name: spec for spec in (
    RandomSearch, GridSearch, QuasiRandomSearch, RegularizedEvolution, TPE, GP,
    SuccessiveHalving, Hyperband, ASHA, BOHB, PBT, NSGA2, MOTPE)}


def algorithm_from_dict(data) -> AlgorithmSpec:
  """Inverse of `AlgorithmSpec.to_dict`: `{'name': 'tpe', 'seed': 0, ...}` -> `TPE(seed=0)`."""
  fields = dict(data)
  name = fields.pop("name", None)
  if name not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {name!r}; known: {sorted(ALGORITHMS)}")
  try:
    return ALGORITHMS[name](**fields)
  except TypeError as e:
    raise ValueError(f"algorithm {name!r}: {e}") from None


__all__ = [
    "ALGORITHMS", "ASHA", "BOHB", "AlgorithmSpec", "ENDED_STATUSES", "GP", "GridSearch",
    "Hyperband", "MOTPE", "NSGA2", "Objective", "Objectives", "PBT",
    "QuasiRandomSearch", "RandomSearch", "RegularizedEvolution", "Searcher",
    "SuccessiveHalving", "Suggestion", "TPE", "TrialResult", "TrialStatus",
    "algorithm_from_dict", "all_objectives", "default_block", "default_blocks", "directions_of",
    "hyperband_brackets", "mutate",
    "pbt_exploit_explore", "project",
    "rung_budgets", "setting_types",
]
