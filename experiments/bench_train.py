"""Throughput of the on-device CTR train step on the Foundation workload.

  python -m experiments.bench_train [--steps=60 --warmup=10 --out=bench.json] [--profile]

Workload (issue #2): DeepFM, batch 4096, 26 fields x 100k rows, dim 16, MLP
400-400-400, Adagrad embedding rows + Adam dense params, Zipf(1.1) ids with hot
ids scattered. Host batches are prepared (VSI) on a background thread as in the
trainer; each timed step is dispatched and waited for, and the figure is the
median over timed steps after warm-up. `--profile` also times each phase as its
own jitted function (gather, MLP forward/backward, row update, dense optimizer).
Ends stdout with one JSON line (also written to --out).
"""

from __future__ import annotations

import statistics
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

_STEPS = flags.DEFINE_integer("steps", 40, "Timed steps.")
_WARMUP = flags.DEFINE_integer("warmup", 8, "Untimed steps after compilation.")
_BATCH = flags.DEFINE_integer("batch_size", 4096, "Examples per step.")
_ROWS = flags.DEFINE_integer("rows_per_field", 100_000, "Vocabulary per field.")
_FIELDS = flags.DEFINE_integer("num_fields", 26, "Categorical fields.")
_DIM = flags.DEFINE_integer("embed_dim", 16, "Embedding dimension.")
_ZIPF = flags.DEFINE_float("zipf", 1.1, "Power-law exponent of the ids.")
_MODEL = flags.DEFINE_string("model", "deepfm", "Model name.")
_DISTINCT = flags.DEFINE_integer("distinct_batches", 16, "Distinct host batches cycled through.")
_PROFILE = flags.DEFINE_boolean("profile", False, "Also time each phase separately.")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")
_BACKEND = flags.DEFINE_enum("backend", "device", list(backends.BACKENDS), "Embedding backend.")
_CACHE_ROWS = flags.DEFINE_float("cache_rows", 0.2, "Cache backend: rows, or fraction of the table.")
_LOOKAHEAD = flags.DEFINE_integer("lookahead", 2, "Cache backend: steps planned ahead.")
_UNIQUE_CAP = flags.DEFINE_integer("unique_capacity", 45056, "Padded unique ids per step.")


def workload_config() -> ml_collections.ConfigDict:
  """The Foundation benchmark config (ctr.py defaults + the workload's sizes)."""
  c = ctr_config.get_config()
  c.model.name, c.model.embed_dim, c.model.mlp_dims = _MODEL.value, _DIM.value, (400, 400, 400)
  c.embedding.optimizer, c.optimizer.name = "adagrad", "adam"
  c.train.batch_size = _BATCH.value
  c.train.num_devices = 1
  c.embedding.backend = _BACKEND.value
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


def main(argv):
  del argv
  config = workload_config()
  spec = types.DatasetSpec(
      tuple(types.FieldSpec(f"C{i + 1}", _ROWS.value) for i in range(_FIELDS.value)), 13)
  trainer = loop.build_trainer(config, spec)
  backend = trainer.backend
  batches = power_law_batches(spec, _BATCH.value, _DISTINCT.value, _ZIPF.value)

  def host_batches():
    i = 0
    while True:
      yield batches[i % len(batches)]
      i += 1

  state = trainer.state
  steps, warmup = _STEPS.value, _WARMUP.value
  t_compile = time.perf_counter()
  inputs = backend.train_inputs(host_batches())
  try:
    # Step 1 compiles; the warm-up and the first timed window wait for every step
    # (device-bound step time), the second runs pipelined as the trainer does.
    state, _ = runner.run_steps(trainer.run_step, state, inputs, 1, 1, _BATCH.value)
    t_compile = time.perf_counter() - t_compile
    state, _ = runner.run_steps(trainer.run_step, state, inputs, 2, 1 + warmup, _BATCH.value)
    state, timed = runner.run_steps(trainer.run_step, state, inputs, 2 + warmup, 1 + warmup + steps,
                                    _BATCH.value, wait_each_step=True)
    state, piped = runner.run_steps(trainer.run_step, state, inputs, 2 + warmup + steps,
                                    1 + warmup + 2 * steps, _BATCH.value)
    backend.sync(state)
    stats = backend.stats()
  finally:
    inputs.close()
    backend.close()
  step_times, uniques, m = timed.step_seconds, timed.unique_counts, piped.last_metrics
  median = statistics.median(step_times)
  result = {
      "benchmark": "bench_train", "backend": _BACKEND.value, "model": _MODEL.value,
      "batch_size": _BATCH.value, "num_fields": _FIELDS.value, "rows_per_field": _ROWS.value,
      "embed_dim": _DIM.value, "zipf": _ZIPF.value, "timed_steps": len(step_times),
      "median_step_ms": median * 1e3, "examples_per_sec": _BATCH.value / median,
      "pipelined_examples_per_sec": piped.examples_per_sec,
      "mean_unique_per_batch": float(np.mean(uniques)), "compile_s": t_compile,
      "final_loss": float(m["loss"]), "devices": jax.device_count(),
      "platform": jax.devices()[0].platform,
  }
  if stats:
    result["cache"] = {k: stats[k] for k in ("cache_hit_rate", "h2d_bytes_per_example",
                                            "d2h_bytes_per_example", "loader_seconds",
                                            "manager_seconds", "manager_wait_seconds",
                                            "writeback_seconds", "device_wait_seconds")}
    result["cache_rows"] = backend.num_slots
  if _PROFILE.value and _BACKEND.value == "device":
    db = jax.device_put(backend.prepare_eval(batches[0]))
    result["profile"] = profile_phases(trainer, optimizers.from_config(config.optimizer),
                                       row_optimizers.from_config(config.embedding), state, db)
  report.emit_json_line(result, _OUT.value)


if __name__ == "__main__":
  app.run(main)
