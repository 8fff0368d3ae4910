"""Latency of a candidate's serving forward on this process's device (issue #26, Deliver 4).

The forward timed is the one a serving bundle exports (`sfjax.serving.bundle`):

  forward(dense leaves, emb [B, C, E], dense [B, Nd] (, weights [B, C])) -> logits [B]
      = nnx.merge(graphdef, leaves)(emb, dense (, weights))

with C the model's id columns (F fields, or the S columns of a feature layout, which
also take per-id weights). It is exported with `jax.export` (batch dimension symbolic),
serialized, deserialized and compiled for `batch_size` examples as the `Predictor`
compiles it, so the program timed is the program served. Sources
(`LatencySettings.source`, `study.latency_source`):

  measured  median wall time of `repeats` calls after one warm-up call (compilation and
            the first call's allocations excluded), in milliseconds. Wall times vary
            from run to run, so a search on them is not bit-reproducible.
  model     a deterministic roofline estimate from XLA's cost analysis of the same
            compiled program: flops / 1e12 FLOP/s + bytes accessed / 1e11 B/s, in
            milliseconds of a nominal device. It ranks architectures by compute and
            memory traffic, not by this host's speed; for reproducible searches and tests.

The host-side work of serving (parsing records, gathering rows) is not part of an
architecture's latency: it depends on the table, not on the model searched.

`ForwardLatency` caches by the exported program (its serialized StableHLO), so two
architectures whose forwards are one program (they differ only in training
settings, e.g. the row optimizer) are timed once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

LATENCY_SOURCES = ("measured", "model")
_NOMINAL_FLOPS_PER_S = 1e12  # the 'model' source's nominal device (documented above)
_NOMINAL_BYTES_PER_S = 1e11
# Source locations in the exported text (`#loc12 = loc("file.py":3:1)` and `loc(#loc12)`)
# name the caller's stack, not the program; the cache key leaves them out.
_LOCATIONS = re.compile(r"^#loc.*$|\s*loc\(#loc\d*\)", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class LatencySettings:
  """How latency is obtained (the `study.latency_*` settings).

  Attributes:
    source: 'measured' (timed) or 'model' (roofline estimate); see the module docstring.
    batch_size: examples per forward call (the serving batch the latency is for).
    repeats: timed calls whose median is reported ('measured').
  """

  source: str = "measured"
  batch_size: int = 512
  repeats: int = 20

  def __post_init__(self):
    if self.source not in LATENCY_SOURCES:
      raise ValueError(f"study.latency_source: expected one of {LATENCY_SOURCES}, got "
                       f"{self.source!r}")
    for name in ("batch_size", "repeats"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"study.latency_{name}: expected an integer >= 1, got {value!r}")


def export_forward(model: nnx.Module, columns: int, width: int, num_dense: int,
                   weighted: bool = False) -> jax.export.Exported:
  """The serving bundle's forward of `model`, exported for this host's platform.

  Args:
    model: the candidate (its parameters' values are not part of the program).
    columns: id columns C (fields, or a layout's columns); width: row width E.
    num_dense: dense features Nd.
    weighted: a feature-layout model, which also takes weights [B, C].

  Returns:
    The `jax.export.Exported` of `(leaves, emb [b, C, E], dense [b, Nd](, weights)) -> [b]`,
    b symbolic.
  """
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)

  def forward(leaves, emb, dense, *weights):  # [B, C, E], [B, Nd] (, [B, C]) -> [B]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))(emb, dense, *weights)

  (b,) = jax.export.symbolic_shape("b")
  args = ([jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
          jax.ShapeDtypeStruct((b, columns, width), np.float32),
          jax.ShapeDtypeStruct((b, num_dense), np.float32),
          *([jax.ShapeDtypeStruct((b, columns), np.float32)] if weighted else []))
  return jax.export.export(jax.jit(forward))(*args)


def forward_inputs(model: nnx.Module, exported: jax.export.Exported, batch_size: int,
                   seed: int = 0) -> tuple[Any, ...]:
  """Arguments of one call at `batch_size`: the model's leaves and random inputs."""
  leaves = [jax.device_put(np.asarray(x)) for x in jax.tree.leaves(nnx.state(model))]
  rng = np.random.default_rng(seed)
  inputs = [rng.standard_normal((batch_size, *a.shape[1:])).astype(np.float32)
            for a in exported.in_avals[len(leaves):]]
  return (leaves, *inputs)


def compile_forward(exported: jax.export.Exported, args: tuple[Any, ...]):
  """The exported forward round-tripped through serialization and compiled for `args`."""
  served = jax.export.deserialize(bytearray(exported.serialize()))
  return jax.jit(served.call).lower(*args).compile()


def median_ms(compiled, args: tuple[Any, ...], repeats: int) -> float:
  """Median milliseconds of `repeats` calls of `compiled(*args)`, after one warm-up call."""
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times) * 1e3)


def cost_dict(cost) -> dict:
  """XLA's cost analysis as one dict (it may come as a one-element list, or None)."""
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  return dict(cost) if isinstance(cost, dict) else {}


def roofline_ms(compiled) -> float:
  """The 'model' source: milliseconds of `compiled` on the nominal device (module docstring)."""
  cost = cost_dict(compiled.cost_analysis())
  flops, moved = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  return 1e3 * (max(flops, 0.0) / _NOMINAL_FLOPS_PER_S + max(moved, 0.0) / _NOMINAL_BYTES_PER_S)


def program_key(exported: jax.export.Exported) -> str:
  """SHA-256 of the exported program's text without its source locations."""
  return hashlib.sha256(_LOCATIONS.sub("", exported.mlir_module()).encode()).hexdigest()


class ForwardLatency:
  """Latency of serving forwards under `settings`, cached by exported program.

  Attributes:
    settings: the `LatencySettings`; programs_timed: how many programs were timed.
  """

  def __init__(self, settings: LatencySettings | None = None):
    self.settings = settings or LatencySettings()
    self.programs_timed = 0
    self._by_program: dict[str, float] = {}

  def __call__(self, model: nnx.Module, columns: int, width: int, num_dense: int,
               weighted: bool = False) -> float:
    """Milliseconds of one forward call of `model` at `settings.batch_size` (`export_forward`'s
    Args)."""
    exported = export_forward(model, columns, width, num_dense, weighted)
    key = program_key(exported)
    if key not in self._by_program:
      args = forward_inputs(model, exported, self.settings.batch_size)
      compiled = compile_forward(exported, args)
      self._by_program[key] = (median_ms(compiled, args, self.settings.repeats)
                               if self.settings.source == "measured" else roofline_ms(compiled))
      self.programs_timed += 1
    return self._by_program[key]
