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
    and reports `cache_to_device_ratio`; `--floor=PATH` loads the plain-JAX floor
    (`../shared/bench/bare_jax_deepfm.py`) in this process on the same workload and
    alternates its step with ours, step by step: `step_to_floor_ratio` is the floor's
    median step time over ours (both under the same machine noise);
    `--repeats=R` interleaves R rounds of (floor, device, cache) and reports medians.
The cache JSON carries hit rate, bytes per example each way, swap rows per step and the
per-stage busy and wait seconds. Ends stdout with one JSON line (also written to --out).
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags

from experiments import report
from experiments.configs import ctr as ctr_config
from sfjax.data import synthetic, types
from sfjax.embedding import device_table, row_optimizers, vsi
from sfjax.train import backends, loop, optimizers, runner
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
_UNIQUE_CAP = flags.DEFINE_integer("unique_capacity", 0, "Padded unique ids per step (0: the "
                                   "largest unique count of the batches, rounded up to 256, "
                                   "as the floor pads).")
_ROW_OPT = flags.DEFINE_enum("embedding_optimizer", "rowwise_adagrad", list(row_optimizers.ROW_OPTIMIZERS),
                             "Row optimizer of the embedding table.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Rounds of (floor, backends), interleaved; figures "
                                "are medians over rounds.")
_FLOOR = flags.DEFINE_string("floor", "", "Path of the plain-JAX floor script to run in the same "
                             "window (e.g. ../shared/bench/bare_jax_deepfm.py).")


def workload_config(backend: str, unique_capacity: int) -> ml_collections.ConfigDict:
  """The benchmark config (ctr.py defaults + the workload's sizes) for `backend`."""
  c = ctr_config.get_config()
  c.model.name, c.model.embed_dim, c.model.mlp_dims = _MODEL.value, _DIM.value, (400, 400, 400)
  c.embedding.optimizer, c.optimizer.name = _ROW_OPT.value, "adam"
  c.train.batch_size = _BATCH.value
  c.train.num_devices = 1
  c.embedding.backend = backend
  c.embedding.cache_rows = _CACHE_ROWS.value
  c.embedding.lookahead = _LOOKAHEAD.value
  c.embedding.unique_capacity = unique_capacity
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


def unique_capacity(spec: types.DatasetSpec, batches: list[types.Batch]) -> int:
  """`--unique_capacity`, or the batches' largest unique-id count rounded up to 256."""
  if _UNIQUE_CAP.value:
    return _UNIQUE_CAP.value
  most = max(np.unique(b.ids + spec.field_offsets[None, :]).size for b in batches)
  return -(-most // 256) * 256


def run_backend(backend: str, spec: types.DatasetSpec, batches: list[types.Batch],
                capacity: int) -> dict:
  """One backend's figures: compile, waited (device-bound) window, pipelined window."""
  config = workload_config(backend, capacity)
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
    timed_inputs = inputs
    if backend == "device":
      # Device-bound: the window's batches are prepared before it starts, and the loader
      # thread has refilled its bounded queue, so no host work overlaps the timed steps
      # (as in the plain-JAX floor). Cache steps must be planned in order, lookahead ahead.
      timed_inputs = iter([next(inputs) for _ in range(steps)])
      time.sleep(0.5)
    state, timed = runner.run_steps(trainer.run_step, state, timed_inputs, 2 + warmup,
                                    1 + warmup + steps, batch, wait_each_step=True)
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


def load_floor(path: str, pool: int) -> tuple[dict, dict]:
  """Runs the plain-JAX floor script in this process on the same workload.

  Returns:
    (its own JSON figures, its globals: the jitted step `f`, its `state` and device
    batches `dev`, for `interleaved_floor_ratio`).
  """
  argv = [path, "--batch", str(_BATCH.value), "--fields", str(_FIELDS.value),
          "--rows", str(_ROWS.value), "--dim", str(_DIM.value), "--steps", str(_STEPS.value),
          "--zipf", str(_ZIPF.value), "--distinct", str(min(pool, 64))]
  saved, sys.argv = sys.argv, argv
  printed = io.StringIO()
  try:
    with contextlib.redirect_stdout(printed):
      floor = runpy.run_path(path, run_name="__floor__")
  finally:
    sys.argv = saved
  return json.loads(printed.getvalue().strip().splitlines()[-1]), floor


def interleaved_floor_ratio(trainer: loop.Trainer, spec: types.DatasetSpec,
                            batches: list[types.Batch], capacity: int, floor: dict) -> dict:
  """Our device step and the floor's, alternated step by step in one process.

  Both see the same machine noise (2 shared cores drift by ~10% within a minute), so
  the ratio of their median step times is far steadier than separate runs' ratio.
  """
  backend = trainer.backend
  ours = [jax.device_put(vsi.prepare_batch(b, spec.field_offsets, capacity, spec.total_rows)[0],
                         backend.batch_sharding) for b in batches[:_STEPS.value]]
  step, state = trainer.run_step.jitted, trainer.state
  floor_step, floor_state, floor_batches = floor["f"], floor["state"], floor["dev"]
  ours_s, floor_s = [], []
  for i in range(_WARMUP.value + _STEPS.value):
    t = time.perf_counter()
    state, m = step(state, ours[i % len(ours)])
    jax.block_until_ready(m["loss"])
    t1 = time.perf_counter()
    floor_state, loss = floor_step(floor_state, *floor_batches[i % len(floor_batches)])
    jax.block_until_ready(loss)
    t2 = time.perf_counter()
    if i >= _WARMUP.value:
      ours_s.append(t1 - t)
      floor_s.append(t2 - t1)
  ours_ms, floor_ms = statistics.median(ours_s) * 1e3, statistics.median(floor_s) * 1e3
  return {"step_ms": ours_ms, "floor_step_ms": floor_ms, "step_to_floor_ratio": floor_ms / ours_ms}


def main(argv):
  del argv
  spec = types.DatasetSpec(
      tuple(types.FieldSpec(f"C{i + 1}", _ROWS.value) for i in range(_FIELDS.value)), 13)
  total_steps = 1 + _WARMUP.value + 2 * _STEPS.value
  pool = _DISTINCT.value or total_steps
  t = time.perf_counter()
  batches = power_law_batches(spec, _BATCH.value, pool, _ZIPF.value)
  gen_seconds = time.perf_counter() - t
  capacity = unique_capacity(spec, batches)
  names = list(backends.BACKENDS) if _BACKEND.value == "both" else [_BACKEND.value]
  # Rounds interleave the floor and the backends, so each ratio compares runs of one
  # window; the figures are medians over rounds (2 shared cores drift by ~10% a minute).
  rounds = []
  floor = load_floor(_FLOOR.value, pool) if _FLOOR.value else None
  for _ in range(_REPEATS.value):
    entry = {"floor": floor[0]} if floor else {}
    entry.update({name: run_backend(name, spec, batches, capacity) for name in names})
    if len(names) > 1:
      entry["cache_to_device_ratio"] = (entry["cache"]["examples_per_sec"]
                                        / entry["device"]["examples_per_sec"])
    rounds.append(entry)
  if floor:
    trainer = loop.build_trainer(workload_config("device", capacity), spec)
    interleaved = interleaved_floor_ratio(trainer, spec, batches, capacity, floor[1])
  result = {
      "benchmark": "bench_train", "backend": _BACKEND.value, "model": _MODEL.value,
      "batch_size": _BATCH.value, "num_fields": _FIELDS.value, "rows_per_field": _ROWS.value,
      "embed_dim": _DIM.value, "zipf": _ZIPF.value, "embedding_optimizer": _ROW_OPT.value,
      "timed_steps": _STEPS.value, "distinct_batches": pool, "fresh_batches": pool >= total_steps,
      "data_generation_s": gen_seconds, "devices": jax.device_count(),
      "platform": jax.devices()[0].platform, "repeats": len(rounds),
      "unique_capacity": capacity,
  }
  median = lambda values: float(statistics.median(values))
  first = rounds[-1][names[0]]
  result.update({k: first[k] for k in ("mean_unique_per_batch", "compile_s", "final_loss",
                                       "state_bytes_per_row")})
  for key in ("examples_per_sec", "device_step_ms"):
    result[key] = median([r[names[0]][key] for r in rounds])
  result["device_examples_per_sec"] = _BATCH.value / (result["device_step_ms"] * 1e-3)
  result["median_step_ms"] = result["device_step_ms"]
  if "cache" in first:
    result["cache"] = first["cache"]
    result["cache_rows"] = first["cache"]["cache_rows"]
  if "profile" in first:
    result["profile"] = first["profile"]
  if len(names) > 1:
    result["runs"] = {name: rounds[-1][name] for name in names}  # the last round
    result["cache_to_device_ratio"] = median([r["cache_to_device_ratio"] for r in rounds])
  if floor:
    result["floor"] = floor[0]
    result["floor_interleaved"] = interleaved
    result["step_to_floor_ratio"] = interleaved["step_to_floor_ratio"]
  if len(rounds) > 1:
    result["rounds"] = rounds
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)
