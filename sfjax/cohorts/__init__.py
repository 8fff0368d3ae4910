"""sfjax.cohorts: vmapped trials of CTR models.

An architecture spec and its split from a trial's dynamic hyperparameters (`arch`),
the precomputed trial task (`task`), the whole trial as one jittable function
(`program`, the trainer's step in a `lax.scan`), shape buckets that let different
architectures share one padded program (`buckets`, `bucket_blocks`,
`bucket_layout`), the chunk plan of a cohort run (`chunk_plan`), one program call
(`cohort_call`), the cohort runner and its trials' results (`trial_result`), cost
metrics (`costs`), trial state files and PBT populations.
"""

from sfjax.cohorts.arch import ArchSpec, count_params, group_by_arch, split_config
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.pbt_population import run_pbt
from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.cohorts.trial_result import TrialResult

__all__ = ["ArchSpec", "CTRTask", "CohortRunner", "TrialData", "TrialResult", "count_params",
           "group_by_arch", "run_pbt", "split_config"]
