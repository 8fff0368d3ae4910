"""SFCTR's ablation reproduced: what each mechanism of the cache path adds, on one workload.

  python -m experiments.bench_ablation [--config=experiments/configs/bench_ablation.py[:smoke]]
      [--config.steps=40 --config.batch_size=256 --config.plot=docs/ablation.png]

One workload (synthetic Criteo-like data with Zipf ids, DeepFM, row-wise Adagrad rows,
a device cache of `cache_fraction` of the table), five trainers, each adding one
mechanism of ScaleFreeCTR (Guo et al. 2021) to the one before:

  a host_ps     host parameter server: every step pulls one row per id occurrence from
                the host table (no dedup), the device computes the loss and the row
                gradients, the host sums them per id and updates the rows in numpy
                (`sfjax.embedding.host_ps`, the same rule as the device row optimizer)
  b +cache      MixCache (`embedding.backend=cache`): rows stay in a device cache, only
                misses move; VSI off (`bench_scaling`'s vsi=off: every step exchanges
                B*F rows, as without dedup)
  c +vsi        VSI dedup on: each step moves its (bucketed) unique rows
  d +device_sync  the row-sharded cache over `devices` devices: rows exchanged with
                collectives (all_gather / psum_scatter) instead of one host-fed device
  e +pipeline   planning and fills run ahead of the device (`embedding.lookahead=2`);
                rows a-d use lookahead=1, so step t's plan waits for step t-1's write-back

Rows b-e run `bench_scaling.run_config` (the real trainer and cache pipeline); a-c run on
one device (no collectives: aggregation is on the host), d-e on `devices` (fake CPU
devices without an accelerator: there they measure volume, not speed). Per row:
examples/s end to end (fresh batches, host work included; the first `warmup_steps`,
which compile the cache step's bucket shapes, and step 1 are not timed),
host->device and device->host bytes per example, collective ring bytes per step (from
the compiled HLO, `sfjax.parallel.collectives`), cache hit rate (a: 0, nothing is
cached) and the final train loss (a and c train the same model on the same batches,
so their losses agree to float tolerance). Prints a table to stderr and ends stdout
with one JSON line holding `rows`.
"""

from __future__ import annotations

import itertools
import math
import sys
import time

import jax
import ml_collections
import numpy as np

from experiments import bench_scaling, cli
from sfjax.core import DeviceBatch
from sfjax.data import make_dataset
from sfjax.embedding import (
  apply_row_grads,
  device_bytes,
  global_row_ids,
  host_row_optimizer_from_config,
  pull_rows,
)
from sfjax.train import (
  build_trainer,
  dense_optimizer_from_config,
  dense_update,
  loss_and_grads,
)

ROWS = {"a": "host_ps", "b": "+cache", "c": "+vsi", "d": "+device_sync", "e": "+pipeline"}
# row -> (VSI on, devices > 1, lookahead) of the cache trainer (rows b-e).
_CACHE_ROWS = {"b": (False, False, 1), "c": (True, False, 1), "d": (True, True, 1),
               "e": (True, True, 2)}


def cache_rows_per_device(config: ml_collections.ConfigDict, table_rows: int, devices: int) -> int:
  """`embedding.cache_rows` per device for a cache of `cache_fraction` of the table in all."""
  return math.ceil(config.cache_fraction * table_rows / devices)


def make_host_ps_step(graphdef, tx, l2):
  """The device half of a host-PS step: (params, opt_state, values [N, E], batch) ->
  (params, opt_state, loss, row grads [N, E]); the rows are updated on the host."""

  def step(params, opt_state, values, batch: DeviceBatch):
    (loss, _), (param_grads, row_grads) = loss_and_grads(graphdef, params, values, batch, l2)
    params, opt_state = dense_update(tx, param_grads, opt_state, params)
    return params, opt_state, loss, row_grads

  return jax.jit(step, donate_argnums=(0, 1))


def run_host_ps(config: ml_collections.ConfigDict, cache_rows: int) -> tuple[dict, np.ndarray]:
  """Row a: trains `steps` steps through the host parameter server; (figures, losses)."""
  tc = bench_scaling.train_config(config, 1, "replicated")
  tc.embedding.cache_rows = float(cache_rows)
  data = make_dataset(tc.data, tc.seed)
  trainer = build_trainer(tc, data.spec)  # the model, dense state and seeded host table
  table, spec, b = trainer.backend.host_table, data.spec, tc.train.batch_size
  opt = host_row_optimizer_from_config(tc.embedding)
  step = make_host_ps_step(trainer.graphdef, dense_optimizer_from_config(
      tc.optimizer), tc.embedding.l2)
  params, opt_state = trainer.state.params, trainer.state.opt_state
  n = b * spec.num_fields
  positions = np.arange(n, dtype=np.int32)
  losses, h2d, d2h, t0 = [], 0, 0, 0.0
  first_timed = max(config.warmup_steps, 1) + 1
  batches = data.train_batches(b, tc.seed)
  try:
    for t, batch in enumerate(itertools.islice(batches, config.steps), 1):
      if t == first_timed:
        t0 = time.perf_counter()  # step 1 (the compile) and the warm-up are not timed
      ids = global_row_ids(batch.ids, spec.column_offsets, table.num_rows,
                               column_rows=spec.column_rows).reshape(-1)  # [N]: no dedup
      host = DeviceBatch(positions, positions.reshape(b, -1), batch.dense, batch.labels,
                         batch.mask)
      values, device_batch = jax.device_put((pull_rows(table, ids), host))
      h2d += device_bytes((values, device_batch))
      params, opt_state, loss, row_grads = step(params, opt_state, values, device_batch)
      grads = np.asarray(row_grads)  # push: [N, E] back to the host
      d2h += grads.nbytes + 4
      apply_row_grads(table, opt, ids, grads, t)
      losses.append(float(loss))
    wall = time.perf_counter() - t0
  finally:
    trainer.backend.close()
  steps = len(losses)
  return {"name": ROWS["a"], "examples_per_sec": (steps - first_timed + 1) * b / max(wall, 1e-9),
          "h2d_bytes_per_example": h2d / (steps * b), "d2h_bytes_per_example": d2h / (steps * b),
          "collective_bytes_per_step": 0.0, "hit_rate": 0.0, "loss": losses[-1],
          "devices": 1}, np.asarray(losses)


def run_cache_row(config: ml_collections.ConfigDict, key: str, table_rows: int
                  ) -> tuple[dict, np.ndarray]:
  """Rows b-e: one cache trainer of `bench_scaling`; (figures, losses)."""
  vsi_on, multi, lookahead = _CACHE_ROWS[key]
  devices = config.devices if multi else 1
  bench = ml_collections.ConfigDict(config.to_dict())
  bench.lookahead = lookahead
  result, (losses, _) = bench_scaling.run_config(
      bench, devices, "row" if multi else "replicated", vsi_on,
      cache_rows_per_device(config, table_rows, devices))
  b = config.batch_size
  return {"name": ROWS[key], "examples_per_sec": result["examples_per_sec"],
          "h2d_bytes_per_example": result["h2d_bytes_per_step"] / b,
          "d2h_bytes_per_example": result["d2h_bytes_per_example"],
          "collective_bytes_per_step": result["collective_ring_bytes_per_step"],
          "hit_rate": result["cache_hit_rate"], "loss": result["final_loss"],
          "devices": devices}, losses


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: an unknown row name.
  """
  keys = cli.split_names(config.rows, "rows", tuple(ROWS))
  bench_scaling._use_fake_cpu_devices(config.devices)
  table_rows = make_dataset(bench_scaling.train_config(config, 1, "replicated").data, 0
                            ).spec.total_rows
  rows, losses = [], {}
  for key in sorted(keys):
    if key == "a":
      row, losses[key] = run_host_ps(config, cache_rows_per_device(config, table_rows, 1))
    else:
      row, losses[key] = run_cache_row(config, key, table_rows)
    rows.append(row)
  result = {"benchmark": "bench_ablation", "platform": jax.devices()[0].platform,
            "devices_visible": jax.local_device_count(), "batch_size": config.batch_size,
            "steps": config.steps, "table_rows": table_rows,
            "cache_fraction": config.cache_fraction, "row_optimizer": "rowwise_adagrad",
            "rows": rows}
  if "a" in losses and "c" in losses:  # the host PS and the cache path train the same model
    result["max_loss_diff_host_ps_vs_cache"] = float(np.max(np.abs(losses["a"] - losses["c"])))
  if config.plot:
    result["plot"] = plot_ablation(rows, config.plot)
  return result


def plot_ablation(rows: list[dict], path: str) -> str:
  """Bar charts of the rows' examples/s and host<->device bytes per example; writes `path`."""
  from matplotlib import pyplot as plt  # on demand: only a run with `plot` needs matplotlib

  from sfjax.viz import save_figure

  names = [r["name"] for r in rows]
  x = np.arange(len(rows))
  fig, (ax_rate, ax_bytes) = plt.subplots(1, 2, figsize=(10, 3.8))
  ax_rate.bar(x, [r["examples_per_sec"] for r in rows], color="tab:blue")
  ax_rate.set(ylabel="examples / s (end to end)", title="throughput")
  for offset, key, label in ((-0.2, "h2d_bytes_per_example", "host->device"),
                             (0.2, "d2h_bytes_per_example", "device->host")):
    ax_bytes.bar(x + offset, [r[key] for r in rows], width=0.4, label=label)
  ax_bytes.set(ylabel="bytes / example", title="host<->device traffic")
  ax_bytes.legend()
  for ax in (ax_rate, ax_bytes):
    ax.set_xticks(x, names, rotation=20)
  fig.tight_layout()
  return save_figure(fig, path)


def print_table(result: dict) -> None:
  """The rows as a table (stderr)."""
  print(f"{'row':14s} {'ex/s':>9s} {'h2d B/ex':>10s} {'d2h B/ex':>10s} {'coll B/step':>12s} "
        f"{'hit':>6s} {'loss':>8s}", file=sys.stderr)
  for r in result["rows"]:
    print(f"{r['name']:14s} {r['examples_per_sec']:9.0f} {r['h2d_bytes_per_example']:10.1f} "
          f"{r['d2h_bytes_per_example']:10.1f} {r['collective_bytes_per_step']:12.0f} "
          f"{r['hit_rate']:6.3f} {r['loss']:8.5f}", file=sys.stderr)


if __name__ == "__main__":
  cli.run_benchmark("bench_ablation", run, print_table)
