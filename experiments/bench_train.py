"""Throughput of the CTR trainer's step on the benchmark workload, end to end.

  python -m experiments.bench_train [--config=experiments/configs/bench_train.py[:smoke]]
      [--config.backend=device|cache|both --config.cache_rows=0.05 --config.steps=40
       --config.warmup=8 --config.profile=True --config.floor=True --config.repeats=3
       --config.out=bench.json]

Workload: DeepFM, batch 4096, 26 fields x 100k rows (a 2.6M-row table: 20x a 5% cache),
dim 16, MLP 400-400-400, row-wise Adagrad embedding rows (TorchRec's default) + Adam
dense params, Zipf(1.1) ids with hot ids scattered.

Honest by construction:
  * fresh data: every step gets a batch no other step saw (`distinct_batches=0`, the
    default, generates one per step ahead of time), so the cache cannot warm up on a
    handful of batches;
  * the headline `examples_per_sec` is the end-to-end pipelined rate of the trainer's own
    step runner (`sfjax.train.runner.run_steps`), host preparation (VSI, cache planning,
    gathers, write-back) included; `device_examples_per_sec` / `device_step_ms` beside
    it time each step waited for on its own (inputs already prepared). The two kinds of
    steps alternate in chunks of `chunk_steps` (`step_timing.alternate_windows`),
    so `end_to_end_to_device_ratio` compares figures of one window;
  * `backend=both` runs the on-device table and the cache in one process, one window,
    and reports `cache_to_device_ratio`; `floor=True` runs the plain-JAX floor
    (`experiments/floor_deepfm.py`) in this process on the same batches and unique
    capacity, alone (`floor`) and alternated with our device step, step by step:
    `step_to_floor_ratio` is the floor's median step time over ours (both under the same
    machine noise);
    `repeats=R` interleaves R rounds of (floor, device, cache, floor alternated with
    device) and reports medians over rounds;
  * `split_input=False` trains DeepFM without `model.split_input` (the trainer's default:
    the same model up to float rounding, laid out for speed, `DeepFM.from_unique_rows`),
    i.e. with one concatenated `[B, F*D+Nd]` MLP input.
The cache JSON carries hit rate, bytes per example each way, swap rows per step and the
per-stage busy and wait seconds. `run(config)` returns the figures; the command ends
stdout with them as one JSON line (also written to `config.out`).

`workload='multihot'` (issue #22): the synthetic multi-hot data of `data.format=multihot`
(`sfjax.data.generated.multihot`: one-hot user / item / context fields, short bags, two long
DLRMv2-like bags of up to 128 ids, a 20-id history sharing the item table) at the
config's `multihot.*` table sizes, fresh rows every step; the JSON adds ids per example,
unique rows per batch and the host->device bytes per example of the step's inputs
(rows, vids, weights, dense, labels) beside the cache's row traffic. No floor for it
(the plain-JAX floor is one-hot only).

Old flag -> config field: each `--X` is `--config.X` (steps, warmup, batch_size,
rows_per_field, num_fields, embed_dim, zipf, model, distinct_batches, profile, backend,
cache_rows, lookahead, unique_capacity, embedding_optimizer, repeats, out), except
`--floor=PATH` (a script outside the repository), now `--config.floor=True`.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments import cli
from experiments import step_timing as timing
from experiments.configs import ctr as ctr_config
from sfjax.core import ConfigError, resolve_xla_cpu_dots, tuned_host_allocator
from sfjax.data import (
  Batch,
  DatasetSpec,
  FieldSpec,
  MultihotCTR,
  bounded_power_law_ranks,
  make_batch,
  make_row_sampler,
)
from sfjax.embedding import (
  ROW_DTYPES,
  ROW_OPTIMIZERS,
  TableState,
  gather_rows,
  prepare_batch,
  row_optimizer_from_config,
  scatter_rows,
)
from sfjax.train import (
  BACKENDS,
  Trainer,
  build_trainer,
  dense_optimizer_from_config,
  forward_logits,
  loss_and_grads,
  run_steps,
)

WORKLOADS = ("onehot", "multihot")


def workload_config(config: ml_collections.ConfigDict, backend: str,
                    unique_capacity: int) -> ml_collections.ConfigDict:
  """The trainer's config (ctr.py defaults + the workload's sizes) for `backend`."""
  c = ctr_config.get_config()
  c.model.name, c.model.embed_dim, c.model.mlp_dims = config.model, config.embed_dim, (400, 400, 400)
  c.embedding.optimizer, c.optimizer.name = config.embedding_optimizer, "adam"
  c.train.batch_size = config.batch_size
  c.train.num_devices = 1
  c.embedding.backend = backend
  c.embedding.cache_rows = float(config.cache_rows)
  c.embedding.lookahead = config.lookahead
  c.embedding.unique_capacity = unique_capacity
  c.embedding.update(dict(config.get("embedding", {})))  # dtype, stochastic_rounding, keep_upcoming
  c.model.split_input, c.train.loader_nice = config.split_input, config.loader_nice
  c.train.loader_idle = config.loader_idle
  c.train.host_allocator = config.get("host_allocator", "tuned")
  c.train.xla_cpu_dots = config.get("xla_cpu_dots", "auto")
  return c


def power_law_batches(spec: DatasetSpec, batch_size: int, count: int, zipf: float,
                      seed: int = 0) -> list[Batch]:
  """`count` host batches with Zipf ids (hot ids scattered by a per-field bijection)."""
  sampler = make_row_sampler(seed, spec.field_rows, zipf, 13)
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    u = rng.random((batch_size, spec.num_fields))
    ranks = bounded_power_law_ranks(u, sampler.field_rows, zipf)
    ids = (ranks * sampler.perm_mul + sampler.perm_add) % sampler.field_rows
    dense = np.log1p(rng.integers(0, 100, (batch_size, 13)))
    out.append(make_batch(ids, dense, rng.integers(0, 2, batch_size)))
  return out


def _time(fn, *args, reps=10):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def profile_phases(trainer: Trainer, tx, row_opt, state, db) -> dict[str, float]:
  """Median milliseconds of each phase of the step, each jitted on its own."""
  gd = trainer.graphdef
  gather = jax.jit(gather_rows)
  uniq = gather(state.table, db.rows)
  fwd = jax.jit(lambda p, v, b: forward_logits(gd, p, v, b))
  fwd_bwd = jax.jit(lambda p, v, b: loss_and_grads(gd, p, v, b, 0.0))
  (_, _), (pg, rg) = fwd_bwd(state.params, uniq.values, db)
  row_update = jax.jit(lambda t, r, u, g: scatter_rows(
      t, r, TableState(*row_opt.update(u.values, u.opt_slots, g, jnp.int32(1)))),
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


def multihot_batches(config: ml_collections.ConfigDict, count: int,
                     seed: int = 0) -> tuple[DatasetSpec, list[Batch]]:
  """The multi-hot workload: `count` fresh batches of `data.format=multihot` rows."""
  data_cfg = ctr_config.get_config("multihot").data.multihot
  data_cfg.update(dict(config.multihot))
  data = MultihotCTR(data_cfg, seed)
  size = config.batch_size
  return data.spec, [data.generate_rows("train", i * size, size).to_batch() for i in range(count)]


def _unique_rows(spec: DatasetSpec, batch: Batch) -> int:
  """Distinct table rows a batch touches (padding excluded)."""
  ids = batch.ids + spec.column_offsets[None, :]
  return int(np.unique(ids[batch.ids >= 0]).size)


def unique_capacity(config: ml_collections.ConfigDict, spec: DatasetSpec,
                    batches: list[Batch]) -> int:
  """`config.unique_capacity`, or the batches' largest unique-id count (+ the padding
  entry of bags) rounded up to 256."""
  if config.unique_capacity:
    return config.unique_capacity
  most = max(_unique_rows(spec, b) for b in batches) + int(spec.has_padding)
  return -(-most // 256) * 256


def input_figures(spec: DatasetSpec, batches: list[Batch], capacity: int) -> dict:
  """Ids per example, unique rows per batch, and the step inputs' host->device bytes per
  example (the device backend's padded rows, vids, weights, dense, labels and mask)."""
  batch = batches[0]
  db, _ = prepare_batch(batch, spec.column_offsets, capacity, spec.total_rows, spec.column_rows)
  real = batch.ids >= 0
  return {"ids_per_example": float(np.mean([(b.ids >= 0).sum() / b.size for b in batches])),
          "id_columns": spec.num_columns,
          "unique_rows_per_batch": float(np.mean([_unique_rows(spec, b) for b in batches])),
          "padding_share": float(1.0 - real.mean()),
          "input_bytes_per_example": sum(x.nbytes for x in db if x is not None) / batch.size}


def run_backend(bench: ml_collections.ConfigDict, backend: str, spec: DatasetSpec,
                batches: list[Batch], capacity: int) -> dict:
  """One backend's figures: compile, then waited (device-only) and pipelined (end-to-end)
  steps alternated in chunks (`step_timing.alternate_windows`)."""
  config = workload_config(bench, backend, capacity)
  trainer = build_trainer(config, spec)
  backend_obj = trainer.backend
  steps, warmup, batch = bench.steps, bench.warmup, bench.batch_size

  def host_batches():
    i = 0
    while True:
      yield batches[i % len(batches)]
      i += 1

  state = trainer.state
  t_compile = time.perf_counter()
  inputs = backend_obj.train_inputs(host_batches())
  try:
    # Step 1 compiles; then the warm-up, then the alternated chunks.
    state, _ = run_steps(trainer.run_step, state, inputs, 1, 1, batch)
    t_compile = time.perf_counter() - t_compile
    state, _ = run_steps(trainer.run_step, state, inputs, 2, 1 + warmup, batch)
    # Device-only: a waited chunk's batches are prepared before it (the device backend;
    # cache steps must be planned in order, lookahead ahead), as in the plain-JAX floor.
    windows = timing.alternate_windows(
        trainer.run_step, state, inputs, 2 + warmup, steps, bench.chunk_steps, batch,
        prepare_ahead=backend == "device", stats=backend_obj.stats)
    state = windows.state
    backend_obj.sync(state)
  finally:
    inputs.close()
    backend_obj.close()
  width = trainer.width
  row_opt = row_optimizer_from_config(config.embedding)
  result = {
      "backend": backend, **timing.window_figures(windows, batch),
      "mean_unique_per_batch": float(np.mean(windows.unique_counts)), "compile_s": t_compile,
      "final_loss": float(windows.last_metrics["loss"]),
      "table_rows": spec.total_rows, "row_width": width,
      "embedding_dtype": config.embedding.dtype,
      "state_bytes_per_row": (ROW_DTYPES[config.embedding.dtype].itemsize * width
                              + 4 * row_opt.slot_width(width)),
  }
  if windows.last_stats:
    result["cache"] = cache_figures(windows.counters, windows.last_stats,
                                    backend_obj.num_slots, spec.total_rows)
  if bench.profile and backend == "device":
    db = jax.device_put(backend_obj.prepare_eval(batches[0]))
    result["profile"] = profile_phases(trainer, dense_optimizer_from_config(config.optimizer),
                                       row_opt, state, db)
  return result


def cache_figures(counts: dict, last: dict, cache_rows: int, table_rows: int) -> dict:
  """Cache figures of the pipelined steps alone: `counts` are their counters' increments,
  `last` the backend's stats after them (row bytes, steps per swap size)."""
  d = counts
  ex, steps, row_bytes = max(d["examples"], 1), max(d["steps"], 1), last["row_bytes"]
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
      # Host CPU per pipelined step (thread time: waits excluded): on a CPU, what the cache
      # path's host work takes from the cores XLA's step runs on.
      "stage_cpu_ms_per_step": {stage: 1e3 * d[f"{stage}_cpu_seconds"] / steps
                                for stage in ("loader", "manager", "writeback")},
      "steps_per_swap_size": last["steps_per_swap_size"],
  }


def _median(values) -> float:
  return float(statistics.median(values))


def validate(config: ml_collections.ConfigDict) -> list[str]:
  """The backends to run, after checking the config's names and counts.

  Raises:
    ConfigError: naming the field of an unknown backend or row optimizer, or a count < 1.
  """
  for field, known in (("backend", (*BACKENDS, "both")),
                       ("embedding_optimizer", tuple(ROW_OPTIMIZERS))):
    if config[field] not in known:
      raise ConfigError(f"config field {field}: unknown {config[field]!r} "
                        f"(known: {', '.join(known)})")
  for field in ("steps", "repeats", "batch_size", "num_fields", "rows_per_field", "chunk_steps"):
    if config[field] < 1:
      raise ConfigError(f"config field {field}: must be >= 1, got {config[field]}")
  if config.workload not in WORKLOADS:
    raise ConfigError(f"config field workload: unknown {config.workload!r} "
                      f"(known: {', '.join(WORKLOADS)})")
  if config.workload == "multihot" and config.floor:
    raise ConfigError("config field floor: the plain-JAX floor is one-hot only; "
                      "run workload=multihot without it")
  return list(BACKENDS) if config.backend == "both" else [config.backend]


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: see `validate`.
  """
  names = validate(config)
  total_steps = 1 + config.warmup + 2 * config.steps
  pool = config.distinct_batches or total_steps
  t = time.perf_counter()
  if config.workload == "multihot":
    spec, batches = multihot_batches(config, pool)
  else:
    spec = DatasetSpec(
        tuple(FieldSpec(f"C{i + 1}", config.rows_per_field) for i in range(config.num_fields)),
        13)
    batches = power_law_batches(spec, config.batch_size, pool, config.zipf)
  gen_seconds = time.perf_counter() - t
  capacity = unique_capacity(config, spec, batches)
  # Rounds interleave the floor and the backends, so each ratio compares runs of one
  # window; the figures are medians over rounds (2 shared cores drift by ~10% a minute).
  pair = None
  if config.floor:
    trainer = build_trainer(workload_config(config, "device", capacity), spec)
    pair = timing.make_floor_pair(trainer, spec, batches, capacity, config)
  rounds = []
  for _ in range(config.repeats):
    entry = {}
    if pair:
      entry["floor"], pair = timing.measure_floor(config, pair)
    entry.update({name: run_backend(config, name, spec, batches, capacity) for name in names})
    if len(names) > 1:
      entry["cache_to_device_ratio"] = (entry["cache"]["examples_per_sec"]
                                        / entry["device"]["examples_per_sec"])
    if pair:
      entry["floor_interleaved"], pair = timing.interleaved_floor_ratio(config, pair)
    rounds.append(entry)
  result = {
      "benchmark": "bench_train", "backend": config.backend, "model": config.model,
      "batch_size": config.batch_size, "embed_dim": config.embed_dim,
      **({"num_fields": config.num_fields, "rows_per_field": config.rows_per_field,
          "zipf": config.zipf} if config.workload == "onehot" else
         {"multihot": dict(config.multihot), "num_fields": spec.num_fields}),
      "embedding_optimizer": config.embedding_optimizer, "timed_steps": config.steps,
      "embedding_dtype": config.embedding.dtype, "split_input": config.split_input,
      "loader_nice": config.loader_nice, "loader_idle": config.loader_idle,
      "host_allocator_tuned": tuned_host_allocator() is not None,
      "xla_cpu_dots": resolve_xla_cpu_dots(config.get("xla_cpu_dots", "auto")),
      "chunk_steps": config.chunk_steps, "distinct_batches": pool, "fresh_batches": pool >= total_steps,
      "data_generation_s": gen_seconds, "devices": jax.device_count(),
      "platform": jax.devices()[0].platform, "repeats": len(rounds), "unique_capacity": capacity,
      "workload": config.workload, "table_rows": spec.total_rows,
      **input_figures(spec, batches, capacity),
  }
  result.update(round_medians(rounds, names, config.batch_size))
  return result


def round_medians(rounds: list[dict], names: list[str], batch_size: int) -> dict:
  """The headline figures over rounds: medians of the rates, the last round's details."""
  first = rounds[-1][names[0]]
  out = {k: first[k] for k in ("mean_unique_per_batch", "compile_s", "final_loss",
                               "state_bytes_per_row")}
  for key in ("examples_per_sec", "device_step_ms", "device_mean_step_ms",
              "end_to_end_to_device_ratio"):
    out[key] = _median([r[names[0]][key] for r in rounds])
  out["device_examples_per_sec"] = batch_size / (out["device_step_ms"] * 1e-3)
  out["median_step_ms"] = out["device_step_ms"]
  if "cache" in first:
    out["cache"] = first["cache"]
    out["cache_rows"] = first["cache"]["cache_rows"]
  if "profile" in first:
    out["profile"] = first["profile"]
  if len(names) > 1:
    out["runs"] = {name: rounds[-1][name] for name in names}  # the last round
    out["cache_to_device_ratio"] = _median([r["cache_to_device_ratio"] for r in rounds])
  if "floor" in rounds[-1]:
    out["floor"] = dict(rounds[-1]["floor"], **{
        k: _median([r["floor"][k] for r in rounds]) for k in ("median_step_ms", "examples_per_sec")})
    out["floor_interleaved"] = {k: _median([r["floor_interleaved"][k] for r in rounds])
                                for k in ("step_ms", "floor_step_ms", "step_to_floor_ratio")}
    out["step_to_floor_ratio"] = out["floor_interleaved"]["step_to_floor_ratio"]
  if len(rounds) > 1:
    out["rounds"] = rounds
  return out


if __name__ == "__main__":
  cli.run_benchmark("bench_train", run)
