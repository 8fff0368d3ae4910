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
"""

from absl import app, flags, logging
from ml_collections import config_flags

from sfjax.core import set_up_console
from sfjax.parallel import initialize_distributed, is_main_process
from sfjax.train import print_final, train_and_evaluate


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  set_up_console(logging.INFO)  # our progress lines; orbax and jax INFO chatter off
  initialize_distributed(_CONFIG.value)  # several hosts: join before anything uses JAX
  final, _ = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  if is_main_process():
    print_final(final)


if __name__ == "__main__":
  # Flags are defined only when run as a script, so every module of experiments/
  # imports into one process (a test, a notebook) without a DuplicateFlagError.
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Python config file (ml_collections).",
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Directory for metrics.jsonl and config.json.")
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
