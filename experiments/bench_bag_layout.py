"""Padded bags vs values + offsets on the device: the pooled lookup's time and bytes (#22).

  python -m experiments.bench_bag_layout [--config=experiments/configs/bench_bag_layout.py[:smoke]]

Two ways to give the device a batch of bags, both jitted once:

  padded   vids [B, S] + weights [B, S] (S = sum of the features' capacities, padding
           weighs 0 and points at the spare unique row): gather [B, S, E], weight, and
           sum each feature's static column range -> [B, F, E]. What sfjax trains with
           (`sfjax.models.behavior.pooling`).
  ragged   values + offsets: the T real ids of the batch as vids [T_cap] + weights
           [T_cap] + segment ids [T_cap] (example * F + feature), T_cap = T rounded up
           to a multiple of B*S/`buckets` (so few shapes compile): gather [T_cap, E],
           weight, `segment_sum` -> [B*F, E], divided by the per-segment mean / sqrtn norm.

Each times the forward + the gradient w.r.t. the unique rows (the sparse step's
lookup half) on fresh batches of the planted multi-hot data (`data.format=multihot`,
ctr.py:multihot's profile: ~105 real ids of 292 columns per example), and reports the
host->device bytes per example of each layout's index arrays. Ends with one JSON line.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.data import MultihotCTR
from sfjax.embedding import prepare_batch
from sfjax.models import pool_features


def ragged_inputs(layout, vids: np.ndarray, weights: np.ndarray, buckets: int):
  """(vids [T_cap], weights [T_cap], segments [T_cap]) of the real ids, T_cap bucketed."""
  batch, columns = vids.shape
  real = weights != 0
  example, column = np.nonzero(real)
  segments = (example * layout.num_features + layout.column_features[column]).astype(np.int32)
  total = int(real.sum())
  step = -(-batch * columns // buckets)
  cap = -(-max(total, 1) // step) * step
  pad = cap - total
  return (np.concatenate([vids[real], np.zeros(pad, np.int32)]),
          np.concatenate([weights[real], np.zeros(pad, np.float32)]),
          np.concatenate([segments, np.full(pad, batch * layout.num_features, np.int32)]))


def _feature_norms(layout) -> tuple[np.ndarray, np.ndarray]:
  """[F] 0/1 masks: features pooled by mean (sequences too) and by sqrtn."""
  kinds = [("mean" if f.kind == "sequence" else f.pooling) if f.kind != "one_hot" else "sum"
           for f in layout.features]
  return (np.array([k == "mean" for k in kinds], np.float32),
          np.array([k == "sqrtn" for k in kinds], np.float32))


def ragged_pool(layout, rows, vids, weights, segments, batch: int):
  """The ragged ids pooled per (example, feature) -> `[B, F, E]`, as `pool_features`."""
  num = batch * layout.num_features + 1
  emb = jnp.take(rows, vids, axis=0) * weights[:, None]
  total = jax.ops.segment_sum(emb, segments, num_segments=num)[:-1]
  w1 = jax.ops.segment_sum(weights, segments, num_segments=num)[:-1]
  w2 = jnp.sqrt(jax.ops.segment_sum(weights * weights, segments, num_segments=num)[:-1])
  mean, sqrtn = (jnp.tile(m, batch) for m in _feature_norms(layout))
  norm = mean * w1 + sqrtn * w2 + (1.0 - mean - sqrtn)
  safe = jnp.where(norm > 0, norm, 1.0)
  return (total / safe[:, None]).reshape(batch, layout.num_features, -1)


def _time(fn, args_list, reps: int) -> float:
  jax.block_until_ready(fn(*args_list[0]))  # compile
  times = []
  for i in range(reps):
    args = args_list[i % len(args_list)]
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def run(config: ml_collections.ConfigDict) -> dict:
  """Median ms per batch of both layouts' pooled lookup + row gradient; bytes per example."""
  data_cfg = ctr_config.get_config(config.variant).data.multihot
  data = MultihotCTR(data_cfg, 0)
  layout, spec, b = data.layout, data.spec, config.batch_size
  width = config.embed_dim
  padded_args, ragged_args, reals, shapes = [], [], [], set()
  for i in range(config.batches):
    batch = data.generate_rows("train", i * b, b).to_batch()
    db, n = prepare_batch(batch, spec.column_offsets, b * spec.num_columns + 1,
                              spec.total_rows, spec.column_rows)
    rows = jax.random.normal(jax.random.key(i), (db.rows.shape[0], width))
    padded_args.append((rows, jnp.asarray(db.vids), jnp.asarray(db.weights)))
    rv, rw, rs = ragged_inputs(layout, db.vids, db.weights, config.buckets)
    ragged_args.append((rows, jnp.asarray(rv), jnp.asarray(rw), jnp.asarray(rs)))
    reals.append(int((batch.weights != 0).sum()))
    shapes.add(rv.shape[0])

  def padded_loss(rows, vids, weights):
    return jnp.sum(pool_features(layout, jnp.take(rows, vids, axis=0), weights) ** 2)

  def ragged_loss(rows, vids, weights, segments):
    return jnp.sum(ragged_pool(layout, rows, vids, weights, segments, b) ** 2)

  padded = jax.jit(jax.value_and_grad(padded_loss))
  ragged = jax.jit(jax.value_and_grad(ragged_loss))
  same = np.allclose(padded(*padded_args[0])[0], ragged(*ragged_args[0])[0], rtol=1e-4)
  padded_s = _time(padded, padded_args, config.reps)
  ragged_s = _time(ragged, ragged_args, config.reps)
  ids = float(np.mean(reals)) / b
  t_cap = float(np.mean([a[1].shape[0] for a in ragged_args])) / b
  return {
      "benchmark": "bench_bag_layout", "batch_size": b, "embed_dim": width,
      "id_columns": spec.num_columns, "ids_per_example": ids,
      "padded_ms": padded_s * 1e3, "ragged_ms": ragged_s * 1e3,
      "padded_to_ragged_time": padded_s / ragged_s,
      # index arrays per example: padded vids + weights (int32 + float32 per column);
      # ragged vids + weights + segment ids per bucketed real id
      "padded_bytes_per_example": 8.0 * spec.num_columns,
      "ragged_bytes_per_example": 12.0 * t_cap,
      "ragged_shapes_compiled": len(shapes), "platform": jax.devices()[0].platform,
      "same_loss": bool(same),
  }


if __name__ == "__main__":
  cli.run_benchmark("bench_bag_layout", run)
