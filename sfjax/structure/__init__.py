"""sfjax.structure: structure search on CTR models.

AutoFIS (gated feature interactions trained with gRDA, then pruned and retrained)
and AutoGroup (learned feature groups), both on the cohorts' trial task; their
models are registered in `sfjax.models` and train through the shared train step
(`gate_training`).
"""

from sfjax.structure.autofis import (
  AutoFISResult,
  AutoFISSettings,
  pair_precision_recall,
  planted_pairs,
  retrain_with_pairs,
  run_autofis,
)
from sfjax.structure.autogroup import (
  AutoGroupResult,
  AutoGroupSettings,
  retrain_with_groups,
  run_autogroup,
)
from sfjax.structure.gate_training import prepare_trial_data

__all__ = ["AutoFISResult", "AutoFISSettings", "AutoGroupResult", "AutoGroupSettings",
           "pair_precision_recall", "planted_pairs", "prepare_trial_data", "retrain_with_groups",
           "retrain_with_pairs", "run_autofis", "run_autogroup"]
