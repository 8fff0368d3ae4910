"""The CTR pipeline's `compress` step: Prune-EA / Quant-EA on a handed-on trained model.

  compress   reads the newest earlier step's `checkpoint` and `trainer_config`
             (`fully_train` / `baseline` hand both on), loads the trained dense
             params and the whole table (`sfjax.checkpoint.open_checkpoint`, either
             embedding backend), orders the latent columns by importance
             (`ctr_prune.order_columns`: same function), runs `ctr_compress.search`
             over MLP neuron masks, the kept dim k and the table bits (`bit_choices`)
             (fine-tune batches from the task's train split, selection on the first
             `valid_rows` of 'eval', 'test' only reported), picks the smallest front
             point within `max_auc_drop` of the trained model's valid AUC, and
             physically prunes it (`ctr_prune.prune`, saved as `pruned_model.npz`:
             params/<path> arrays and the table as float `values` or int8 `codes` +
             per-row `scales`; its `model.*` block is in the output), and writes
             its serving bundle, `<step dir>/bundle` (`write_serving_bundle`: the
             int8 codes and scales served as stored; output `serving_bundle`).
             Its programs compile with the trained model's `train.xla_cpu_dots`
             (`sfjax.core.xla_cpu_dots`: Eigen dots on AMD CPUs by default).

Report metrics: `baseline_test_auc` (the trained model, no fine-tune),
`final_test_auc` (the pick, re-tuned alone and scored by its physically pruned
model; `search_test_auc` is the same pick's masked score in the search), `size_ratio`
(pick / trained parameters), `bits_ratio` (stored bits: the search's size
objective), `final_embed_dim`, `final_mlp_dims`, `final_table_bits`; the output's
`pareto_front` lists every front point (params, bits, ratios, valid / test AUC, dims).
The step keeps no resume state: a rerun repeats the (deterministic) search.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from sfjax.automl import pareto_evolution
from sfjax.automl.pipeline import StepContext, StepKind, StepOutput
from sfjax.checkpoint import open_checkpoint, with_empty_leaves
from sfjax.compress import prune as ctr_prune
from sfjax.compress import prune_search as ctr_compress
from sfjax.compress import quant as ctr_quant
from sfjax.core import metrics as metrics_lib
from sfjax.core import xla_cpu_dots
from sfjax.core.atomic import atomic_write
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.models import registry
from sfjax.serving import bundle as serving_bundle

_PRUNED_FILE = "pruned_model.npz"
BUNDLE_DIR = "bundle"  # the pruned model's serving bundle, under the step's directory
# Required fields (ints >= 1) and the optional ones with their defaults.
_POSITIVE_INTS = ("population", "finetune_steps", "batch_size")
_DEFAULTS = {"generations": 2, "finetune_lr": 1e-3, "mutation_rate": 0.1, "dim_choices": (),
             "bit_choices": (ctr_quant.FLOAT_BITS,), "max_auc_drop": 0.005, "valid_rows": 0,
             "tune_table": True}


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_block(block, field: str) -> None:
  """A `compress` block's fields.

  Raises:
    ConfigError: naming `<field>.<key>`.
  """
  unknown = sorted(set(block) - set(_POSITIVE_INTS) - set(_DEFAULTS) - {"type"})
  if unknown:
    raise ConfigError(f"config field {field}.{unknown[0]}: unknown (known: "
                      f"{', '.join(_POSITIVE_INTS + tuple(_DEFAULTS))})")
  for key in _POSITIVE_INTS:
    if key not in block:
      raise ConfigError(f"config field {field}.{key}: missing")
    if not _is_int(block[key]) or block[key] < 1:
      raise ConfigError(f"config field {field}.{key}: expected an int >= 1, got {block[key]!r}")
  s = _settings(block)
  if s["population"] < 2:
    raise ConfigError(f"config field {field}.population: expected >= 2 (the unpruned model and "
                      f"at least one candidate), got {s['population']}")
  if not _is_int(s["generations"]) or s["generations"] < 0:
    raise ConfigError(f"config field {field}.generations: expected an int >= 0, "
                      f"got {s['generations']!r}")
  if not _is_int(s["valid_rows"]) or s["valid_rows"] < 0:
    raise ConfigError(f"config field {field}.valid_rows: expected an int >= 0 (0: every row), "
                      f"got {s['valid_rows']!r}")
  for key, low, high in (("finetune_lr", 0.0, None), ("mutation_rate", 0.0, 1.0),
                         ("max_auc_drop", 0.0, 1.0)):
    v = s[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < low or (high and v > high):
      raise ConfigError(f"config field {field}.{key}: expected a number in [{low}, "
                        f"{high if high else 'inf'}), got {v!r}")
  dims = s["dim_choices"]
  if not isinstance(dims, (tuple, list)) or not all(_is_int(k) and k >= 1 for k in dims):
    raise ConfigError(f"config field {field}.dim_choices: expected a tuple of ints >= 1 (empty: "
                      f"1..model.embed_dim), got {dims!r}")
  bits = s["bit_choices"]
  try:
    if not isinstance(bits, (tuple, list)) or not all(_is_int(b) for b in bits):
      raise ValueError(f"bit_choices: expected a tuple of ints, got {bits!r}")
    ctr_quant.check_bit_choices(bits)
  except ValueError as e:
    raise ConfigError(f"config field {field}.{e}") from None
  if not isinstance(s["tune_table"], bool):
    raise ConfigError(f"config field {field}.tune_table: expected a bool, got {s['tune_table']!r}")


def _settings(block) -> dict[str, Any]:
  """The block's fields with the defaults of the optional ones."""
  return {**_DEFAULTS, **{k: block[k] for k in block if k != "type"}}


def _load_trained(ctx: StepContext):
  """The trained model an earlier step handed on.

  Returns:
    (trainer config, data set, graphdef, params (pure dict), values [V, E],
    checkpoint path).

  Raises:
    ConfigError / ValueError: no checkpoint, or params that do not fit the config's model.
  """
  path = ctx.latest("checkpoint")
  if not path:
    raise ConfigError("checkpoint (output of an earlier step): none; the training step must "
                      "checkpoint (trainer.checkpoint.every_steps > 0)")
  path = ctx.resolve(path)
  checkpoint = open_checkpoint(path)  # every file's size and CRC-32 checked
  config = ml_collections.ConfigDict(ctx.latest("trainer_config"))
  dataset = dataset_lib.make_dataset(config.data, config.seed)
  model = nnx.eval_shape(lambda: registry.build_model_from_config(
      config.model, num_fields=dataset.spec.num_fields, num_dense=dataset.spec.num_dense,
      rngs=nnx.Rngs(0)))  # shapes only: the values come from the checkpoint
  graphdef, state = nnx.split(model)
  model_params = nnx.to_pure_dict(state)
  params = with_empty_leaves(checkpoint.params, model_params)  # no dense features: None kernels
  want = jax.tree.map(np.shape, model_params)
  if jax.tree.map(np.shape, params) != want:
    raise ValueError(f"{path}: its params do not fit model {config.model.name!r} of the handed-on "
                     "trainer_config")
  values = np.concatenate([v for _, v, _ in checkpoint.table.chunks()])  # [V, E]
  return config, dataset, graphdef, params, values, path


def _flat(tree, prefix=""):
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}{k}/"))
    return out
  return {prefix.rstrip("/"): np.asarray(tree)}


def _point(c: pareto_evolution.Candidate, spec, full_size: int,
           full_bits: int) -> dict[str, Any]:
  cfg = ctr_prune.pruned_model_cfg(spec, c.genome)
  return {"size": c.size, "size_ratio": c.size / full_size, "bits": c.cost,
          "bits_ratio": c.cost / full_bits, "valid_auc": c.valid, "test_auc": c.test,
          "embed_dim": cfg["embed_dim"], "mlp_dims": list(cfg["mlp_dims"]),
          "table_bits": int(c.genome[-1])}


def _save_pruned(path: str, pruned: ctr_prune.PrunedModel) -> None:
  """params/<path> arrays + the table: `values` (float) or `codes` (int8) + `scales`."""
  arrays = {f"params/{k}": v for k, v in _flat(pruned.params).items()}
  if pruned.codes is None:
    arrays["values"] = np.asarray(pruned.values, np.float32)
  else:
    arrays["codes"], arrays["scales"] = pruned.codes, pruned.scales
  atomic_write(path, lambda f: np.savez(f, **arrays))


def write_serving_bundle(workdir: str, pruned_file: str, model_cfg: dict[str, Any],
                         trainer_config: dict[str, Any], checkpoint: str) -> str:
  """The pruned model's serving bundle, `<workdir>/bundle` (`write_pruned_bundle`: its int8
  codes and per-row scales as stored, or its float table); returns that path.

  Args:
    workdir: the step's directory.
    pruned_file: the step's `pruned_model.npz` (`_save_pruned`).
    model_cfg: the pruned model's `model.*` block (`PrunedModel.model_cfg`).
    trainer_config: the trained model's config (the handed-on `trainer_config`).
    checkpoint: the compressed checkpoint (its `fields`).

  A bundle already there (a rerun, or a killed run's half-written one) is replaced: a rerun
  repeats the search, so the bundle is always the `pruned_file` just written.
  """
  out = os.path.join(workdir, BUNDLE_DIR)
  shutil.rmtree(out, ignore_errors=True)
  shutil.rmtree(out + ".tmp", ignore_errors=True)
  serving_bundle.write_pruned_bundle(pruned_file, model_cfg, trainer_config, checkpoint, out)
  return out


def _run_compress(ctx: StepContext) -> StepOutput:
  """Searches, picks and physically prunes (see the module docstring)."""
  s = _settings(ctx.block)
  config, dataset, graphdef, params, values, path = _load_trained(ctx)
  try:
    spec = ctr_prune.make_spec(config.model, dataset.spec.num_fields, dataset.spec.num_dense,
                               tuple(s["dim_choices"]) or None, tuple(s["bit_choices"]))
  except ValueError as e:
    raise ConfigError(f"config field {ctx.spec.field}.{e}" if str(e).startswith(
        ("dim_choices", "bit_choices")) else
                      f"trainer_config (output of an earlier step): {e}") from None
  params, values = ctr_prune.order_columns(spec, params, values)
  options = xla_cpu_dots.compiler_options(xla_cpu_dots.dots_choice(config.train),
                                          jax.default_backend())  # the trainer's choice
  data = ctr_compress.load_data(dataset, s["finetune_steps"], s["batch_size"], ctx.config.seed,
                                valid_rows=s["valid_rows"] or None)
  full = ctr_prune.full_genome(spec)
  full_size = ctr_prune.pruned_size(spec, values.shape[0], full)
  full_bits = ctr_prune.pruned_bits(spec, values.shape[0], full)
  base_valid, base_test = (
      metrics_lib.auc(split.labels, ctr_compress.score(graphdef, params, values, split,
                                                       compiler_options=options))
      for split in (data.valid, data.test))
  candidates = ctr_compress.search(
      graphdef, spec, params, values, data, population=s["population"],
      generations=s["generations"], learning_rate=s["finetune_lr"],
      mutation_rate=s["mutation_rate"], seed=ctx.config.seed, tune_table=s["tune_table"],
      compiler_options=options)
  front = pareto_evolution.candidate_front(candidates)
  pick = pareto_evolution.choose(front, base_valid, s["max_auc_drop"])
  genome = np.asarray(pick.genome, np.int32)
  batches = ctr_compress.finetune_batches(data.train)
  tuned, rows = jax.jit(lambda p, v, g, b: ctr_compress.finetune(
      graphdef, spec, p, v, g, b, s["finetune_lr"], s["tune_table"]),
                        compiler_options=options)(params, values, genome, batches)
  pruned = ctr_prune.prune(spec, jax.tree.map(np.asarray, tuned),
                           ctr_compress.with_tuned_rows(values, batches, rows), genome)
  final_test = metrics_lib.auc(data.test.labels, ctr_compress.score(
      pruned.graphdef, pruned.params, pruned.values, data.test, compiler_options=options))
  pruned_file = os.path.join(ctx.workdir, _PRUNED_FILE)
  _save_pruned(pruned_file, pruned)
  bundle = write_serving_bundle(ctx.workdir, pruned_file, pruned.model_cfg, config.to_dict(),
                                path)
  metrics = {"baseline_test_auc": base_test, "baseline_valid_auc": base_valid,
             "baseline_params": full_size, "final_test_auc": final_test,
             "final_valid_auc": pick.valid, "final_params": pick.size,
             "search_test_auc": pick.test,  # the masked model's, in the vmapped search
             "size_ratio": pick.size / full_size, "baseline_bits": full_bits,
             "final_bits": pick.cost, "bits_ratio": pick.cost / full_bits,
             "final_table_bits": pruned.bits, "final_embed_dim": pruned.model_cfg["embed_dim"],
             "final_mlp_dims": ",".join(map(str, pruned.model_cfg["mlp_dims"])),
             "num_candidates": len(candidates), "front_size": len(front)}
  output = {"pareto_front": [_point(c, spec, full_size, full_bits) for c in front],
            "compressed_model": dict(pruned.model_cfg),
            "pruned_model": ctx.relative(pruned_file), "serving_bundle": ctx.relative(bundle),
            "source_checkpoint": ctx.relative(path)}
  return StepOutput(metrics, output)


_COMPRESSION_REPORT_KEYS = ("baseline_test_auc", "final_test_auc", "baseline_params",
                            "final_params", "size_ratio", "bits_ratio")


def compression_report(results) -> dict[str, Any]:
  """The pipeline report's `compression` field: the last done `compress` step's pick
  against the model it compressed (`_COMPRESSION_REPORT_KEYS`), or None without one."""
  done = [r for r in results if r.kind == "compress" and r.status == "done"]
  if not done:
    return {"compression": None}
  metrics = done[-1].best_metrics
  return {"compression": {k: metrics[k] for k in _COMPRESSION_REPORT_KEYS if k in metrics}}


def compress_step_kinds() -> dict[str, StepKind]:
  """{'compress'}: Prune-EA / Quant-EA of the handed-on trained model."""
  return {"compress": StepKind(_run_compress, _check_block,
                               "prune a trained CTR model's MLP neurons and embedding dims, "
                               "quantize its table rows")}
