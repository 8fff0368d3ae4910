"""Device mesh and sharding rules for data-parallel CTR training.

Mesh axis 'data' (DESIGN.md §3). The batch's examples are sharded on 'data'; the
unique-row indices, the embedding table and the dense parameters are replicated,
so the `[U, E]` row gradient is combined by one all-reduce inside the jitted step.
Axes are `Auto` so `jax.jit` shardings (GSPMD) place the collectives.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from sfjax.core.types import DeviceBatch


def make_mesh(num_devices: int = 0) -> jax.sharding.Mesh:
  """A 1-D ('data',) mesh over the first `num_devices` local devices (0 = all)."""
  devices = jax.local_devices()
  n = len(devices) if num_devices <= 0 else num_devices
  if n > len(devices):
    raise ValueError(f"config field train.num_devices={num_devices} but only "
                     f"{len(devices)} devices are visible")
  return jax.sharding.Mesh(np.array(devices[:n]), ("data",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def replicated(mesh) -> NamedSharding:
  """Sharding that keeps a full copy on every device of `mesh`."""
  return NamedSharding(mesh, P())


def batch_shardings(mesh) -> DeviceBatch:
  """Per-field shardings of a DeviceBatch: unique rows replicated, examples on 'data'."""
  rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  return DeviceBatch(rep, data, data, data, data)
