"""The CTR pipeline's training steps: `fully_train`, `baseline`, and the report's comparison.

  fully_train  the chosen config (the latest `best_config` of the earlier steps,
               mapped through `trainer_config`; after `autofis`, the model restricted
               to the `kept_pairs`) trained by `sfjax.train.loop.train_and_evaluate`
               with the block's `trainer` recipe: either embedding backend, the
               trainer's checkpoints (`checkpoint.every_steps` > 0, so a rerun
               resumes the interrupted training), the pipeline's data and seed.
  baseline     the recipe's own model (the unsearched default DeepFM of
               `sfjax/train/defaults.py`) trained by the recipe of the step named
               `recipe_step` (default 'fully_train').

Both score every row of the data's 'test' split (which no search or selection
reads) with the final state and save the scores; `compare_final_to_baseline`
turns them into the report's `final_test_auc` (with `final_test_auc_interval`, its
bootstrap interval), `baseline_test_auc` and `test_auc_interval` (paired bootstrap of
the difference on the same rows).

Their blocks hold only overrides of the library's defaults (`_fully_train_defaults`,
`_baseline_defaults`: the `trainer` recipe of `recipe_defaults`); the pipeline
engine merges them (`StepKind.defaults`).

Resume on either host storage (issue #25): a step that is killed and rerun resumes from
its own checkpoints. With the cache backend on mmap host storage each step's table lives
under its own path: its own block's `trainer.embedding.host_path` (a step that borrows
another step's recipe never borrows its table), by default `<step dir>/host_table`. The
default table belongs to the step, so a rerun discards what its killed predecessor left
there; the trainer (built inside `loop.run_training`, after the resume point is known)
then creates it afresh and a resume loads the checkpoint into it.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
import numpy as np

from sfjax.automl.pipeline import (
  StepContext,
  StepKind,
  StepOutput,
  StepResult,
  paired_auc_bootstrap,
)
from sfjax.checkpoint import checkpointer as checkpoint_lib
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts.table_choices import bag_pooling, table_dims
from sfjax.core import metrics as metrics_lib
from sfjax.core import names
from sfjax.core.atomic import atomic_write
from sfjax.core.errors import ConfigError
from sfjax.ctr_search.space_provider import CTRSearchSpace
from sfjax.data import dataset as dataset_lib
from sfjax.data import feature_pooling
from sfjax.embedding import host_table_files
from sfjax.models import generator
from sfjax.serving import bundle as serving_bundle
from sfjax.serving import manifest as serving_manifest
from sfjax.train import config_check, loop
from sfjax.train.defaults import ctr_defaults

_TEST_SPLIT = "test"
SCORES_FILE, LABELS_FILE = "test_scores.npy", "test_labels.npy"
BUNDLE_DIR = "bundle"  # fully_train: the final model, served by sfjax.serving.Predictor
HOST_TABLE_DIR = "host_table"  # a step's default mmap host table, in its directory


def recipe_defaults() -> ml_collections.ConfigDict:
  """The library's training recipe (`steps.<name>.trainer`): the CTR trainer's defaults
  (`sfjax/train/defaults.py`) for a final model; its `data` and `seed` are replaced by the
  pipeline's `task.data` and `seed` when the step runs."""
  recipe = ctr_defaults()
  recipe.train.steps = 3000
  recipe.train.eval_every = 3000  # one eval at the end: the final state is the model
  recipe.train.eval_batch_size = 4096
  recipe.train.log_every = 500
  recipe.checkpoint.every_steps = 1000  # > 0: a rerun resumes from the trainer's checkpoints
  recipe.checkpoint.keep = 2
  return recipe


def _fully_train_defaults() -> ml_collections.ConfigDict:
  """The library's `fully_train` block: the recipe."""
  return ml_collections.ConfigDict({"trainer": recipe_defaults()})


def _baseline_defaults() -> ml_collections.ConfigDict:
  """The library's `baseline` block: the recipe of the step named `recipe_step` (its own
  `trainer` when `recipe_step` names the baseline step itself)."""
  return ml_collections.ConfigDict({"recipe_step": "fully_train", "trainer": recipe_defaults()})


def _set(config, dotted: str, value) -> None:
  *parents, leaf = dotted.split(".")
  node = config
  for p in parents:
    node = node[p]
  node[leaf] = value


def trainer_config(recipe, arch: arch_lib.ArchSpec, hparams: Mapping[str, float],
                   kept_pairs: Sequence[Sequence[int]] | None = None) -> ml_collections.ConfigDict:
  """The CTR trainer config that trains `arch` with `hparams`.

  Trial keys are the trainer's config paths, so `hparams` apply by path; the model's
  keyword arguments (layer widths derived from `depth` x `width`) and the two
  optimizer kinds come from `arch`.

  Args:
    recipe: a CTR trainer ConfigDict (`sfjax/train/defaults.py` fields); copied.
    arch: the static part of a trial config (`arch.split_config`).
    hparams: its dynamic part (`arch.DYNAMIC_KEYS`, trainer paths such as
      `embedding.learning_rate`; absent keys keep the recipe's); a bag's
      `features.<name>.pooling` becomes an entry of `data.pooling`, a table's
      `tables.<name>.dim` its `dim` in `data.tables`.
    kept_pairs: field pairs (i, j) to restrict the model's pairwise interactions to
      (AutoFIS): the model becomes `composed` with `_restricted_spec`.

  Returns:
    The recipe with `model.*`, the embedding / dense optimizer kinds and the
    dynamic hyperparameters set from the trial config.

  Raises:
    ValueError: a key that is not a dynamic hyperparameter (`arch.DYNAMIC_KEYS`).
  """
  config = copy.deepcopy(recipe)
  config.model.name, config.model.embed_dim = arch.model_name, arch.embed_dim
  for kwarg, value in arch.model_hparams:
    config.model[kwarg] = value
  config.embedding.optimizer = arch.embedding_optimizer
  config.optimizer.name = arch.dense_optimizer
  for key, value in hparams.items():
    if bag_pooling.pooled_feature(key) is None and table_dims.dimmed_table(key) is None:
      _set(config, key, arch_lib.dynamic_value(key, value))
  chosen = bag_pooling.trainer_pooling(hparams)  # a bag's pooling -> data.pooling (issue #22)
  if chosen:
    merged = {**feature_pooling.parse_poolings(config.data.get("pooling", "")),
              **feature_pooling.parse_poolings(chosen)}
    config.data.pooling = ",".join(f"{k}:{v}" for k, v in merged.items())
  # a table's dim -> data.tables, beside the recipe's own table settings (issue #22)
  tables = table_dims.trainer_tables(hparams, config.data.get("tables", ""))
  if tables:
    config.data.tables = tables
  if kept_pairs is not None:
    spec = _restricted_spec(arch, kept_pairs)
    config.model.name = generator.COMPOSED_NAME
    config.model.embed_dim = generator.spec_embedding_width(spec)  # composed: E = embed_dim
    config.model.blocks = generator.spec_to_json(spec)
  return config


def _restricted_spec(arch: arch_lib.ArchSpec, pairs: Sequence[Sequence[int]]) -> dict:
  """The block spec of `arch`'s model with its pairwise blocks restricted to `pairs`.

  A named model becomes its generator spec (`generator.named_model_spec`); a
  `composed` model keeps its own spec. Blocks that are not pairwise are unchanged.
  """
  hparams = dict(arch.model_hparams)
  if arch.model_name == generator.COMPOSED_NAME:
    spec = generator.spec_from_json(hparams["blocks"])
  else:
    spec = generator.named_model_spec(arch.model_name, arch.embed_dim, **hparams)
  return generator.with_interaction_pairs(spec, [tuple(int(x) for x in p) for p in pairs])


def _recipe(ctx: StepContext, step_name: str) -> ml_collections.ConfigDict:
  """The `trainer` block of step `step_name`, with the pipeline's data and seed."""
  field = f"steps.{step_name}.trainer"
  steps = ctx.config.steps
  if step_name not in steps or "trainer" not in steps[step_name]:
    raise ConfigError(f"config field {field}: missing (the training recipe)")
  recipe = ml_collections.ConfigDict(steps[step_name].trainer.to_dict())
  recipe.data = ml_collections.ConfigDict(ctx.config.task.data.to_dict())
  recipe.seed = ctx.config.seed
  return recipe


def _check_recipe(block, field: str) -> None:
  """A `trainer` block: a valid CTR config that checkpoints (so the step can resume).

  Raises:
    ConfigError: naming `<field>.trainer.<dotted field>`.
  """
  if "trainer" not in block:
    raise ConfigError(f"config field {field}.trainer: missing (the training recipe)")
  try:
    config_check.validate(block.trainer, default_host_path=True)  # `_place_host_table`
  except ConfigError as e:
    raise ConfigError(str(e).replace("config field ", f"config field {field}.trainer.", 1)) from None
  if block.trainer.checkpoint.every_steps <= 0:
    raise ConfigError(f"config field {field}.trainer.checkpoint.every_steps: must be > 0 "
                      "(the step resumes from the trainer's checkpoints)")


def _test_split_scores(backend, state, dataset, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """[N] float32 logits and [N] labels of every real row of the 'test' split, in order.

  `backend` must be synced (`train_and_evaluate` syncs before it returns).
  """
  scores, labels = [], []
  for batch in dataset.eval_batches(_TEST_SPLIT, batch_size):
    logits = np.asarray(backend.eval_logits(state, backend.prepare_eval(batch)))
    keep = np.asarray(batch.mask) > 0
    scores.append(logits[keep].astype(np.float32))
    labels.append(np.asarray(batch.labels)[keep].astype(np.float32))
  return np.concatenate(scores), np.concatenate(labels)


def _save_npy(path: str, array: np.ndarray) -> None:
  atomic_write(path, lambda f: np.save(f, array))


def step_host_path(ctx: StepContext) -> str:
  """The mmap host table's directory of the step `ctx` runs: its own block's
  `trainer.embedding.host_path`, else `<step dir>/host_table` (never another step's)."""
  own = ctx.block.get("trainer") or {}
  path = (own.get("embedding") or {}).get("host_path", "")
  return path or os.path.join(ctx.workdir, HOST_TABLE_DIR)


def _place_host_table(ctx: StepContext, config) -> None:
  """Sets the step's own `embedding.host_path` (`step_host_path`) in `config`, and discards
  the table a killed run of this step left at the default path (the step's own files; a
  resume loads its checkpoint into a fresh table, a fresh run starts from one).

  Raises:
    ValueError: the default path holds something that is not a host table (kept).
  """
  e = config.embedding
  if e.backend != "cache" or e.host_storage != "mmap":
    return
  e.host_path = step_host_path(ctx)
  if e.host_path == os.path.join(ctx.workdir, HOST_TABLE_DIR):
    host_table_files.discard_mmap_table(e.host_path)


def _train_and_score(ctx: StepContext, config) -> StepOutput:
  """Trains `config` in the step directory (resuming from its checkpoints) and scores 'test'."""
  _place_host_table(ctx, config)
  dataset = dataset_lib.make_dataset(config.data, config.seed)
  if _TEST_SPLIT not in dataset.eval_splits:
    raise ConfigError("config field task.data: the final model is scored on a 'test' split, which "
                      f"this data set lacks (eval splits: {dataset.eval_splits}); set "
                      "data.synthetic.test_rows > 0 or data.test_path")
  # The loop builds the trainer: after it knows the resume point (`loop.run_training`).
  final, state, trainer = loop.run_training(config, ctx.workdir, dataset=dataset)
  scores, labels = _test_split_scores(trainer.backend, state, dataset, config.train.eval_batch_size)
  _save_npy(os.path.join(ctx.workdir, SCORES_FILE), scores)
  _save_npy(os.path.join(ctx.workdir, LABELS_FILE), labels)
  test_auc = metrics_lib.auc(labels, scores)
  best_metrics = {"test_auc": test_auc,
                  "test_logloss": metrics_lib.logloss(labels, metrics_lib.sigmoid(scores)),
                  "eval_auc": final.get("eval_auc"), "steps": config.train.steps,
                  "backend": config.embedding.backend, "model": config.model.name}
  if "oracle_auc" in final:
    best_metrics["oracle_auc"] = final["oracle_auc"]
  ckpt = checkpoint_lib.latest(os.path.join(ctx.workdir, checkpoint_lib.CHECKPOINT_DIR))
  output = {"test_scores": ctx.relative(os.path.join(ctx.workdir, SCORES_FILE)),
            "test_labels": ctx.relative(os.path.join(ctx.workdir, LABELS_FILE)),
            "checkpoint": ctx.relative(ckpt) if ckpt else None,
            "trainer_config": config.to_dict(), "final_metrics": loop.training_result(final)}
  return StepOutput(best_metrics, output)


def _write_serving_bundle(ctx: StepContext) -> str:
  """The final model's serving bundle, `<step dir>/bundle` (`sfjax.serving.write_bundle`).

  A bundle left half-written by a killed run is written again (the manifest comes last, so
  a directory without one is incomplete).
  """
  out = os.path.join(ctx.workdir, BUNDLE_DIR)
  if os.path.isdir(out) and not os.path.exists(os.path.join(out, serving_manifest.MANIFEST_FILE)):
    shutil.rmtree(out)
  if not os.path.isdir(out):
    serving_bundle.write_bundle(ctx.workdir, out)
  return ctx.relative(out)


class _TrainSteps:
  """fully_train / baseline; configs are mapped with the spaces the application passes in."""

  def __init__(self, spaces: Mapping[str, CTRSearchSpace]):
    self.spaces = dict(spaces)

  def run_fully_train(self, ctx: StepContext) -> StepOutput:
    space = names.lookup(self.spaces, ctx.latest("search_space"),
                         "search_space (output of an earlier step)", "search space")
    chosen = ctx.latest("best_config")
    arch, hparams = arch_lib.split_config(space.runner_config(chosen))
    config = trainer_config(_recipe(ctx, ctx.spec.name), arch, hparams,
                            ctx.latest("kept_pairs", None))
    result = _train_and_score(ctx, config)
    return StepOutput(result.best_metrics, {**result.output, "chosen_config": dict(chosen),
                                            "role": "final",
                                            "serving_bundle": _write_serving_bundle(ctx)})

  def run_baseline(self, ctx: StepContext) -> StepOutput:
    result = _train_and_score(ctx, _recipe(ctx, ctx.block.get("recipe_step", "fully_train")))
    return StepOutput(result.best_metrics, {**result.output, "role": "baseline"})


def _check_baseline(block, field: str) -> None:
  name = block.get("recipe_step", "fully_train")
  if not isinstance(name, str) or not name:
    raise ConfigError(f"config field {field}.recipe_step: expected a step name, got {name!r}")
  if f"steps.{name}" == field:  # its own recipe
    _check_recipe(block, field)


def train_step_kinds(spaces: Mapping[str, CTRSearchSpace]) -> dict[str, StepKind]:
  """{'fully_train', 'baseline'} step kinds."""
  steps = _TrainSteps(spaces)
  return {"fully_train": StepKind(steps.run_fully_train, _check_recipe,
                                  "the chosen config through the CTR trainer (checkpointed)",
                                  _fully_train_defaults),
          "baseline": StepKind(steps.run_baseline, _check_baseline,
                               "the unsearched default model through the same recipe",
                               _baseline_defaults)}


def auc_interval(labels: np.ndarray, scores: np.ndarray, num_resamples: int = 1000,
                 seed: int = 0) -> dict[str, Any]:
  """Bootstrap interval of one model's AUC on held-out rows (the final model's, issue #26).

  The paired bootstrap (`paired_auc_bootstrap`) against a constant scorer: a constant's
  AUC is exactly 1/2 on every resample with both classes (all ties count one half), so
  the interval of AUC(scores) - 1/2, shifted by 1/2, is the interval of AUC(scores) on
  the same row draws.

  Args:
    labels: [N] 0/1 labels; scores: [N] the model's scores of those rows.
    num_resamples, seed: of the bootstrap.

  Returns:
    {'auc', 'low', 'high', 'stderr', 'confidence', 'num_resamples', 'num_examples'}.
  """
  boot = paired_auc_bootstrap(labels, scores, np.zeros(np.shape(scores), np.float32),
                              num_resamples=num_resamples, seed=seed)
  return {"auc": boot["auc_a"], "low": boot["low"] + 0.5, "high": boot["high"] + 0.5,
          **{k: boot[k] for k in ("stderr", "confidence", "num_resamples", "num_examples")}}


def compare_final_to_baseline(results: Sequence[StepResult], workdir: str, num_resamples: int = 1000,
                              seed: int = 0) -> dict[str, Any]:
  """The report's comparison of the final model with the baseline on the test split.

  Args:
    results: the pipeline's step results; the last done `fully_train` and
      `baseline` steps are compared (fields are None when one is missing).
    workdir: the pipeline workdir (outputs' paths are relative to it).
    num_resamples, seed: of the paired bootstrap.

  Returns:
    {'final_test_auc', 'final_test_auc_interval' (`auc_interval` of the final model,
    or None), 'baseline_test_auc', 'test_auc_interval': {'diff', 'low', 'high',
    'stderr', 'confidence', 'num_resamples', 'num_examples'} (of final - baseline) or
    None, 'beats_baseline': low > 0 (the win is beyond the interval) or None}. The
    final model's is the only test AUC a pipeline reports besides its baseline's: every
    selection reads the valid split (issue #26).

  Raises:
    ValueError: the two steps scored different test rows.
  """
  def last(kind):
    done = [r for r in results if r.kind == kind and r.status == "done"]
    return done[-1] if done else None

  def load(result, key):
    return np.load(os.path.join(workdir, result.output[key]))

  final, base = last("fully_train"), last("baseline")
  out: dict[str, Any] = {"final_test_auc": final.best_metrics["test_auc"] if final else None,
                         "baseline_test_auc": base.best_metrics["test_auc"] if base else None,
                         "final_test_auc_interval": None,
                         "test_auc_interval": None, "beats_baseline": None}
  if final is None:
    return out
  labels = load(final, "test_labels")
  out["final_test_auc_interval"] = auc_interval(labels, load(final, "test_scores"),
                                                num_resamples=num_resamples, seed=seed)
  if base is None:
    return out
  if not np.array_equal(labels, load(base, "test_labels")):
    raise ValueError("fully_train and baseline scored different test rows (other data?)")
  boot = paired_auc_bootstrap(labels, load(final, "test_scores"), load(base, "test_scores"),
                              num_resamples=num_resamples, seed=seed)
  out["test_auc_interval"] = {k: boot[k] for k in ("diff", "low", "high", "stderr", "confidence",
                                                   "num_resamples", "num_examples")}
  out["beats_baseline"] = bool(boot["low"] > 0)
  return out
