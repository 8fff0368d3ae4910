"""VEGA's pipelines: NAS -> HPO -> AutoFIS -> fully train for CTR, and image pipelines
(DARTS, compression, augmentation search), each step resumable.

  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr.py --workdir=DIR
  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr.py:smoke --workdir=DIR
  python -m experiments.pipeline --config=experiments/configs/pipeline_digits.py:smoke --workdir=DIR
  (also pipeline_compress.py, pipeline_augment.py; `config.application` picks the steps)

Any config field can be overridden (`--config.pipeline.order=nas,fully_train,baseline`,
`--config.steps.nas.search_space=blocks` (NAS over the block generator's space),
`--config.steps.fully_train.trainer.embedding.backend=cache`). Rerunning the same
command on the same DIR skips the finished steps and resumes the interrupted one.
Writes DIR/report.json and DIR/summary.txt, prints the summary table, and ends
stdout with the report as one JSON line. Exit status 1 when a step failed, 2 for a
bad config. Everything else lives in `sfjax.automl.pipeline` (the engine) and
`sfjax.ctr_pipeline` (the CTR steps and `run_ctr_pipeline`).
"""

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import search_spaces
from sfjax.automl import pipeline
from sfjax.core import console
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import run as ctr_run
from sfjax.vision import vision_steps


def application(config):
  """(step kinds, report finalizer) of `config.application`: 'ctr' (default) or 'vision'.

  Raises:
    ConfigError: naming `application` for an unknown value.
  """
  name = config.get("application", "ctr")
  if name == "vision":
    return vision_steps.VISION_STEP_KINDS, vision_steps.vision_report
  if name != "ctr":
    raise ConfigError(f"config field application: unknown value {name!r} (known: ctr, vision)")
  return ctr_run.ctr_pipeline_parts(config, search_spaces.SPACES)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  console.set_up(logging.INFO)  # our progress lines; orbax and jax INFO chatter off
  config = _CONFIG.value
  try:
    kinds, finalize = application(config)
    report = pipeline.run_pipeline(config, _WORKDIR.value, kinds, finalize=finalize)
  except (ConfigError, pipeline.PipelineLockedError) as e:
    sys.stderr.write(f"error: {e}\n")
    sys.exit(2)
  sys.stdout.write(pipeline.summary_table(report))
  sys.stdout.write(json.dumps(report, sort_keys=True, allow_nan=False) + "\n")
  sys.stdout.flush()
  if report["status"] != "done":
    sys.exit(1)


if __name__ == "__main__":
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Python config file (ml_collections).",
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the pipeline (steps/, report.json).")
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
