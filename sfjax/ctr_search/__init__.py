"""sfjax.ctr_search: the CTR search application built on `sfjax.automl` and `sfjax.train`.

Architecture specs, precomputed trial data, the trial program (the trainer's
step in a `lax.scan`), vmapped cohorts, PBT populations and the search driver.
Concrete spaces are passed in (`CTRSearchSpace`), never imported.
"""

from sfjax.ctr_search.arch import ArchSpec, count_params, group_by_arch, split_config
from sfjax.ctr_search.cohort import CohortRunner, TrialResult
from sfjax.ctr_search.pbt_population import run_pbt
from sfjax.ctr_search.space_provider import CTRSearchSpace
from sfjax.ctr_search.trial_data import CTRTask
