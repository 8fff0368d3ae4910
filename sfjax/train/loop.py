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

import functools
import json
import os
import sys
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx

from sfjax import models
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.core import feature_layout, host_allocator, workdir_lock
from sfjax.data import dataset as dataset_lib
from sfjax.data import types
from sfjax.embedding import host_table_files, row_optimizers
from sfjax.parallel import distributed
from sfjax.parallel import mesh as mesh_lib
from sfjax.train import (
  backends,
  config_check,
  evaluation,
  input_feed,
  metrics_writer,
  optimizers,
  resume_check,
  runner,
)
from sfjax.train import step as step_lib
from sfjax.train.state import TrainState

# Cache counters copied into every metrics.jsonl record (cumulative).
_CACHE_KEYS = ("cache_hit_rate", "h2d_bytes_per_example", "d2h_bytes_per_example", "evictions")
# Metrics that describe this process, not the training result: timings and cache counters
# (a resumed run counts them from its restart; everything else equals an uninterrupted run).
_PROCESS_METRICS = ("examples_per_sec", "train_seconds", "cache_stats", *_CACHE_KEYS,
                    "num_devices", "num_processes", "cache_sharding", "cache_capacity_rows")


def training_result(record: dict[str, Any]) -> dict[str, Any]:
  """`record` (an eval record or the final metrics) without `_PROCESS_METRICS`, recursively
  in `best`: what a resumed run must reproduce exactly."""
  out = {k: v for k, v in record.items() if k not in _PROCESS_METRICS}
  if "best" in out:
    out["best"] = training_result(out["best"])
  return out


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
  host_allocator.apply_choice(host_allocator.choice_of(config.train))  # before any step runs
  width = models.embedding_width(mcfg.name, mcfg.embed_dim)
  model = models.build_model_from_config(
      mcfg, num_fields=spec.num_fields, num_dense=spec.num_dense,
      rngs=nnx.Rngs(config.seed), layout=spec.layout)
  graphdef, params = nnx.split(model)
  tx = optimizers.dense_optimizer_from_config(config.optimizer)
  # A layout's tables may set their own optimizer, rate and dim: then one `per_table` optimizer.
  # The model behind a layout (`PooledInput`) knows its latent columns when a table has a dim.
  layout, latent_dim = spec.layout, getattr(model, "latent_dim", None)
  row_opt = row_optimizers.row_optimizer_from_config(
      ecfg, None if layout is None else layout.tables,
      None if layout is None or latent_dim is None
      else feature_layout.table_row_widths(layout, latent_dim, width))
  mesh = mesh_lib.make_mesh(config.train.num_devices)
  if config.train.batch_size % mesh.size:
    raise config_check.ConfigError(
        f"config field train.batch_size: {config.train.batch_size} must be divisible by the "
        f"{mesh.size} devices of the mesh")
  if jax.process_count() > 1 and config.train.eval_batch_size % mesh.size:
    raise config_check.ConfigError(
        f"config field train.eval_batch_size: {config.train.eval_batch_size} must be divisible "
        f"by the {mesh.size} devices of the {jax.process_count()} processes' mesh")
  rep = mesh_lib.replicated(mesh)
  build_step = functools.partial(step_lib.make_train_step, graphdef, tx, row_opt, l2=ecfg.l2)
  backend = backends.make_backend(config, spec, width, graphdef, build_step, row_opt, mesh)
  params = jax.device_put(params, rep)
  opt_state = jax.device_put(tx.init(params), rep)
  state = TrainState(jax.device_put(jnp.zeros((), jnp.int32), rep), params, opt_state,
                     backend.initial_table)
  run_step = backend.make_step(jax.tree.map(lambda _: rep, state))
  return Trainer(graphdef, state, backend, run_step, width, mesh)


def _scale_out_metrics(backend: backends.Backend, num_devices: int) -> dict[str, Any]:
  """How the run was laid out: devices, processes, cache sharding and the distinct rows the
  device side holds in all (a row-sharded cache: cache_rows x devices)."""
  return {"num_devices": int(num_devices), "num_processes": int(jax.process_count()),
          "cache_sharding": backend.sharding_name, "cache_capacity_rows": int(backend.capacity_rows)}


def _final_metrics(history: list[dict[str, Any]], windows: list[runner.StepWindow], dataset,
                   backend: backends.Backend, num_devices: int) -> dict[str, Any]:
  """The run's summary: the last eval record plus throughput, oracle, best and test metrics."""
  final = dict(history[-1])
  examples = sum(w.examples for w in windows)
  seconds = sum(w.seconds for w in windows)
  final["examples_per_sec"] = examples / max(seconds, 1e-9)
  final["train_seconds"] = seconds
  final["bad_lines"] = int(dataset.stats.get("bad_lines", 0))
  final.update(_scale_out_metrics(backend, num_devices))
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


def _checkpoint_location(workdir: str | None, every: int) -> tuple[str | None, str | None]:
  """(checkpoint root or None, the checkpoint to resume from or None); `every` is
  `checkpoint.every_steps`. The resume point is the newest checkpoint whose every file
  checks out (corrupt newer ones are moved aside)."""
  if every and not workdir:
    logging.warning("checkpoint.every_steps=%d but no workdir: no checkpoints are written", every)
  root = os.path.join(workdir, checkpoint.CHECKPOINT_DIR) if workdir and every else None
  return root, checkpoint.find_resumable(root)


def _check_resume(config, spec: types.DatasetSpec, resume_from: str | None
                  ) -> tuple[dict[str, Any], dict[str, list]]:
  """(this run's fingerprint, its changes from the checkpoint's) (`resume_check`).

  Raises:
    resume_check.ResumeMismatchError: naming each field that may not change.
  """
  fingerprint = resume_check.fingerprint(config, spec)
  if not resume_from:
    return fingerprint, {}
  old = checkpoint.read_meta(resume_from).get(resume_check.FINGERPRINT_KEY)
  return fingerprint, resume_check.check_resume(old, fingerprint, config.get("resume", "strict"),
                                                resume_from)


def _reset_mmap_table(config, resume_from: str | None) -> None:
  """Resuming a cache run on an mmap table recreates the table first: rows written after
  the checkpoint must not survive. With `embedding.placement` set, the backend is only
  known once the table is planned, so a table left at this process's path is discarded
  too (a device placement never reads it)."""
  e = config.embedding
  may_cache = e.backend == "cache" or bool(e.get("placement", ""))
  if resume_from and may_cache and e.host_storage == "mmap":
    path = distributed.process_path(e.host_path)  # this process's own table
    if host_table_files.discard_mmap_table(path):
      logging.info("resuming: host table %s is reset to %s", path, resume_from)


def _eval_record(step: int, windows: list[runner.StepWindow], unique_counts: list[int],
                 backend: backends.Backend, state: TrainState, dataset,
                 eval_batch_size: int) -> dict[str, Any]:
  """One metrics.jsonl record: throughput of the windows since the last eval, cache
  counters, every eval split's AUC / logloss and the oracle's (synthetic data)."""
  examples = sum(w.examples for w in windows)
  record = {"step": step, "loss": float(windows[-1].last_metrics["loss"]),
            "examples_per_sec": examples / max(sum(w.seconds for w in windows), 1e-9),
            "unique_per_batch": float(np.mean(unique_counts))}
  record.update({k: v for k, v in backend.stats().items() if k in _CACHE_KEYS})
  record.update(evaluation.evaluate_splits(backend, state, dataset, eval_batch_size))
  for split, om in (dataset.oracle or {}).items():
    record[f"oracle_{split}_auc"] = om["auc"]
    record[f"oracle_{split}_logloss"] = om["logloss"]
  return record


def _check_finite(window: runner.StepWindow, first: int) -> None:
  """Raises FloatingPointError naming the first step of the window whose loss is not finite."""
  bad = np.flatnonzero(~np.isfinite(window.losses))
  if bad.size:
    raise FloatingPointError(
        f"training loss became {window.losses[bad[0]]} at step {first + int(bad[0])}")


def _state_is_live(state: TrainState) -> bool:
  """False once a step has consumed (donated) the state's buffers."""
  return not any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state))


def _report_failure(exc: BaseException, backend: backends.Backend, state: TrainState,
                    ckpt_root: str | None) -> None:
  """Saves what can be saved after a fault and says where the last good checkpoint is.

  The cache's dirty rows are flushed to the host table when the step state is still
  valid (not donated to a step that failed, not diverged); otherwise nothing is written.
  """
  if not isinstance(exc, FloatingPointError) and _state_is_live(state):
    try:
      backend.sync(state)
      logging.warning("training stopped at step %d (%s); the table of record is current up "
                      "to that step", int(state.step), type(exc).__name__)
    except Exception as err:  # pylint: disable=broad-except
      logging.error("training stopped and the cache could not be flushed: %r", err)
  else:
    logging.error("training stopped (%s); the step state is not valid, nothing was flushed",
                  type(exc).__name__)
  good = checkpoint.latest(ckpt_root)
  if ckpt_root:
    logging.error("last good checkpoint: %s", good or "none (the run restarts from step 0)")


def _check_multiprocess(config) -> None:
  """The processes' agreement on the config (every process must run the same one).

  Checkpoints are written by every process together (`checkpoint.Checkpointer`: each
  its own table shard); the workdir must be on a file system all of them see.
  """
  same = config.to_dict()
  same.pop("distributed", None)  # process_id differs by design
  distributed.check_agreement("the config", np.frombuffer(
      json.dumps(same, sort_keys=True, default=str).encode(), np.uint8))


def train_and_evaluate(config, workdir: str | None = None, dataset=None,
                       trainer: Trainer | None = None,
                       loss_log: list | None = None) -> tuple[dict[str, Any], TrainState]:
  """Trains, evaluates every `train.eval_every` steps and at the end.

  With `checkpoint.every_steps = K > 0` and a workdir, a checkpoint is saved every K
  steps and at the last step under `workdir/checkpoints/` (`sfjax.checkpoint.checkpointer`),
  and a run whose workdir already holds one resumes from the latest: state, eval
  history and data position (the checkpoint's input position: the stream starts there,
  `input_feed`), so it ends exactly as an uninterrupted run would. The run holds the
  workdir's lock (`sfjax.core.workdir_lock`) throughout; a resume first compares the
  checkpoint's fingerprint with this run's (`resume_check`: shape changes refused, changed
  settings refused unless `config.resume='allow_changes'`, recorded in
  `config_history.jsonl`).

  Args:
    config: a CTR ConfigDict (`sfjax/train/defaults.py`, `experiments/configs/ctr.py`).
    workdir: where `metrics.jsonl`, `config.json` and `checkpoints/` go (None: nothing
      is written).
    dataset: an already built dataset (else built from `config.data`).
    trainer: an already built trainer for this config and data set (else built
      here); pass one to inspect its backend afterwards (e.g. the host table).
    loss_log: if given, every step's train loss of this call is appended to it (floats).

  Returns:
    (metrics, final state). Metrics (JSON-able): those of the last eval (primary
    split: `auc`, `logloss`), per split `<split>_auc`/`<split>_logloss`,
    `examples_per_sec`, `oracle_*` (synthetic data), `best` (the eval with the
    best primary AUC) and, when a 'test' split exists, `test_auc`/`test_logloss`
    taken at that best eval (model selection on the first split).

  Raises:
    ConfigError: an invalid config field; `resume_check.ResumeMismatchError` (one) for a
      checkpoint this config may not resume.
    WorkdirLockedError: another run holds `workdir`; the message names it.
  """
  metrics, state, _ = run_training(config, workdir, dataset, trainer, loss_log)
  return metrics, state


class TrainingRun(NamedTuple):
  """What `run_training` returns: `train_and_evaluate`'s (metrics, state) and the trainer."""

  metrics: dict[str, Any]
  state: TrainState
  trainer: Trainer


def run_training(config, workdir: str | None = None, dataset=None, trainer: Trainer | None = None,
                 loss_log: list | None = None) -> TrainingRun:
  """`train_and_evaluate`, also returning the trainer that trained (the one it built when
  `trainer` is None), so a caller can score or read the table with its backend afterwards.

  Let it build the trainer of a cache run on an mmap host table that may be resumed: the
  loop resets the table at `embedding.host_path` to the checkpoint before building it (a
  trainer built beforehand has already created its table, so a resume would collide with
  the crashed run's files).

  Raises:
    As `train_and_evaluate`.
  """
  config_check.validate(config)
  # Before the data set and XLA's worker threads allocate: they then share the tuned heap.
  host_allocator.apply_choice(host_allocator.choice_of(config.train))
  distributed.initialize_distributed(config)  # no-op for one process; else joins (before any JAX use)
  if jax.process_count() > 1:
    _check_multiprocess(config)
  # One owner per workdir (each process of several: its own files' lock); issue #25.
  with workdir_lock.hold_workdir(workdir, "train_and_evaluate", jax.process_index()):
    return _train_and_evaluate(config, workdir, dataset, trainer, loss_log)


def _train_and_evaluate(config, workdir: str | None, dataset, trainer: Trainer | None,
                        loss_log: list | None) -> TrainingRun:
  """`run_training` once the config is valid and the workdir is held."""
  tcfg = config.train
  ckpt_every, ckpt_keep = checkpoint.checkpoint_settings(config)
  ckpt_root, resume_from = _checkpoint_location(workdir, ckpt_every)
  if dataset is None:
    config_check.check_paths(config)
    dataset = dataset_lib.make_dataset(config.data, config.seed)
  spec = dataset.spec
  fingerprint, changes = _check_resume(config, spec, resume_from)
  if trainer is None:  # a trainer built by the caller made its host table already
    _reset_mmap_table(config, resume_from)
  if workdir and distributed.is_main_process():
    resume_check.record_config(workdir, config, "resume" if resume_from else "start", changes,
                               checkpoint.read_meta(resume_from)["step"] if resume_from else 0)
  trainer = trainer or build_trainer(config, spec)
  backend = trainer.backend
  logging.info("backend=%s table rows=%d width=%d, fields=%d dense=%d, devices=%d, "
               "unique capacity=%d", backend.name, spec.total_rows, trainer.width,
               spec.num_fields, spec.num_dense, trainer.mesh.size, backend.capacity)
  state, history, windows, pending, start = trainer.state, [], [], [], 0
  checkpointer, restored = None, None
  # For exports: the table's row ranges (one per field, or per table of a feature layout).
  fields = ([{"name": f.name, "rows": int(f.num_rows)} for f in spec.fields]
            if spec.layout is None else feature_layout.table_ranges(spec.layout))
  layout_meta = ({} if spec.layout is None
                 else {"features": feature_layout.layout_to_json(spec.layout)})
  if ckpt_root:
    checkpointer = checkpoint.Checkpointer(ckpt_root, ckpt_keep, backend.host_table)
    if resume_from:  # found under ckpt_root (`_checkpoint_location`)
      try:
        restored = checkpointer.restore(resume_from, trainer.state)
      except BaseException:
        checkpointer.close()
        raise
      state, start = restored.state, restored.step
      history, pending = restored.meta["history"], restored.meta["pending_unique_counts"]
      logging.info("resuming from %s (step %d)", resume_from, start)
  # Each process reads its own rows of every global batch; a resume starts at the saved
  # input position (no replay), or replays an older checkpoint's stream (`input_feed`).
  feed = input_feed.InputFeed(dataset, tcfg.batch_size, config.seed, start,
                              restored.meta.get(input_feed.POSITION_KEY) if restored else None)
  inputs = backend.train_inputs(feed)
  eval_steps = {*range(tcfg.eval_every, tcfg.steps + 1, tcfg.eval_every), tcfg.steps}
  ckpt_steps = {*range(ckpt_every, tcfg.steps + 1, ckpt_every), tcfg.steps} if ckpt_root else set()
  since_eval: list[runner.StepWindow] = []
  newest = [state]  # the latest dispatched state, for `_report_failure` after a fault
  try:
    with metrics_writer.MetricsWriter(workdir if distributed.is_main_process() else None, None,
                                      resume_step=start if resume_from else None) as writer:
      first = start + 1
      for last in sorted(s for s in eval_steps | ckpt_steps if s > start):
        state, window = runner.run_steps(trainer.run_step, state, inputs, first, last,
                                         tcfg.batch_size, total_steps=tcfg.steps,
                                         log_every=tcfg.log_every, stats=backend.stats,
                                         on_step=lambda st: newest.__setitem__(0, st))
        _check_finite(window, first)  # a diverged state is never evaluated or saved
        windows.append(window)
        since_eval.append(window)
        pending.extend(int(n) for n in window.unique_counts)
        writer.write_losses(first, window.losses)
        if loss_log is not None:
          loss_log.extend(float(x) for x in window.losses)
        if last in eval_steps:
          record = _eval_record(last, since_eval, pending, backend, state, dataset,
                                tcfg.eval_batch_size)
          history.append(record)
          logging.info("eval %s", json.dumps(record))
          writer.write(record)
          since_eval, pending = [], []
        if last in ckpt_steps and checkpointer is not None:  # ckpt_steps: only with ckpt_root
          backend.sync(state)  # the cache's rows reach the host table before it is saved
          path = checkpointer.save(state, {"history": history, "pending_unique_counts": pending,
                                           "fields": fields, **layout_meta,
                                           resume_check.FINGERPRINT_KEY: fingerprint,
                                           input_feed.POSITION_KEY: feed.position_at(last)})
          logging.info("checkpoint %s", path)
        first = last + 1
    backend.sync(state)  # the cache backend flushes every cached row to the host table
    if checkpointer is not None:
      checkpointer.wait()  # the last checkpoint's table files are written in the background
  except BaseException as exc:
    if checkpointer is not None:
      checkpointer.close()  # settles a background save, so the report names the true last one
    _report_failure(exc, backend, newest[0], ckpt_root)
    raise
  finally:
    inputs.close()
    backend.close()
    if checkpointer is not None:
      checkpointer.close()
  return TrainingRun(_final_metrics(history, windows, dataset, backend, trainer.mesh.size), state,
                     trainer)


def _final_json_line(final: dict[str, Any]) -> str:
  """The one-line JSON summary printed last by the CLI."""
  return json.dumps(final, sort_keys=True)


def print_final(final: dict[str, Any]) -> None:
  """Prints the final JSON line to stdout."""
  sys.stdout.write(_final_json_line(final) + "\n")
  sys.stdout.flush()
