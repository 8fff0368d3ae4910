"""sfjax.automl.pipeline: VEGA-style pipelines of steps that hand their outputs on.

Generic: the step kinds are a registry the application passes in
(`sfjax.ctr_pipeline.steps` for CTR); nothing here knows CTR or JAX.
"""

from sfjax.automl.pipeline.engine import (
                                          Finalize,
                                          PipelineLockedError,
                                          check_settings,
                                          read_status,
                                          run_pipeline,
                                          run_step,
                                          settings_record,
)
from sfjax.automl.pipeline.paired_bootstrap import paired_auc_bootstrap
from sfjax.automl.pipeline.pipeline_report import build_report, json_safe, summary_table
from sfjax.automl.pipeline.step_flags import set_step_flags, take_step_flags
from sfjax.automl.pipeline.step_specs import (
                                          MissingInputError,
                                          PipelineConfigError,
                                          StepContext,
                                          StepKind,
                                          StepOutput,
                                          StepResult,
                                          StepSpec,
                                          apply_overrides,
                                          effective_blocks,
                                          effective_config,
                                          parse_steps,
)

__all__ = [
  "Finalize",
  "MissingInputError",
  "PipelineConfigError",
  "PipelineLockedError",
  "StepContext",
  "StepKind",
  "StepOutput",
  "StepResult",
  "StepSpec",
  "apply_overrides",
  "build_report",
  "check_settings",
  "effective_blocks",
  "effective_config",
  "json_safe",
  "paired_auc_bootstrap",
  "parse_steps",
  "read_status",
  "run_pipeline",
  "run_step",
  "set_step_flags",
  "settings_record",
  "summary_table",
  "take_step_flags",
]
