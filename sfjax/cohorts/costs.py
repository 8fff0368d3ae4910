"""Cost metrics of a trial's architecture, for multi-objective searches and quotas.

DESIGN.md §4. `params` (`arch.count_params`), `flops` (XLA's cost analysis of one
trial's eval forward, lowered but not compiled, per example) and, when
`measure_latency`, `latency_ms` (median wall time of that forward over one eval
batch, compiled apart, on this process's default device). All are cached per arch.
A `CohortRunner` holds one on its task's data (`runner.costs`), which runners of
one task may share.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts.arch import ArchSpec
from sfjax.train import step as step_lib

_LATENCY_REPEATS = 5  # timed calls of the eval forward per arch (after one warm-up call)


class TrialCosts:
  """Cached cost metrics of architectures on one data set (see the module docstring).

  Attributes:
    spec: the DatasetSpec; data: the TrialData whose eval batches are timed;
    measure_latency: whether `cost_metrics` adds `latency_ms` (a public attribute).
  """

  def __init__(self, spec, data: Any, measure_latency: bool = False):
    """Args: spec (DatasetSpec), data (TrialData: `num_rows`, `eval_batches`), measure_latency."""
    self.spec, self.data = spec, data
    self.measure_latency = bool(measure_latency)
    self._params: dict[ArchSpec, int] = {}
    self._flops: dict[ArchSpec, float] = {}
    self._latency: dict[ArchSpec, float] = {}

  def count_params(self, arch: ArchSpec) -> int:
    """`arch.count_params` for the task's data set (cached)."""
    if arch not in self._params:
      self._params[arch] = arch_lib.count_params(arch, self.spec)
    return self._params[arch]

  def _eval_forward(self, arch: ArchSpec):
    """(jitted one-trial eval forward, abstract params, abstract table, one eval batch)."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: arch.build_model(self.spec, nnx.Rngs(0))))
    table = jax.ShapeDtypeStruct((self.data.num_rows, arch.embedding_width), jnp.float32)
    batch = jax.tree.map(lambda x: x[0], self.data.eval_batches)
    forward = jax.jit(lambda p, values, b: step_lib.eval_logits(graphdef, p, values, b))
    return forward, params, table, batch

  def count_flops(self, arch: ArchSpec) -> float:
    """FLOPs per example of one trial's eval forward (XLA cost analysis; cached)."""
    if arch not in self._flops:
      forward, params, table, batch = self._eval_forward(arch)
      abstract_batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
      cost = forward.lower(params, table, abstract_batch).cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      self._flops[arch] = float(cost.get("flops", 0.0)) / batch.labels.shape[0]
    return self._flops[arch]

  def latency_ms(self, arch: ArchSpec) -> float:
    """Median milliseconds of one trial's eval forward over one eval batch [Be] (cached).

    Measured on zero parameters and table (the cost does not depend on the values)
    after a warm-up call, so compilation is excluded.
    """
    if arch not in self._latency:
      forward, params, table, batch = self._eval_forward(arch)
      params, table = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (params, table))
      forward(params, table, batch).block_until_ready()
      times = []
      for _ in range(_LATENCY_REPEATS):
        t0 = time.perf_counter()
        forward(params, table, batch).block_until_ready()
        times.append(time.perf_counter() - t0)
      self._latency[arch] = float(np.median(times) * 1e3)
    return self._latency[arch]

  def cost_metrics(self, arch: ArchSpec) -> dict[str, float]:
    """`params`, `flops` and (when measured) `latency_ms` of `arch`."""
    out = {"params": self.count_params(arch), "flops": self.count_flops(arch)}
    if self.measure_latency:
      out["latency_ms"] = self.latency_ms(arch)
    return out
