"""sfjax.cohorts: vmapped trials of CTR models.

An architecture spec and its split from a trial's dynamic hyperparameters (`arch`),
the precomputed trial task (`task`), the whole trial as one jittable function
(`program`, the trainer's step in a `lax.scan`), shape buckets that let different
architectures share one padded program (the `shape_buckets` sub-package), the chunk
plan of a cohort run (`chunk_plan`), one program call (`cohort_call`), the cohort
runner and its trials' results (`trial_result`), cost metrics (`costs`), bags'
poolings, tables' dims and a layout's per-table optimizers, rates and initializers as
traced per-trial choices (the `table_choices` sub-package), trial state files, PBT
populations, and cohorts that share one host table behind a device cache
(`host_cohort`).
"""

from sfjax.cohorts.arch import (
  DYNAMIC_KEYS,
  STATIC_KEYS,
  ArchSpec,
  check_not_renamed,
  count_params,
  group_by_arch,
  split_config,
)
from sfjax.cohorts.chunk_plan import Chunk, plan_chunks
from sfjax.cohorts.cohort_call import cohort_program, trial_mesh
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.host_cohort import run_host_cohort
from sfjax.cohorts.latency import cost_dict
from sfjax.cohorts.pbt_population import run_pbt
from sfjax.cohorts.shape_buckets import bucket_key, fixed_config_keys
from sfjax.cohorts.table_choices import dim_key, dimmed_table, pooled_feature, pooling_key
from sfjax.cohorts.task import CTRTask, TrialData
from sfjax.cohorts.trial_result import CohortTrialResult

__all__ = ["DYNAMIC_KEYS", "STATIC_KEYS", "ArchSpec", "CTRTask", "Chunk", "CohortRunner",
           "CohortTrialResult", "TrialData", "bucket_key", "check_not_renamed", "cohort_program",
           "cost_dict", "count_params", "dim_key", "dimmed_table", "fixed_config_keys", "group_by_arch", "plan_chunks", "pooled_feature",
           "pooling_key", "run_host_cohort", "run_pbt",
           "split_config", "trial_mesh"]
