"""Throughput of the CTR trainer's step on the benchmark workload, end to end.

  python -m experiments.bench_train [--backend=device|cache|both] [--cache_rows=0.05]
      [--steps=40 --warmup=8 --out=bench.json] [--profile] [--floor=../shared/bench/bare_jax_deepfm.py]

Workload: DeepFM, batch 4096, 26 fields x 100k rows (a 2.6M-row table: 20x a 5% cache),
dim 16, MLP 400-400-400, row-wise Adagrad embedding rows (TorchRec's default) + Adam
dense params, Zipf(1.1) ids with hot ids scattered.

Honest by construction:
  * fresh data: every step gets a batch no other step saw (`--distinct_batches=0`, the
    default, generates one per step ahead of time), so the cache cannot warm up on a
    handful of batches;
  * the headline `examples_per_sec` is the end-to-end pipelined rate of the trainer's own
    step runner (`sfjax.train.runner.run_steps`), host preparation (VSI, cache planning,
    gathers, write-back) included; `device_examples_per_sec` / `device_step_ms` beside
    it time each step waited for on its own (inputs already prepared);
  * `--backend=both` runs the on-device table and the cache in one process, one window,
    and reports `cache_to_device_ratio`; `--floor=PATH` runs the plain-JAX floor
    (`../shared/bench/bare_jax_deepfm.py`) on the same workload in the same window and
    reports `step_to_floor_ratio` (device-bound step rate over the floor's).
The cache JSON carries hit rate, bytes per example each way, swap rows per step and the
per-stage busy and wait seconds. Ends stdout with one JSON line (also written to --out).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app
from absl import flags

from experiments import report
from experiments.configs import ctr as ctr_config
from sfjax.data import synthetic
from sfjax.data import types
from sfjax.embedding import device_table
from sfjax.embedding import row_optimizers
from sfjax.train import backends
from sfjax.train import loop
from sfjax.train import optimizers
from sfjax.train import runner
from sfjax.train import step as step_lib

_STEPS = flags.DEFINE_integer("steps", 40, "Timed steps (each window: waited, then pipelined).")
_WARMUP = flags.DEFINE_integer("warmup", 8, "Untimed steps after compilation.")
_BATCH = flags.DEFINE_integer("batch_size", 4096, "Examples per step.")
_ROWS = flags.DEFINE_integer("rows_per_field", 100_000, "Vocabulary per field.")
_FIELDS = flags.DEFINE_integer("num_fields", 26, "Categorical fields.")
_DIM = flags.DEFINE_integer("embed_dim", 16, "Embedding dimension.")
_ZIPF = flags.DEFINE_float("zipf", 1.1, "Power-law exponent of the ids.")
_MODEL = flags.DEFINE_string("model", "deepfm", "Model name.")
_DISTINCT = flags.DEFINE_integer("distinct_batches", 0, "Distinct host batches cycled through "
                                 "(0: a fresh batch for every step).")
_PROFILE = flags.DEFINE_boolean("profile", False, "Also time each phase separately (device).")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")
_BACKEND = flags.DEFINE_enum("backend", "device", [*backends.BACKENDS, "both"],
                             "Embedding backend ('both': device then cache, one window).")
_CACHE_ROWS = flags.DEFINE_float("cache_rows", 0.05, "Cache backend: rows, or fraction of the table.")
_LOOKAHEAD = flags.DEFINE_integer("lookahead", 2, "Cache backend: steps planned ahead.")
_UNIQUE_CAP = flags.DEFINE_integer("unique_capacity", 45056, "Padded unique ids per step.")
_ROW_OPT = flags.DEFINE_enum("embedding_optimizer", "rowwise_adagrad", list(row_optimizers.ROW_OPTIMIZERS),
                             "Row optimizer of the embedding table.")
_FLOOR = flags.DEFINE_string("floor", "", "Path of the plain-JAX floor script to run in the same "
                             "window (e.g. ../shared/bench/bare_jax_deepfm.py).")


def workload_config(backend: str) -> ml_collections.ConfigDict:
  """The benchmark config (ctr.py defaults + the workload's sizes) for `backend`."""
  c = ctr_config.get_config()
  c.model.name, c.model.embed_dim, c.model.mlp_dims = _MODEL.value, _DIM.value, (400, 400, 400)
  c.embedding.optimizer, c.optimizer.name = _ROW_OPT.value, "adam"
  c.train.batch_size = _BATCH.value
  c.train.num_devices = 1
  c.embedding.backend = backend
  c.embedding.cache_rows = _CACHE_ROWS.value
  c.embedding.lookahead = _LOOKAHEAD.value
  c.embedding.unique_capacity = _UNIQUE_CAP.value
  return c


def power_law_batches(spec: types.DatasetSpec, batch_size: int, count: int, zipf: float,
                      seed: int = 0) -> list[types.Batch]:
  """`count` host batches with Zipf ids (hot ids scattered by a per-field bijection)."""
  sampler = synthetic.make_row_sampler(seed, spec.field_rows, zipf, 13)
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    u = rng.random((batch_size, spec.num_fields))
    ranks = synthetic.bounded_power_law_ranks(u, sampler.field_rows, zipf)
    ids = (ranks * sampler.perm_mul + sampler.perm_add) % sampler.field_rows
    dense = np.log1p(rng.integers(0, 100, (batch_size, 13)))
    out.append(types.make_batch(ids, dense, rng.integers(0, 2, batch_size)))
  return out


def _time(fn, *args, reps=10):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def profile_phases(trainer: loop.Trainer, tx, row_opt, state, db) -> dict[str, float]:
  """Median milliseconds of each phase of the step, each jitted on its own."""
  gd = trainer.graphdef
  gather = jax.jit(device_table.gather_rows)
  uniq = gather(state.table, db.rows)
  fwd = jax.jit(lambda p, v, b: step_lib.forward_logits(gd, p, v, b))
  fwd_bwd = jax.jit(lambda p, v, b: step_lib.loss_and_grads(gd, p, v, b, 0.0))
  (_, _), (pg, rg) = fwd_bwd(state.params, uniq.values, db)
  row_update = jax.jit(lambda t, r, u, g: device_table.scatter_rows(
      t, r, device_table.TableState(*row_opt.update(u.values, u.opt_slots, g, jnp.int32(1)))),
                       donate_argnums=0)
  dense_update = jax.jit(lambda g, s, p: tx.update(g, s, p))
  table = jax.tree.map(jnp.copy, state.table)
  ms = {
      "gather_ms": _time(gather, state.table, db.rows),
      "forward_ms": _time(fwd, state.params, uniq.values, db),
      "forward_backward_ms": _time(fwd_bwd, state.params, uniq.values, db),
      "dense_optimizer_ms": _time(dense_update, pg, state.opt_state, state.params),
  }
  times = []
  for _ in range(10):
    t = time.perf_counter()
    table = jax.block_until_ready(row_update(table, db.rows, uniq, rg))
    times.append(time.perf_counter() - t)
  ms["row_update_ms"] = statistics.median(times[2:])
  return {k: v * 1e3 for k, v in ms.items()}


def run_backend(backend: str, spec: types.DatasetSpec, batches: list[types.Batch]) -> dict:
  """One backend's figures: compile, waited (device-bound) window, pipelined window."""
  config = workload_config(backend)
  trainer = loop.build_trainer(config, spec)
  backend_obj = trainer.backend
  steps, warmup, batch = _STEPS.value, _WARMUP.value, _BATCH.value

  def host_batches():
    i = 0
    while True:
      yield batches[i % len(batches)]
      i += 1

  state = trainer.state
  t_compile = time.perf_counter()
  inputs = backend_obj.train_inputs(host_batches())
  try:
    # Step 1 compiles; the warm-up and the first timed window wait for every step
    # (device-bound step time), the second runs pipelined as the trainer does.
    state, _ = runner.run_steps(trainer.run_step, state, inputs, 1, 1, batch)
    t_compile = time.perf_counter() - t_compile
    state, _ = runner.run_steps(trainer.run_step, state, inputs, 2, 1 + warmup, batch)
    state, timed = runner.run_steps(trainer.run_step, state, inputs, 2 + warmup, 1 + warmup + steps,
                                    batch, wait_each_step=True)
    before = dict(backend_obj.stats())
    state, piped = runner.run_steps(trainer.run_step, state, inputs, 2 + warmup + steps,
                                    1 + warmup + 2 * steps, batch)
    after = dict(backend_obj.stats())
    backend_obj.sync(state)
  finally:
    inputs.close()
    backend_obj.close()
  median = statistics.median(timed.step_seconds)
  width = trainer.width
  row_opt = row_optimizers.from_config(config.embedding)
  result = {
      "backend": backend, "examples_per_sec": piped.examples_per_sec,
      "device_step_ms": median * 1e3, "device_examples_per_sec": batch / median,
      "mean_unique_per_batch": float(np.mean(timed.unique_counts)), "compile_s": t_compile,
      "final_loss": float(piped.last_metrics["loss"]),
      "table_rows": spec.total_rows, "row_width": width,
      "state_bytes_per_row": 4 * (width + row_opt.slot_width(width)),
  }
  if after:
    result["cache"] = cache_figures(before, after, backend_obj.num_slots, spec.total_rows)
  if _PROFILE.value and backend == "device":
    db = jax.device_put(backend_obj.prepare_eval(batches[0]))
    result["profile"] = profile_phases(trainer, optimizers.from_config(config.optimizer),
                                       row_opt, state, db)
  return result


def cache_figures(before: dict, after: dict, cache_rows: int, table_rows: int) -> dict:
  """Cache counters of the pipelined window alone (differences of cumulative counters)."""
  d = {k: after[k] - before.get(k, 0) for k in after
       if isinstance(after[k], (int, float)) and not isinstance(after[k], bool)}
  ex, steps, row_bytes = max(d["examples"], 1), max(d["steps"], 1), after["row_bytes"]
  return {
      "cache_rows": cache_rows, "table_to_cache_ratio": table_rows / cache_rows,
      "cache_hit_rate": d["hits"] / max(d["unique_ids"], 1),
      "h2d_bytes_per_example": d["h2d_rows"] * row_bytes / ex,
      "d2h_bytes_per_example": d["d2h_rows"] * row_bytes / ex,
      "misses_per_step": d["misses"] / steps, "swap_rows_per_step": d["swap_rows"] / steps,
      "ordering_waits": d["ordering_waits"],
      "stage_seconds": {k: d[k] for k in ("loader_seconds", "manager_seconds",
                                          "manager_wait_seconds", "writeback_seconds",
                                          "device_wait_seconds")},
      "steps_per_swap_size": after["steps_per_swap_size"],
  }


def run_floor(path: str, pool: int) -> dict:
  """The plain-JAX floor on the same workload, in this window (a subprocess)."""
  cmd = [sys.executable, path, "--batch", str(_BATCH.value), "--fields", str(_FIELDS.value),
         "--rows", str(_ROWS.value), "--dim", str(_DIM.value), "--steps", str(_STEPS.value),
         "--zipf", str(_ZIPF.value), "--distinct", str(min(pool, 64))]
  out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  spec = types.DatasetSpec(
      tuple(types.FieldSpec(f"C{i + 1}", _ROWS.value) for i in range(_FIELDS.value)), 13)
  total_steps = 1 + _WARMUP.value + 2 * _STEPS.value
  pool = _DISTINCT.value or total_steps
  t = time.perf_counter()
  batches = power_law_batches(spec, _BATCH.value, pool, _ZIPF.value)
  gen_seconds = time.perf_counter() - t
  names = list(backends.BACKENDS) if _BACKEND.value == "both" else [_BACKEND.value]
  runs = {name: run_backend(name, spec, batches) for name in names}
  result = {
      "benchmark": "bench_train", "backend": _BACKEND.value, "model": _MODEL.value,
      "batch_size": _BATCH.value, "num_fields": _FIELDS.value, "rows_per_field": _ROWS.value,
      "embed_dim": _DIM.value, "zipf": _ZIPF.value, "embedding_optimizer": _ROW_OPT.value,
      "timed_steps": _STEPS.value, "distinct_batches": pool, "fresh_batches": pool >= total_steps,
      "data_generation_s": gen_seconds, "devices": jax.device_count(),
      "platform": jax.devices()[0].platform,
  }
  first = runs[names[0]]
  result.update({k: first[k] for k in ("examples_per_sec", "device_step_ms",
                                       "device_examples_per_sec", "mean_unique_per_batch",
                                       "compile_s", "final_loss", "state_bytes_per_row")})
  result["median_step_ms"] = first["device_step_ms"]
  if "cache" in first:
    result["cache"] = first["cache"]
    result["cache_rows"] = first["cache"]["cache_rows"]
  if "profile" in first:
    result["profile"] = first["profile"]
  if len(runs) > 1:
    result["runs"] = runs
    result["cache_to_device_ratio"] = runs["cache"]["examples_per_sec"] / runs["device"]["examples_per_sec"]
  if _FLOOR.value:
    floor = run_floor(_FLOOR.value, pool)
    result["floor"] = floor
    device = runs.get("device", first)
    result["step_to_floor_ratio"] = device["device_examples_per_sec"] / floor["examples_per_sec"]
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)
