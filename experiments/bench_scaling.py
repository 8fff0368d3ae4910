"""Scale-out of the MixCache over devices: replicated vs row-sharded cache, VSI on and off.

  python -m experiments.bench_scaling [--config=experiments/configs/bench_scaling.py[:smoke]]
      [--config.devices=1,2,4,8 --config.shardings=replicated,row --config.steps=24
       --config.batch_size=1024 --config.out=scaling.json]

For each device count D, cache sharding and VSI setting, the trainer (`loop.build_trainer`
and the step runner `runner.run_steps`, the cache pipeline included) trains `steps`
steps of synthetic Criteo-like data with the same per-device `embedding.cache_rows`, and
the JSON records:

  examples_per_sec             end to end (step 1, the compile, excluded)
  collective_*_bytes_per_step  from the compiled HLO of every program the run used,
                               weighted by its steps: operand bytes per device and the
                               bandwidth-optimal ring bytes per device
                               (`sfjax.parallel.collectives`)
  h2d_bytes_per_step           bytes device_put per step over all devices (batch + swap;
                               a replicated swap counts once per device)
  cache_capacity_rows          distinct rows the cache holds (replicated C, row-sharded D*C)
  max_loss_diff / max_table_diff   against the first configuration (same data): the
                               correctness check (float tolerance; 0 when D = 1 equals it)

`vsi=off`: every step exchanges `U = B*F` rows (the unique set padded to one row per
id occurrence, as without deduplication) instead of its bucketed unique count; the math
is unchanged, so the correctness columns still apply. Host->device fills are the cache's
misses either way (the no-VSI host traffic of a cache-less parameter server, B*F rows
per step, is in bench_cache).

Embedding exchange alone (`exchange`, row-sharded runs with VSI): the trainer's owner
blocks (`all_gather` of each owner's `[Ud, E]` block + `psum_scatter` of the `[D*Ud, E]`
gradient, Ud = the busiest owner's rows, bucketed) and the alternative it replaced (an
owner-masked gather + `psum` lookup and an all-reduced `[U, E]` gradient, U bucketed),
both compiled on the run's real shapes and counted the same way.

On fake CPU devices (`--xla_force_host_platform_device_count`, set here; it concerns
only the CPU platform) this measures volume and correctness, not speed; on a GPU machine
the same command runs on `jax.devices('gpu')` (the default backend), device counts above
the GPUs visible are skipped. A step whose bucket shapes were not seen before compiles
inside the timed window: take `steps` well above the few buckets for rates.
`run(config)` returns the figures; the command prints one line per configuration to
stderr and ends stdout with the figures as one JSON line (also written to `config.out`).
In a process whose JAX backend already started (a test, a notebook), the fake CPU
devices are the ones it started with.

Per-process input (issue #24; `scaling_projection`, `--config.processes=1,2,4`, () to
skip): local `jax.distributed` jobs of P processes over `process_devices` CPU devices, the
device backend with a row-sharded table, each process reading only its own rows: end-to-end
and input examples/s, exchange bytes per step (host input exchange, device collectives),
table capacity; then the cost model (`sfjax.parallel.scaling_model`) calibrated on P = 1,
its predicted / measured ratio for each P, and its projection to `project_devices`
H100-class GPUs (JSON keys `processes`, `model_check`, `projection`; `--config.plot=X.png`
draws it). Results and assumptions: docs/scaling.md.

Old flag -> config field: each `--X` is `--config.X` (devices, shardings, vsi, steps,
batch_size, cardinality_scale, embed_dim, mlp_dims, cache_rows, out); `devices` and
`mlp_dims` are tuples (`--config.devices=1,2`), `shardings` and `vsi` comma-separated
strings.
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import PartitionSpec as P

from experiments import cli
from experiments import scaling_projection as per_process
from experiments.configs import ctr
from sfjax.core import ConfigError, device_count_flag, fake_device_env, guard_launch_threads
from sfjax.data import make_dataset
from sfjax.embedding import bucket_for, device_bytes, swap_buckets
from sfjax.parallel import collective_bytes
from sfjax.train import build_trainer, run_steps


def _use_fake_cpu_devices(count: int) -> None:
  """Gives the CPU backend `count` devices (unless XLA_FLAGS already sets a count) and
  enough launch threads (`sfjax.core.host_devices`); call before JAX starts a backend. A
  GPU, when present, stays the default backend (the flag only concerns the CPU platform)."""
  if device_count_flag(os.environ.get("XLA_FLAGS", "")) is None:
    os.environ["XLA_FLAGS"] = fake_device_env(count)["XLA_FLAGS"]
  guard_launch_threads()


def train_config(config: ml_collections.ConfigDict, num_devices: int,
                 sharding: str) -> ml_collections.ConfigDict:
  """The trainer's config (ctr.py's smoke variant + the benchmark's sizes) of one layout."""
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train = max(config.steps * config.batch_size, 4096)
  c.data.synthetic.num_eval = 1024
  c.data.synthetic.cardinality_scale = config.cardinality_scale
  c.model.name, c.model.embed_dim = "deepfm", config.embed_dim
  c.model.mlp_dims = tuple(int(x) for x in config.mlp_dims)
  c.embedding.backend, c.embedding.cache_sharding = "cache", sharding
  c.embedding.optimizer, c.embedding.learning_rate = "rowwise_adagrad", 0.05
  c.embedding.lookahead = config.get("lookahead", 2)  # 1: no planning ahead (bench_ablation)
  c.train.batch_size, c.train.num_devices = config.batch_size, num_devices
  c.train.steps = c.train.eval_every = c.train.log_every = config.steps
  return c


def exchange_bytes(mesh, steps: list[dict], unique_capacity: int, width: int) -> dict[str, float]:
  """Ring bytes per step of the row-sharded embedding exchange alone, on the run's real
  shapes: owner blocks (all_gather + psum_scatter, what the trainer runs) versus an
  owner-masked gather + psum lookup and an all-reduced `[U, E]` gradient."""
  d = mesh.size
  unique_buckets = swap_buckets(unique_capacity)
  spec = P("data")

  def psum_exchange(u):
    f = jax.shard_map(lambda x, g: (jax.lax.psum(x, "data"), jax.lax.psum(g, "data")),
                      mesh=mesh, in_specs=(spec, spec), out_specs=(P(), P()))
    shape = jax.ShapeDtypeStruct((d * u, width), jnp.float32)
    return f, (shape, shape)

  def blocked_exchange(ud):
    f = jax.shard_map(lambda x, g: (jax.lax.all_gather(x, "data", tiled=True),
                                    jax.lax.psum_scatter(g, "data", tiled=True)),
                      mesh=mesh, in_specs=(spec, spec), out_specs=(P(), spec), check_vma=False)
    return f, (jax.ShapeDtypeStruct((d * ud, width), jnp.float32),
               jax.ShapeDtypeStruct((d * d * ud, width), jnp.float32))

  cache = {}

  def ring(kind, size):
    if (kind, size) not in cache:
      f, shapes = (psum_exchange if kind == "psum" else blocked_exchange)(size)
      text = jax.jit(f).lower(*shapes).compile().as_text()
      cache[(kind, size)] = collective_bytes(text, d)["ring_bytes"]
    return cache[(kind, size)]

  blocked = [ring("blocked", s["rows"].size // d) for s in steps]
  psum = [ring("psum", bucket_for(s["unique"], unique_buckets)) for s in steps]
  return {"owner_blocks_allgather_reducescatter_ring_bytes_per_step": float(np.mean(blocked)),
          "psum_lookup_allreduce_grad_ring_bytes_per_step": float(np.mean(psum))}


def run_config(bench: ml_collections.ConfigDict, num_devices: int, sharding: str, vsi: bool,
               cache_rows: int):
  """Trains one configuration; returns its figures and (losses, host table values)."""
  config = train_config(bench, num_devices, sharding)
  config.embedding.cache_rows = float(cache_rows)
  data = make_dataset(config.data, config.seed)
  trainer = build_trainer(config, data.spec)
  backend = trainer.backend
  backend.bucket_unique = vsi
  first_inputs, steps = {}, []  # program key -> its first inputs; per consumed step: figures

  def recorded(inputs):  # the steps the runner consumed (not the steps planned ahead)
    for x in inputs:
      key = f"U{x.batch.rows.shape[0]}/F{x.swap.fill_slots.shape[-1]}"
      first_inputs.setdefault(key, x)
      steps.append({"key": key, "rows": np.asarray(x.batch.rows),
                    "put_bytes": device_bytes((x.batch, x.swap)),
                    "fills": x.plan.num_fills, "hits": x.plan.hits, "unique": x.plan.num_unique})
      yield x

  inputs = backend.train_inputs(data.train_batches(config.train.batch_size, config.seed))
  try:
    steps_iter, state, warm_losses = recorded(inputs), trainer.state, []
    warm = int(bench.get("warmup_steps", 0))  # untimed first steps (bench_ablation): compiles
    if warm:
      state, warm_window = run_steps(trainer.run_step, state, steps_iter, 1, warm,
                                     config.train.batch_size)
      warm_losses = list(warm_window.losses)
    t = time.perf_counter()
    state, window = run_steps(trainer.run_step, state, steps_iter, warm + 1,
                              config.train.steps, config.train.batch_size)
    wall = time.perf_counter() - t
    per_shape = {
        key: collective_bytes(
            trainer.run_step.jitted.lower(state, x.batch, x.swap).compile().as_text(), num_devices)
        for key, x in first_inputs.items()}
    d2h_per_example = backend.stats()["d2h_bytes_per_example"]  # before the final flush
    backend.sync(state)
    values, _ = backend.host_table.read_all()
  finally:
    inputs.close()
    backend.close()
  coll = {k: float(np.mean([per_shape[s["key"]][k] for s in steps]))
          for k in ("operand_bytes", "ring_bytes", "count")}

  def mean(field):
    return float(np.mean([s[field] for s in steps]))

  result = {
      "devices": num_devices, "cache_sharding": sharding, "vsi": "on" if vsi else "off",
      "examples_per_sec": window.examples_per_sec, "wall_seconds": wall,
      "collective_operand_bytes_per_step": coll["operand_bytes"],
      "collective_ring_bytes_per_step": coll["ring_bytes"],
      "collectives_per_step": coll["count"],
      "h2d_bytes_per_step": mean("put_bytes"),
      "d2h_bytes_per_example": d2h_per_example,
      "fill_rows_per_step": mean("fills"),
      "cache_hit_rate": sum(s["hits"] for s in steps) / max(sum(s["unique"] for s in steps), 1),
      "cache_capacity_rows": backend.capacity_rows,
      "cache_rows_per_device": cache_rows,
      "mean_unique_per_step": mean("unique"),
      "mean_exchanged_rows_per_step": float(np.mean([s["rows"].size for s in steps])),
      "programs": len(per_shape),
      "final_loss": float(window.losses[-1]),
  }
  if sharding == "row" and num_devices > 1 and vsi:
    result["exchange"] = exchange_bytes(trainer.mesh, steps, backend.capacity, trainer.width)
  return result, (np.asarray(warm_losses + list(window.losses)), values)


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: for an unknown cache sharding or VSI setting, or no device count.
  """
  shardings = cli.split_names(config.shardings, "shardings", ("replicated", "row"))
  vsi_settings = cli.split_names(config.vsi, "vsi", ("on", "off"))
  devices = sorted({int(x) for x in config.devices})
  if not devices or devices[0] < 1:
    raise ConfigError(f"config field devices: must list positive integers, got {config.devices}")
  per_process.check_config(config)
  _use_fake_cpu_devices(max(devices))

  available = jax.local_device_count()
  spec = make_dataset(train_config(config, 1, "replicated").data, 0).spec
  cache_rows = config.cache_rows or 2 * config.batch_size * spec.num_fields
  results, skipped, baseline = [], [], None
  for vsi in [v == "on" for v in vsi_settings]:
    for sharding in shardings:
      for d in devices:
        if d > available or config.batch_size % d:
          skipped.append({"devices": d, "cache_sharding": sharding,
                          "reason": f"{available} devices visible, batch {config.batch_size}"})
          continue
        result, (losses, values) = run_config(config, d, sharding, vsi, cache_rows)
        if baseline is None:
          baseline = (losses, values)
        result["max_loss_diff"] = float(np.max(np.abs(losses - baseline[0])))
        result["max_table_diff"] = float(np.max(np.abs(values - baseline[1])))
        print(f"D={d} {sharding:10s} vsi={result['vsi']:3s} {result['examples_per_sec']:9.0f} ex/s "
              f"coll ring {result['collective_ring_bytes_per_step'] / 1e6:8.3f} MB/step "
              f"h2d {result['h2d_bytes_per_step'] / 1e6:8.3f} MB/step "
              f"capacity {result['cache_capacity_rows']} rows "
              f"dloss {result['max_loss_diff']:.2e} dtable {result['max_table_diff']:.2e}",
              file=sys.stderr)
        results.append(result)
  out = {
      "benchmark": "bench_scaling", "platform": jax.devices()[0].platform,
      "devices_visible": available, "batch_size": config.batch_size, "steps": config.steps,
      "num_fields": spec.num_fields, "table_rows": spec.total_rows,
      "embed_width": config.embed_dim + 1, "row_optimizer": "rowwise_adagrad",
      "results": results, "skipped": skipped}
  if config.processes:
    out.update(per_process.run_processes(config, train_config(config, 0, "replicated")))
  return out


if __name__ == "__main__":
  cli.run_benchmark("bench_scaling", run)
