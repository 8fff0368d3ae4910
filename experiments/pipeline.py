"""VEGA's pipelines: NAS -> HPO -> AutoFIS -> fully train for CTR, and image pipelines
(DARTS, compression, augmentation search), each step resumable.

  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr.py --workdir=DIR
  python -m experiments.pipeline --config=experiments/configs/pipeline_ctr.py:smoke --workdir=DIR
  python -m experiments.pipeline --config=experiments/configs/pipeline_digits.py:smoke --workdir=DIR
  (also pipeline_compress.py, pipeline_augment.py; `config.application` picks the steps)

Any config field can be overridden (`--config.pipeline.order=nas,fully_train,baseline`,
`--config.steps.nas.search_space=blocks` (NAS over the block generator's space),
`--config.steps.fully_train.trainer.embedding.backend=cache`). A step's block holds
only overrides of its kind's library defaults, so `--config.steps.<name>.<key>=<value>`
may set any setting of the step, whether its block holds it or not (typed like the
default; a misspelt key exits 2 naming the closest one). Rerunning the same
command on the same DIR skips the finished steps and resumes the interrupted one.
Writes DIR/report.json and DIR/summary.txt, prints the summary table, and ends
stdout with the report as one JSON line. Exit status 1 when a step failed, 2 for a
bad config or a workdir in use (a second run on DIR fails at once naming the first);
any error prints one line `error: ...` (`--verbose` adds the traceback). Everything else lives in `sfjax.automl.pipeline` (the engine) and
`sfjax.ctr_pipeline` (the CTR steps and `run_ctr_pipeline`).
"""

import json
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import search_spaces
from experiments import cli
from sfjax.automl.pipeline import (
  PipelineLockedError,
  parse_steps,
  run_pipeline,
  set_step_flags,
  summary_table,
  take_step_flags,
)
from sfjax.core import ConfigError, hold_workdir, set_up_console
from sfjax.ctr_pipeline import ctr_pipeline_parts
from sfjax.ctr_search import check_flag_overrides
from sfjax.vision import VISION_STEP_KINDS, vision_report


def application(config):
  """(step kinds, report finalizer) of `config.application`: 'ctr' (default) or 'vision'.

  Raises:
    ConfigError: naming `application` for an unknown value.
  """
  name = config.get("application", "ctr")
  if name == "vision":
    return VISION_STEP_KINDS, vision_report
  if name != "ctr":
    raise ConfigError(f"config field application: unknown value {name!r} (known: ctr, vision)")
  return ctr_pipeline_parts(config, search_spaces.SPACES)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  set_up_console(logging.INFO)  # our progress lines; orbax and jax INFO chatter off
  config = _CONFIG.value
  kinds, finalize = application(config)
  with config.unlocked():  # a step flag may set a key its block lacks
    set_step_flags(config, _STEP_FLAGS, kinds)
  parse_steps(config, kinds)  # a bad config is named before the workdir is made or locked
  with hold_workdir(_WORKDIR.value, "pipeline"):  # one owner per workdir (issue #25)
    report = run_pipeline(config, _WORKDIR.value, kinds, finalize=finalize)
  sys.stdout.write(summary_table(report))
  sys.stdout.write(json.dumps(report, sort_keys=True, allow_nan=False) + "\n")
  sys.stdout.flush()
  if report["status"] != "done":
    sys.exit(1)


def split_step_flags(argv):
  """(argv for absl, the `--config.steps.*` flags) (`pipeline.take_step_flags`); exits 2
  (one line) on a flat algorithm setting such as `--config.steps.hpo.study.eta`."""
  try:
    check_flag_overrides(argv)
  except ConfigError as e:
    sys.stderr.write(f"error: {e}\n")
    sys.exit(2)
  return take_step_flags(argv)


if __name__ == "__main__":
  _ARGV, _STEP_FLAGS = split_step_flags(sys.argv)
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Python config file (ml_collections).",
                                            lock_config=True, sys_argv=_ARGV)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the pipeline (steps/, report.json).")
  flags.mark_flags_as_required(["config", "workdir"])
  cli.run_main(main, argv=_ARGV, usage=(PipelineLockedError,))
