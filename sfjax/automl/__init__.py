"""sfjax.automl: search-space language, search algorithms, durable studies, Pareto fronts."""

from sfjax.automl.algorithms import (ASHA, GP, TPE, AlgorithmSpec, GridSearch, Hyperband, Objective,
                                     QuasiRandomSearch, RandomSearch, RegularizedEvolution, Searcher,
                                     SuccessiveHalving, Suggestion, TrialStatus,
                                     algorithm_from_dict, pbt_exploit_explore)
from sfjax.automl.pareto import non_dominated_sort, pareto_front
from sfjax.automl.space import (Bool, Categorical, Condition, Config, ConfigError, Fixed, Float,
                                Forbidden, ForbiddenConfigError, Int, Space, SpaceError)
from sfjax.automl.study import JournalError, Quota, Study, StudyError, TrialRecord
from sfjax.automl.arch import ArchSpec, count_params, group_by_arch, split_config
from sfjax.automl.cohort import CohortRunner, CTRTask, TrialResult
from sfjax.automl.pbt_population import run_pbt
