"""The CTR training loop: `train_and_evaluate(config, workdir)`.

Data flow per step (DESIGN.md §2, device backend):
  dataset.train_batches (host) -> prepare_batch: VSI, int32 rows (background thread)
  -> device_put -> jitted donated train_step -> metrics.
Evaluation streams every eval split through the jitted eval step and computes
exact AUC / logloss over all real examples on the host.

Importable from notebooks; `experiments/train_ctr.py` only parses flags.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from sfjax import models
from sfjax.embedding import row_optimizers
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import backends
from sfjax.train import config_check
from sfjax.train import metrics as metrics_lib
from sfjax.train import optimizers
from sfjax.train import prefetch
from sfjax.train import state as state_lib
from sfjax.train import step as step_lib


# Cache counters copied into every metrics.jsonl record (cumulative).
_CACHE_KEYS = ("cache_hit_rate", "h2d_bytes_per_example", "d2h_bytes_per_example", "evictions")
_NOT_JSON = ("final_state", "trainer", "losses")


class Trainer(NamedTuple):
  """Static pieces of a run plus its initial state (build with `build_trainer`).

  Attributes:
    graphdef: the model's NNX graph definition.
    state: initial TrainState (its `table` is the device table or the empty cache).
    backend: a `backends.DeviceBackend` or `backends.CacheBackend`.
    width: embedding row width E.
    mesh: the ('data',) device mesh.
  """

  graphdef: Any
  state: state_lib.TrainState
  backend: Any
  width: int
  mesh: Any


def build_trainer(config, spec) -> Trainer:
  """Model, optimizers, embedding backend, initial state and jitted step for `spec`."""
  mcfg, ecfg = config.model, config.embedding
  width = models.embedding_width(mcfg.name, mcfg.embed_dim)
  model = models.build_model_from_config(
      mcfg, num_fields=spec.num_fields, num_dense=spec.num_dense,
      rngs=nnx.Rngs(config.seed))
  graphdef, params = nnx.split(model)
  tx = optimizers.dense_optimizer(config.optimizer)
  row_opt = row_optimizers.from_config(ecfg)
  mesh = mesh_lib.make_mesh(config.train.num_devices)
  if config.train.batch_size % mesh.size:
    raise ValueError(f"config field train.batch_size={config.train.batch_size} must be "
                     f"divisible by the {mesh.size} devices of the mesh")
  rep = mesh_lib.replicated(mesh)
  train_step = step_lib.make_train_step(graphdef, tx, row_opt, l2=ecfg.l2)
  backend = backends.make_backend(config, spec, width, graphdef, train_step, row_opt, mesh)
  params = jax.device_put(params, rep)
  opt_state = jax.device_put(tx.init(params), rep)
  state = state_lib.TrainState(jax.device_put(jnp.zeros((), jnp.int32), rep), params,
                               opt_state, backend.initial_table)
  backend.jit(jax.tree.map(lambda _: rep, state))
  return Trainer(graphdef, state, backend, width, mesh)


def evaluate(trainer: Trainer, state: state_lib.TrainState, dataset, split: str,
             batch_size: int) -> dict[str, float]:
  """Exact AUC and logloss over every real example of `split`."""
  backend = trainer.backend
  backend.sync(state)
  logits, labels, masks = [], [], []
  with prefetch.map_in_background(lambda b: (backend.prepare_eval(b), b),
                                  dataset.eval_batches(split, batch_size),
                                  maxsize=2, name="sfjax-eval") as it:
    for prepared, batch in it:
      logits.append(backend.eval_logits(state, prepared))
      labels.append(batch.labels)
      masks.append(batch.mask)
  if not logits:
    raise ValueError(f"eval split {split!r} is empty")
  scores = np.concatenate([np.asarray(x) for x in logits])
  labels, masks = np.concatenate(labels), np.concatenate(masks)
  probs = metrics_lib.sigmoid(scores)
  return {"auc": metrics_lib.auc(labels, scores, masks),
          "logloss": metrics_lib.logloss(labels, probs, masks),
          "num_examples": int(masks.sum())}


def _fmt_eta(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  m, s = divmod(int(seconds), 60)
  h, m = divmod(m, 60)
  return f"{h:d}:{m:02d}:{s:02d}"


def train_and_evaluate(config, workdir: str | None = None, dataset=None) -> dict[str, Any]:
  """Trains, evaluates every `train.eval_every` steps and at the end.

  Args:
    config: the ConfigDict of `experiments/configs/ctr.py`.
    workdir: where `metrics.jsonl` and `config.json` go (None: nothing is written).
    dataset: an already built dataset (else built from `config.data`).

  Returns:
    Final metrics: those of the last eval (primary split: `auc`, `logloss`), per split
    `<split>_auc`/`<split>_logloss`, `examples_per_sec`, `oracle_*` (synthetic data),
    `best` (the eval with the best primary AUC) and, when a 'test' split exists,
    `test_auc`/`test_logloss` taken at that best eval (model selection on the first split).
  """
  config_check.validate(config)
  tcfg = config.train
  if dataset is None:
    from sfjax.data import dataset as dataset_lib  # pylint: disable=import-outside-toplevel
    dataset = dataset_lib.make_dataset(config.data, config.seed)
  spec = dataset.spec
  trainer = build_trainer(config, spec)
  metrics_file = None
  if workdir:
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
    metrics_file = open(os.path.join(workdir, "metrics.jsonl"), "w")
  backend = trainer.backend
  logging.info("backend=%s table rows=%d width=%d, fields=%d dense=%d, devices=%d, "
               "unique capacity=%d", backend.name, spec.total_rows, trainer.width,
               spec.num_fields, spec.num_dense, trainer.mesh.size, backend.capacity)
  state = trainer.state
  oracle = dataset.oracle or {}
  history, best, losses, window_losses, unique_counts = [], None, [], [], []
  total_train_time, total_examples, window_examples = 0.0, 0, 0
  t_log, ex_log = time.perf_counter(), 0
  steps = tcfg.steps
  it = backend.train_inputs(dataset.train_batches(tcfg.batch_size, config.seed))
  try:
    t_window = time.perf_counter()
    for step in range(1, steps + 1):
      state, step_metrics, n_unique = backend.run_step(state, next(it))
      unique_counts.append(n_unique)
      window_losses.append(step_metrics["loss"])
      if step == 1:  # exclude compilation from throughput
        jax.block_until_ready(state)
        t_window = t_log = time.perf_counter()
        ex_log = 0
      else:
        window_examples += tcfg.batch_size
        ex_log += tcfg.batch_size
      if step % tcfg.log_every == 0 or step == steps:
        loss = float(step_metrics["loss"])
        now = time.perf_counter()
        rate = ex_log / max(now - t_log, 1e-9)
        eta = (steps - step) * tcfg.batch_size / rate if rate > 0 else float("inf")
        cache = backend.stats()
        hit = ""
        if cache:
          last = cache["last_step"]
          hit = (f"  cache hit rate {cache['cache_hit_rate']:.3f} (last step: {last['hits']} hits, "
                 f"{last['misses']} misses, {last['evictions']} evictions)")
        logging.info("step %d/%d loss %.5f  %.0f examples/s  unique/batch %.0f%s  ETA %s",
                     step, steps, loss, rate, np.mean(unique_counts[-tcfg.log_every:]), hit,
                     _fmt_eta(eta))
        if not math.isfinite(loss):
          raise FloatingPointError(f"training loss became {loss} at step {step}")
        t_log, ex_log = now, 0
      if step % tcfg.eval_every == 0 or step == steps:
        jax.block_until_ready(state)
        window_time = time.perf_counter() - t_window
        total_train_time += window_time
        total_examples += window_examples
        losses.append(np.asarray(jnp.stack(window_losses)))
        record = {"step": step, "loss": float(step_metrics["loss"]),
                  "examples_per_sec": window_examples / max(window_time, 1e-9),
                  "unique_per_batch": float(np.mean(unique_counts))}
        record.update({k: v for k, v in backend.stats().items() if k in _CACHE_KEYS})
        for i, split in enumerate(dataset.eval_splits):
          m = evaluate(trainer, state, dataset, split, tcfg.eval_batch_size)
          record[f"{split}_auc"], record[f"{split}_logloss"] = m["auc"], m["logloss"]
          if i == 0:
            record["auc"], record["logloss"] = m["auc"], m["logloss"]
        for split, om in oracle.items():
          record[f"oracle_{split}_auc"], record[f"oracle_{split}_logloss"] = om["auc"], om["logloss"]
        history.append(record)
        if best is None or record["auc"] > best["auc"]:
          best = record
        logging.info("eval %s", json.dumps(record))
        if metrics_file:
          metrics_file.write(json.dumps(record) + "\n")
          metrics_file.flush()
        window_examples, unique_counts, window_losses = 0, [], []
        t_window = t_log = time.perf_counter()
        ex_log = 0
    backend.sync(state)  # the cache backend flushes every cached row to the host table
  finally:
    it.close()
    backend.close()
    if metrics_file:
      metrics_file.close()

  final = dict(history[-1])
  final["examples_per_sec"] = total_examples / max(total_train_time, 1e-9)
  final["train_seconds"] = total_train_time
  final["bad_lines"] = int(dataset.stats.get("bad_lines", 0))
  if oracle:
    first = next(iter(oracle.values()))
    final["oracle_auc"], final["oracle_logloss"] = first["auc"], first["logloss"]
  final["best"] = best
  if "test_auc" in best:
    final["test_auc"], final["test_logloss"] = best["test_auc"], best["test_logloss"]
  cache_stats = backend.stats()
  if cache_stats:
    final["cache_stats"] = cache_stats
  final["final_state"], final["trainer"] = state, trainer
  final["losses"] = np.concatenate(losses)
  return final


def final_json_line(final: dict[str, Any]) -> str:
  """The one-line JSON summary printed last by the CLI (drops non-JSON values)."""
  return json.dumps({k: v for k, v in final.items() if k not in _NOT_JSON}, sort_keys=True)


def print_final(final: dict[str, Any]) -> None:
  """Prints the final JSON line to stdout."""
  sys.stdout.write(final_json_line(final) + "\n")
  sys.stdout.flush()
