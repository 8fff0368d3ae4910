"""Cost metrics of a trial's architecture, for multi-objective searches and quotas.

DESIGN.md §4. `params` (`arch.count_params`), `flops` (XLA's cost analysis of one
trial's eval forward, lowered but not compiled, per example) and, when
`measure_latency`, `latency_ms`: the serving forward the bundle exports, timed on this
process's default device at `latency.batch_size` examples (median of
`latency.repeats` calls), or its roofline estimate (`latency.source='model'`;
`sfjax.cohorts.latency`, issue #26). All are cached per arch (latency also per
exported program). A `CohortRunner` holds one on its task's data (`runner.costs`),
which runners of one task may share.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.latency import ForwardLatency, LatencySettings, cost_dict
from sfjax.train import step as step_lib


class TrialCosts:
  """Cached cost metrics of architectures on one data set (see the module docstring).

  Attributes:
    spec: the DatasetSpec; data: the TrialData whose eval batch sizes the FLOPs;
    measure_latency: whether `cost_metrics` adds `latency_ms` (a public attribute);
    latency: the `LatencySettings` (change with `set_latency_settings`).
  """

  def __init__(self, spec, data: Any, measure_latency: bool = False,
               latency: LatencySettings | None = None):
    """Args: spec (DatasetSpec), data (TrialData: `num_rows`, `eval_batches`),
    measure_latency, latency (how `latency_ms` is obtained; default `LatencySettings()`)."""
    self.spec, self.data = spec, data
    self.measure_latency = bool(measure_latency)
    self._params: dict[ArchSpec, int] = {}
    self._flops: dict[ArchSpec, float] = {}
    self._forward_latency = ForwardLatency(latency or LatencySettings())
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
      lowered = forward.lower(params, table, abstract_batch)
      # The lowered program's analysis is None on some backends (GPU): the compiled one's then.
      cost = cost_dict(lowered.cost_analysis()) or cost_dict(lowered.compile().cost_analysis())
      self._flops[arch] = float(cost.get("flops", 0.0)) / batch.labels.shape[0]
    return self._flops[arch]

  @property
  def latency(self) -> LatencySettings:
    """How `latency_ms` is obtained (source, batch size, repeats)."""
    return self._forward_latency.settings

  def set_latency_settings(self, settings: LatencySettings) -> None:
    """Uses `settings` from now on; latencies obtained under other settings are dropped."""
    if settings != self.latency:
      self._forward_latency = ForwardLatency(settings)
      self._latency = {}

  def latency_ms(self, arch: ArchSpec) -> float:
    """Milliseconds of `arch`'s serving forward at `latency.batch_size` examples (cached).

    The forward a serving bundle exports (`sfjax.cohorts.latency`), on the model's
    initial parameters (the cost does not depend on their values), timed after a
    warm-up call (compilation excluded), or its roofline estimate (source 'model').
    """
    if arch not in self._latency:
      spec = self.spec
      model = arch.build_model(spec, nnx.Rngs(0))
      columns = len(spec.fields) if spec.layout is None else spec.layout.num_columns
      self._latency[arch] = self._forward_latency(
          model, columns, arch.embedding_width, spec.num_dense, weighted=spec.layout is not None)
    return self._latency[arch]

  def cost_metrics(self, arch: ArchSpec) -> dict[str, float]:
    """`params`, `flops` and (when measured) `latency_ms` of `arch`."""
    out = {"params": self.count_params(arch), "flops": self.count_flops(arch)}
    if self.measure_latency:
      out["latency_ms"] = self.latency_ms(arch)
    return out
