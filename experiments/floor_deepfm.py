"""The plain-JAX floor: the smallest DeepFM train step on bench_train's workload.

No framework code (jax and numpy only), so it bounds from below what our trainer's step
costs: one jitted, donated step that gathers the batch's unique rows from a `[V, D+1]`
table (D embedding values + the first-order weight), runs FM + MLP(400, 400, 400), takes
the gradient with respect to the `[U, D+1]` gathered rows only (never a dense table
gradient), applies row-wise Adagrad to them (one accumulator per row, as TorchRec's fused
row-wise Adagrad) and scatters them back; the dense parameters use Adam. Unique ids come
from the host (`np.unique`), padded to a fixed capacity with the out-of-range row V, which
gathers read as zeros and scatters drop.

`experiments.bench_train` (`config.floor=True`) measures this step on the same batches
and the same unique capacity as the trainer's, and alternates the two step by step:
compare their ratio, not absolute times. Row update, per unique row r with gradient g_r:
  a_r <- a_r + mean(g_r ** 2);  w_r <- w_r - ROW_LR * g_r / (sqrt(a_r) + EPS)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

ROW_LR = 0.05  # row-wise Adagrad learning rate of the table rows
DENSE_LR, BETA1, BETA2 = 1e-3, 0.9, 0.999  # Adam of the dense parameters
EPS = 1e-8
MLP_DIMS = (400, 400, 400)


class FloorBatch(NamedTuple):
  """One step's inputs, fixed shapes.

  Attributes:
    rows: [U] int32 unique global rows of the batch, padded with V (out of range).
    inv: [B, F] int32 position of each id in `rows`.
    dense: [B, Nd] float32 dense features.
    labels: [B] float32 in {0, 1}.
  """

  rows: Any
  inv: Any
  dense: Any
  labels: Any


class FloorState(NamedTuple):
  """Everything the step updates.

  Attributes:
    table: [V, D+1] float32 embedding rows (D values, then the first-order weight).
    accum: [V] float32 row-wise Adagrad accumulators.
    params: dense parameters: 'mlp', a list of (kernel [in, out], bias [out]); 'wd', [Nd].
    mu: Adam first moments, like `params`.
    nu: Adam second moments, like `params`.
    count: float32 scalar, Adam steps taken.
  """

  table: Any
  accum: Any
  params: Any
  mu: Any
  nu: Any
  count: Any


def floor_batch(ids: np.ndarray, dense: np.ndarray, labels: np.ndarray, capacity: int,
                num_rows: int) -> FloorBatch:
  """Host side of a step: the batch's unique rows, padded to `capacity` (numpy).

  Args:
    ids: [B, F] int64 global row ids (field offsets added).
    dense: [B, Nd] dense features.
    labels: [B] labels.
    capacity: U, the padded size of the unique set.
    num_rows: V, the table size; also the padding row.

  Raises:
    ValueError: if the batch has more unique ids than `capacity`.
  """
  uniq, inv = np.unique(ids.ravel(), return_inverse=True)
  if uniq.size > capacity:
    raise ValueError(f"batch has {uniq.size} unique ids, more than the capacity {capacity}")
  rows = np.full(capacity, num_rows, np.int32)
  rows[:uniq.size] = uniq
  return FloorBatch(rows, inv.reshape(ids.shape).astype(np.int32),
                    np.asarray(dense, np.float32), np.asarray(labels, np.float32))


def init_state(num_rows: int, num_fields: int, embed_dim: int, num_dense: int,
               mlp_dims: Sequence[int] = MLP_DIMS) -> FloorState:
  """Fresh state: rows ~ N(0, 0.01^2), MLP kernels ~ N(0, 1/fan_in), zero biases and moments."""
  dims = [num_fields * embed_dim + num_dense, *mlp_dims, 1]
  keys = jax.random.split(jax.random.key(0), len(dims))
  mlp = [(jax.random.normal(k, (i, o)) / np.sqrt(i), jnp.zeros(o))
         for k, i, o in zip(keys, dims[:-1], dims[1:], strict=False)]
  params = {"mlp": mlp, "wd": jnp.zeros(num_dense)}

  def zeros():
    return jax.tree.map(jnp.zeros_like, params)

  table = 0.01 * jax.random.normal(jax.random.key(1), (num_rows, embed_dim + 1))
  return FloorState(table, jnp.zeros(num_rows), params, zeros(), zeros(), jnp.float32(0))


def forward(params, emb, dense):
  """DeepFM logits.

  Args:
    params: dense parameters (`FloorState.params`).
    emb: [B, F, D+1] the examples' rows.
    dense: [B, Nd] dense features.

  Returns:
    [B] logits: first order + dense linear + FM pairwise + MLP.
  """
  v, w = emb[..., :-1], emb[..., -1]  # [B, F, D], [B, F]
  s = jnp.sum(v, 1)
  fm = 0.5 * jnp.sum(s * s - jnp.sum(v * v, 1), -1)
  x = jnp.concatenate([v.reshape(v.shape[0], -1), dense], 1)
  for i, (kernel, bias) in enumerate(params["mlp"]):
    x = x @ kernel + bias
    if i < len(params["mlp"]) - 1:
      x = jax.nn.relu(x)
  return jnp.sum(w, 1) + dense @ params["wd"] + fm + x[:, 0]


def floor_step(state: FloorState, batch: FloorBatch) -> tuple[FloorState, jax.Array]:
  """One train step (pure): returns the new state and the batch's mean log loss."""
  u = jnp.take(state.table, batch.rows, axis=0, mode="fill", fill_value=0)  # [U, D+1]

  def loss_fn(params, u):
    logit = forward(params, jnp.take(u, batch.inv, axis=0), batch.dense)
    y = batch.labels
    return jnp.mean(jnp.maximum(logit, 0) - logit * y + jnp.log1p(jnp.exp(-jnp.abs(logit))))

  loss, (g_params, g_rows) = jax.value_and_grad(loss_fn, argnums=(0, 1))(state.params, u)
  accum = jnp.take(state.accum, batch.rows, mode="fill", fill_value=0) + jnp.mean(g_rows**2, 1)
  u = u - ROW_LR * g_rows / (jnp.sqrt(accum)[:, None] + EPS)
  table = state.table.at[batch.rows].set(u, mode="drop")
  accum = state.accum.at[batch.rows].set(accum, mode="drop")
  count = state.count + 1
  mu = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, state.mu, g_params)
  nu = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * g * g, state.nu, g_params)
  c1, c2 = 1 - BETA1**count, 1 - BETA2**count
  params = jax.tree.map(lambda p, m, v: p - DENSE_LR * (m / c1) / (jnp.sqrt(v / c2) + EPS),
                        state.params, mu, nu)
  return FloorState(table, accum, params, mu, nu, count), loss


def make_floor_step(compiler_options: dict | None = None
                    ) -> Callable[[FloorState, FloorBatch], tuple[FloorState, jax.Array]]:
  """`floor_step`, jitted with its state donated (and XLA's `compiler_options`: the ones
  of the step it is compared with, so both compute their dots alike)."""
  return jax.jit(floor_step, donate_argnums=0, compiler_options=compiler_options)


def measure(step, state: FloorState, batches: Sequence[FloorBatch], steps: int,
            warmup: int = 8) -> tuple[dict, FloorState]:
  """Median step time of `step` over `steps` steps, after `warmup` untimed ones.

  Each step is waited for on its own; the batches (already on device) cycle.

  Returns:
    (figures: probe, unique_capacity, median_step_ms, examples_per_sec, loss, jax; the
    state after the steps).
  """
  for i in range(warmup):
    state, loss = step(state, batches[i % len(batches)])
    loss.block_until_ready()
  times = []
  for i in range(steps):
    t = time.perf_counter()
    state, loss = step(state, batches[i % len(batches)])
    loss.block_until_ready()
    times.append(time.perf_counter() - t)
  median = statistics.median(times)
  examples = int(batches[0].labels.shape[0])
  return {"probe": "floor_deepfm", "rowwise_adagrad": True,
          "unique_capacity": int(batches[0].rows.shape[0]), "median_step_ms": median * 1e3,
          "examples_per_sec": examples / median, "loss": float(loss), "jax": jax.__version__}, state
