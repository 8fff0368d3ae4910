"""Train a CTR model: `python -m experiments.train_ctr --config=experiments/configs/ctr.py --workdir=DIR`.

Any config field can be overridden, e.g. `--config.model.name=dcnv2
--config.train.steps=500`. Writes DIR/metrics.jsonl (one JSON object per eval) and
ends stdout with one JSON line of final metrics. With `--config.checkpoint.every_steps=K`
it checkpoints to DIR/checkpoints/ every K steps, and rerunning the same command resumes
from the latest checkpoint (exactly: same final metrics and table as an uninterrupted
run). Everything else lives in
`sfjax.train.loop` so it can be used from a notebook.

Several hosts: the same command on each, plus `--config.distributed.coordinator=HOST:PORT
--config.distributed.num_processes=P --config.distributed.process_id=I` (or the
environment variables JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID);
process 0 writes DIR and prints the final JSON line.

A rerun refuses a checkpoint saved with other settings (seed, data, learning rates, ...;
`sfjax.train.resume_check`) unless `--resume=allow_changes` (the same as
`--config.resume=allow_changes`), which records the change in DIR/config_history.jsonl.
A second run on the same DIR fails at once, naming the first. Errors print one line
`error: ...` (exit 2 for a bad flag or config, 1 otherwise); `--verbose` adds the traceback.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import cli
from sfjax.core import set_up_console
from sfjax.parallel import initialize_distributed, is_main_process
from sfjax.train import print_final, train_and_evaluate


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  set_up_console(logging.INFO)  # our progress lines; orbax and jax INFO chatter off
  config = _CONFIG.value
  if _RESUME.value:
    config.resume = _RESUME.value
  initialize_distributed(config)  # several hosts: join before anything uses JAX
  final, _ = train_and_evaluate(config, _WORKDIR.value)
  if is_main_process():
    print_final(final)


if __name__ == "__main__":
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Python config file (ml_collections).",
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl and config.json.")
  _RESUME = flags.DEFINE_enum("resume", None, ["strict", "allow_changes"],
                              "Resume a checkpoint saved with other settings (allow_changes) or "
                              "refuse it (strict, the default); sets config.resume.")
  flags.mark_flags_as_required(["config", "workdir"])
  cli.run_main(main)
