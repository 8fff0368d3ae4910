"""sfjax.automl: the generic AutoML language: search spaces, algorithms, durable studies, Pareto fronts.

Nothing here knows about CTR models or JAX programs; the CTR search application
(trial programs, vmapped cohorts, the search driver) is `sfjax.ctr_search`.
"""

from sfjax.automl.algorithms import (
                                     ALGORITHMS,
                                     ASHA,
                                     BOHB,
                                     GP,
                                     PBT,
                                     TPE,
                                     AlgorithmSpec,
                                     GridSearch,
                                     Hyperband,
                                     Objective,
                                     QuasiRandomSearch,
                                     RandomSearch,
                                     RegularizedEvolution,
                                     Searcher,
                                     SuccessiveHalving,
                                     Suggestion,
                                     TrialStatus,
                                     algorithm_from_dict,
                                     pbt_exploit_explore,
)
from sfjax.automl.pareto import non_dominated_sort, pareto_front
from sfjax.automl.space import (
                                     Bool,
                                     Categorical,
                                     Condition,
                                     Config,
                                     ConfigError,
                                     Fixed,
                                     Float,
                                     Forbidden,
                                     ForbiddenConfigError,
                                     Int,
                                     Space,
                                     SpaceError,
)
from sfjax.automl.study import JournalError, Quota, Study, StudyError, TrialRecord
