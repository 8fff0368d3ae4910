"""The CTR trainer: `train_and_evaluate(config, workdir) -> (metrics, state)`.

Data flow per step (DESIGN.md §2, device backend):
  dataset.train_batches (host) -> vsi.prepare_batch: VSI, int32 rows (background thread)
  -> device_put -> jitted donated train_step -> metrics.
The loop is three parts: the step runner (`runner.run_steps`, one call per eval
window), per-split evaluation (`evaluation.evaluate_splits`, exact AUC / logloss
on the host) and the metrics writer (`metrics_writer.MetricsWriter`).

Importable from notebooks; `experiments/train_ctr.py` only parses flags.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from sfjax import models
from sfjax.data import dataset as dataset_lib
from sfjax.data import types
from sfjax.embedding import row_optimizers
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import backends
from sfjax.train import config_check
from sfjax.train import evaluation
from sfjax.train import metrics_writer
from sfjax.train import optimizers
from sfjax.train import runner
from sfjax.train import step as step_lib
from sfjax.train.state import TrainState

# Cache counters copied into every metrics.jsonl record (cumulative).
_CACHE_KEYS = ("cache_hit_rate", "h2d_bytes_per_example", "d2h_bytes_per_example", "evictions")


class Trainer(NamedTuple):
  """Static pieces of a run plus its initial state (build with `build_trainer`).

  Attributes:
    graphdef: the model's NNX graph definition.
    state: initial TrainState (its `table` is the device table or the empty cache).
    backend: the embedding backend (`backends.Backend`).
    run_step: the backend's compiled step (`Backend.make_step`).
    width: embedding row width E.
    mesh: the ('data',) device mesh.
  """

  graphdef: Any
  state: TrainState
  backend: backends.Backend
  run_step: backends.RunStep
  width: int
  mesh: Any


def build_trainer(config, spec: types.DatasetSpec) -> Trainer:
  """Model, optimizers, embedding backend, initial state and compiled step for `spec`."""
  mcfg, ecfg = config.model, config.embedding
  width = models.embedding_width(mcfg.name, mcfg.embed_dim)
  model = models.build_model_from_config(
      mcfg, num_fields=spec.num_fields, num_dense=spec.num_dense,
      rngs=nnx.Rngs(config.seed))
  graphdef, params = nnx.split(model)
  tx = optimizers.from_config(config.optimizer)
  row_opt = row_optimizers.from_config(ecfg)
  mesh = mesh_lib.make_mesh(config.train.num_devices)
  if config.train.batch_size % mesh.size:
    raise config_check.ConfigError(
        f"config field train.batch_size: {config.train.batch_size} must be divisible by the "
        f"{mesh.size} devices of the mesh")
  rep = mesh_lib.replicated(mesh)
  train_step = step_lib.make_train_step(graphdef, tx, row_opt, l2=ecfg.l2)
  backend = backends.make_backend(config, spec, width, graphdef, train_step, row_opt, mesh)
  params = jax.device_put(params, rep)
  opt_state = jax.device_put(tx.init(params), rep)
  state = TrainState(jax.device_put(jnp.zeros((), jnp.int32), rep), params, opt_state,
                     backend.initial_table)
  run_step = backend.make_step(jax.tree.map(lambda _: rep, state))
  return Trainer(graphdef, state, backend, run_step, width, mesh)


def _final_metrics(history: list[dict[str, Any]], windows: list[runner.StepWindow], dataset,
                   backend: backends.Backend) -> dict[str, Any]:
  """The run's summary: the last eval record plus throughput, oracle, best and test metrics."""
  final = dict(history[-1])
  examples = sum(w.examples for w in windows)
  seconds = sum(w.seconds for w in windows)
  final["examples_per_sec"] = examples / max(seconds, 1e-9)
  final["train_seconds"] = seconds
  final["bad_lines"] = int(dataset.stats.get("bad_lines", 0))
  oracle = dataset.oracle or {}
  if oracle:
    first = next(iter(oracle.values()))
    final["oracle_auc"], final["oracle_logloss"] = first["auc"], first["logloss"]
  best = max(history, key=lambda r: r["auc"])
  final["best"] = best
  if "test_auc" in best:
    final["test_auc"], final["test_logloss"] = best["test_auc"], best["test_logloss"]
  cache_stats = backend.stats()
  if cache_stats:
    final["cache_stats"] = cache_stats
  return final


def train_and_evaluate(config, workdir: str | None = None, dataset=None,
                       trainer: Trainer | None = None,
                       loss_log: list | None = None) -> tuple[dict[str, Any], TrainState]:
  """Trains, evaluates every `train.eval_every` steps and at the end.

  Args:
    config: a CTR ConfigDict (`sfjax/train/defaults.py`, `experiments/configs/ctr.py`).
    workdir: where `metrics.jsonl` and `config.json` go (None: nothing is written).
    dataset: an already built dataset (else built from `config.data`).
    trainer: an already built trainer for this config and data set (else built
      here); pass one to inspect its backend afterwards (e.g. the host table).
    loss_log: if given, every step's train loss is appended to it (floats).

  Returns:
    (metrics, final state). Metrics (JSON-able): those of the last eval (primary
    split: `auc`, `logloss`), per split `<split>_auc`/`<split>_logloss`,
    `examples_per_sec`, `oracle_*` (synthetic data), `best` (the eval with the
    best primary AUC) and, when a 'test' split exists, `test_auc`/`test_logloss`
    taken at that best eval (model selection on the first split).
  """
  config_check.validate(config)
  tcfg = config.train
  if dataset is None:
    dataset = dataset_lib.make_dataset(config.data, config.seed)
  spec = dataset.spec
  trainer = trainer or build_trainer(config, spec)
  backend = trainer.backend
  logging.info("backend=%s table rows=%d width=%d, fields=%d dense=%d, devices=%d, "
               "unique capacity=%d", backend.name, spec.total_rows, trainer.width,
               spec.num_fields, spec.num_dense, trainer.mesh.size, backend.capacity)
  oracle = dataset.oracle or {}
  state, history, windows = trainer.state, [], []
  inputs = backend.train_inputs(dataset.train_batches(tcfg.batch_size, config.seed))
  try:
    with metrics_writer.MetricsWriter(workdir, config) as writer:
      eval_steps = sorted({*range(tcfg.eval_every, tcfg.steps + 1, tcfg.eval_every), tcfg.steps})
      first = 1
      for last in eval_steps:
        state, window = runner.run_steps(trainer.run_step, state, inputs, first, last,
                                         tcfg.batch_size, total_steps=tcfg.steps,
                                         log_every=tcfg.log_every, stats=backend.stats)
        windows.append(window)
        if loss_log is not None:
          loss_log.extend(float(x) for x in window.losses)
        record = {"step": last, "loss": float(window.last_metrics["loss"]),
                  "examples_per_sec": window.examples_per_sec,
                  "unique_per_batch": float(window.unique_counts.mean())}
        record.update({k: v for k, v in backend.stats().items() if k in _CACHE_KEYS})
        record.update(evaluation.evaluate_splits(backend, state, dataset, tcfg.eval_batch_size))
        for split, om in oracle.items():
          record[f"oracle_{split}_auc"] = om["auc"]
          record[f"oracle_{split}_logloss"] = om["logloss"]
        history.append(record)
        logging.info("eval %s", json.dumps(record))
        writer.write(record)
        first = last + 1
    backend.sync(state)  # the cache backend flushes every cached row to the host table
  finally:
    inputs.close()
    backend.close()
  return _final_metrics(history, windows, dataset, backend), state


def final_json_line(final: dict[str, Any]) -> str:
  """The one-line JSON summary printed last by the CLI."""
  return json.dumps(final, sort_keys=True)


def print_final(final: dict[str, Any]) -> None:
  """Prints the final JSON line to stdout."""
  sys.stdout.write(final_json_line(final) + "\n")
  sys.stdout.flush()
