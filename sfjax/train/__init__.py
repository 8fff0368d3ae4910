"""sfjax.train: the CTR trainer and the one train step everything trains through.

  ctr_defaults() / validate(config)      every field of a training config, and its check
  check_paths(config)                    the data paths name files (or the preprocessed DIR)
  ResumeMismatchError                    a checkpoint this config may not resume (`resume_check`)
  train_and_evaluate(config, workdir)    a whole run: train, evaluate, checkpoint, resume
  build_trainer(config) -> Trainer       the pieces of a run, for benchmarks and notebooks
  make_train_step(...)                   `step(state, batch) -> (state, metrics)`, shared by
                                         the trainer, vmapped trials, structure search and
                                         compression (`make_dense_train_step`: vision)
  TrainState / DenseState                the states those steps carry

Modules: `defaults`, `config_check`, `loop`, `runner` (the step window), `backends`
(device table or MixCache), `step`, `state`, `optimizers` (dense optax factories),
`grda`, `evaluation`, `metrics_writer`, `resume_check` (what a checkpoint's run was, checked
on resume) and `process_cache` (per-process cache fills).
"""

from sfjax.train.backends import BACKENDS
from sfjax.train.config_check import check_paths, validate
from sfjax.train.defaults import ctr_defaults
from sfjax.train.input_feed import InputFeed
from sfjax.train.loop import (
  Trainer,
  TrainingRun,
  build_trainer,
  print_final,
  run_training,
  train_and_evaluate,
  training_result,
)
from sfjax.train.optimizers import (
  DENSE_OPTIMIZER_NAMES,
  dense_optimizer,
  dense_optimizer_from_config,
)
from sfjax.train.resume_check import ResumeMismatchError
from sfjax.train.runner import run_steps
from sfjax.train.state import DenseState, TrainState
from sfjax.train.step import (
  DenseLossFn,
  dense_update,
  eval_logits,
  forward_logits,
  jit_train_step,
  loss_and_grads,
  make_dense_train_step,
  make_eval_step,
  make_train_step,
)

__all__ = [
  "BACKENDS",
  "DENSE_OPTIMIZER_NAMES",
  "DenseLossFn",
  "DenseState",
  "InputFeed",
  "ResumeMismatchError",
  "TrainState",
  "Trainer",
  "TrainingRun",
  "build_trainer",
  "check_paths",
  "ctr_defaults",
  "dense_optimizer",
  "dense_optimizer_from_config",
  "dense_update",
  "eval_logits",
  "forward_logits",
  "jit_train_step",
  "loss_and_grads",
  "make_dense_train_step",
  "make_eval_step",
  "make_train_step",
  "print_final",
  "run_steps",
  "run_training",
  "train_and_evaluate",
  "training_result",
  "validate",
]
