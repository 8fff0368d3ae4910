"""`run_ctr_pipeline`: VEGA's CTR pipeline (NAS -> HPO -> AutoFIS -> fully train ->
baseline -> compress) wired once, for the CLI and notebooks alike.

The generic engine is `sfjax.automl.pipeline`; the CTR steps are `steps.ctr_step_kinds`.
This module adds the CTR report's finalizer (final model vs baseline with a paired
bootstrap interval, plus the compression pick), so no caller rebuilds it by hand.
Concrete search spaces are passed in (`search_spaces.SPACES`), never imported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sfjax.automl import pipeline
from sfjax.automl.pipeline import StepResult
from sfjax.core import workdir_lock
from sfjax.ctr_pipeline import compress_step, steps, train_steps
from sfjax.ctr_search.space_provider import CTRSearchSpace


def ctr_finalizer(config) -> pipeline.Finalize:
  """The CTR report's top-level fields from the steps' results: the final model against
  the baseline (`config.report.bootstrap_resamples`, `bootstrap_seed`) and the last
  compress step's pick."""

  def finalize(results: Sequence[StepResult], workdir: str) -> dict[str, Any]:
    return {**train_steps.compare_final_to_baseline(
        results, workdir, num_resamples=config.report.bootstrap_resamples,
        seed=config.report.bootstrap_seed),
            **compress_step.compression_report(results)}

  return finalize


def ctr_pipeline_parts(config, spaces: Mapping[str, CTRSearchSpace]):
  """(step kinds, finalizer) of the CTR pipeline over `spaces` (name -> space, the
  values a step's `search_space` field may name)."""
  return steps.ctr_step_kinds(spaces), ctr_finalizer(config)


def run_ctr_pipeline(config, workdir: str, spaces: Mapping[str, CTRSearchSpace]) -> dict:
  """Runs (or resumes) the CTR pipeline of `config` in `workdir`; returns its report.

  Args:
    config: a pipeline config (`experiments/configs/pipeline_ctr.py`).
    workdir: the pipeline's directory (steps/, report.json); a rerun on the same
      directory skips finished steps and resumes the interrupted one.
    spaces: search spaces by name (`search_spaces.SPACES`).

  The call holds `workdir`'s lock (`sfjax.core.workdir_lock`, issue #25) throughout; the
  pipeline CLI, which runs the engine itself, takes it there instead.

  Raises:
    ConfigError: a bad config field, named.
    WorkdirLockedError: another run (or handle) holds `workdir`; the message names it.
    pipeline.PipelineLockedError: another process runs a pipeline in `workdir`.
  """
  kinds, finalize = ctr_pipeline_parts(config, spaces)
  with workdir_lock.hold_workdir(workdir, "run_ctr_pipeline"):
    return pipeline.run_pipeline(config, workdir, kinds, finalize=finalize)
