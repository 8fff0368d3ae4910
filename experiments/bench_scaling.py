"""Scale-out of the MixCache over devices: replicated vs row-sharded cache, VSI on and off.

  python -m experiments.bench_scaling [--devices=1,2,4,8 --shardings=replicated,row
      --steps=24 --batch_size=1024 --out=scaling.json]

For each device count D, cache sharding and VSI setting, the trainer (`loop.build_trainer`
and the step runner `runner.run_steps`, the cache pipeline included) trains `--steps`
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
inside the timed window: take `--steps` well above the few buckets for rates.
Ends stdout with one JSON line (also written to --out).
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from jax.sharding import PartitionSpec as P

from experiments import report
from experiments.configs import ctr
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import pipeline
from sfjax.parallel import collectives
from sfjax.train import loop, runner

_DEVICES = flags.DEFINE_list("devices", ["1", "2", "4", "8"], "Device counts of the mesh.")
_SHARDINGS = flags.DEFINE_list("shardings", ["replicated", "row"], "embedding.cache_sharding values.")
_VSI = flags.DEFINE_list("vsi", ["on", "off"], "on: bucketed unique rows; off: U = B*F rows.")
_STEPS = flags.DEFINE_integer("steps", 24, "Train steps per configuration.")
_BATCH = flags.DEFINE_integer("batch_size", 1024, "Examples per step (divisible by every D).")
_SCALE = flags.DEFINE_float("cardinality_scale", 0.01, "Multiplies the Criteo per-field cardinalities.")
_DIM = flags.DEFINE_integer("embed_dim", 16, "Embedding dim (DeepFM rows hold dim + 1 floats).")
_MLP = flags.DEFINE_list("mlp_dims", ["64"], "DeepFM MLP widths.")
_CACHE_ROWS = flags.DEFINE_integer("cache_rows", 0, "Rows per device; 0 = lookahead x B x F "
                                   "(the smallest a replicated cache may be).")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")


def _use_fake_cpu_devices(count: int) -> None:
  """Gives the CPU backend `count` devices; call before JAX starts a backend. A GPU, when
  present, stays the default backend (the flag only concerns the CPU platform)."""
  flag = f"--xla_force_host_platform_device_count={count}"
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


def _config(num_devices: int, sharding: str):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train = max(_STEPS.value * _BATCH.value, 4096)
  c.data.synthetic.num_eval = 1024
  c.data.synthetic.cardinality_scale = _SCALE.value
  c.model.name, c.model.embed_dim = "deepfm", _DIM.value
  c.model.mlp_dims = tuple(int(x) for x in _MLP.value)
  c.embedding.backend, c.embedding.cache_sharding = "cache", sharding
  c.embedding.optimizer, c.embedding.learning_rate = "rowwise_adagrad", 0.05
  c.embedding.lookahead = 2
  c.train.batch_size, c.train.num_devices = _BATCH.value, num_devices
  c.train.steps = c.train.eval_every = c.train.log_every = _STEPS.value
  return c


def exchange_bytes(mesh, steps: list[dict], unique_capacity: int, width: int) -> dict[str, float]:
  """Ring bytes per step of the row-sharded embedding exchange alone, on the run's real
  shapes: owner blocks (all_gather + psum_scatter, what the trainer runs) versus an
  owner-masked gather + psum lookup and an all-reduced `[U, E]` gradient."""
  d = mesh.size
  unique_buckets = pipeline.swap_buckets(unique_capacity)
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
      cache[(kind, size)] = collectives.collective_bytes(text, d)["ring_bytes"]
    return cache[(kind, size)]

  blocked = [ring("blocked", s["rows"].size // d) for s in steps]
  psum = [ring("psum", pipeline.bucket_for(s["unique"], unique_buckets)) for s in steps]
  return {"owner_blocks_allgather_reducescatter_ring_bytes_per_step": float(np.mean(blocked)),
          "psum_lookup_allreduce_grad_ring_bytes_per_step": float(np.mean(psum))}


def run_config(num_devices: int, sharding: str, vsi: bool, cache_rows: int):
  """Trains one configuration; returns its figures and (losses, host table values)."""
  config = _config(num_devices, sharding)
  config.embedding.cache_rows = float(cache_rows)
  data = dataset_lib.make_dataset(config.data, config.seed)
  trainer = loop.build_trainer(config, data.spec)
  backend = trainer.backend
  backend.bucket_unique = vsi
  first_inputs, steps = {}, []  # program key -> its first inputs; per consumed step: figures

  def recorded(inputs):  # the steps the runner consumed (not the steps planned ahead)
    for x in inputs:
      key = f"U{x.batch.rows.shape[0]}/F{x.swap.fill_slots.shape[-1]}"
      first_inputs.setdefault(key, x)
      steps.append({"key": key, "rows": np.asarray(x.batch.rows),
                    "put_bytes": pipeline.device_bytes((x.batch, x.swap)),
                    "fills": x.plan.num_fills, "hits": x.plan.hits, "unique": x.plan.num_unique})
      yield x

  inputs = backend.train_inputs(data.train_batches(config.train.batch_size, config.seed))
  try:
    t = time.perf_counter()
    state, window = runner.run_steps(trainer.run_step, trainer.state, recorded(inputs), 1,
                                     _STEPS.value, config.train.batch_size)
    wall = time.perf_counter() - t
    per_shape = {
        key: collectives.collective_bytes(
            trainer.run_step.jitted.lower(state, x.batch, x.swap).compile().as_text(), num_devices)
        for key, x in first_inputs.items()}
    backend.sync(state)
    values, _ = backend.host_table.read_all()
  finally:
    inputs.close()
    backend.close()
  coll = {k: float(np.mean([per_shape[s["key"]][k] for s in steps]))
          for k in ("operand_bytes", "ring_bytes", "count")}
  mean = lambda field: float(np.mean([s[field] for s in steps]))
  result = {
      "devices": num_devices, "cache_sharding": sharding, "vsi": "on" if vsi else "off",
      "examples_per_sec": window.examples_per_sec, "wall_seconds": wall,
      "collective_operand_bytes_per_step": coll["operand_bytes"],
      "collective_ring_bytes_per_step": coll["ring_bytes"],
      "collectives_per_step": coll["count"],
      "h2d_bytes_per_step": mean("put_bytes"),
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
  return result, (np.asarray(window.losses), values)


def main(argv):
  del argv
  devices = sorted({int(x) for x in _DEVICES.value})
  _use_fake_cpu_devices(max(devices))

  available = jax.local_device_count()
  spec = dataset_lib.make_dataset(_config(1, "replicated").data, 0).spec
  cache_rows = _CACHE_ROWS.value or 2 * _BATCH.value * spec.num_fields
  results, skipped, baseline = [], [], None
  for vsi in [v == "on" for v in _VSI.value]:
    for sharding in _SHARDINGS.value:
      for d in devices:
        if d > available or _BATCH.value % d:
          skipped.append({"devices": d, "cache_sharding": sharding,
                          "reason": f"{available} devices visible, batch {_BATCH.value}"})
          continue
        result, (losses, values) = run_config(d, sharding, vsi, cache_rows)
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
  report.emit_json_line({
      "benchmark": "bench_scaling", "platform": jax.devices()[0].platform,
      "devices_visible": available, "batch_size": _BATCH.value, "steps": _STEPS.value,
      "num_fields": spec.num_fields, "table_rows": spec.total_rows,
      "embed_width": _DIM.value + 1, "row_optimizer": "rowwise_adagrad",
      "results": results, "skipped": skipped}, _OUT.value)


if __name__ == "__main__":
  app.run(main)
