"""Device mesh and sharding rules for data-parallel CTR training.

Mesh axis 'data' (DESIGN.md §3). The batch's examples are sharded on 'data'; the
unique-row indices, the embedding table and the dense parameters are replicated,
so the `[U, E]` row gradient is combined by one all-reduce inside the jitted step.
A row-sharded cache, and the row-sharded device table (`embedding.sharding=row`), split
their rows on 'data' (`rows_on_devices`) and take the batch's unique rows in per-owner
blocks (`batch_shardings(rows_on_owners=True)`).
Axes are `Auto` so `jax.jit` shardings (GSPMD) place the collectives.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from sfjax.core.types import DeviceBatch


def _global_devices() -> list:
  """Every process's devices, process by process (process p's devices are the mesh
  positions `[p*L, (p+1)*L)`, so its examples are one contiguous block of the batch)."""
  return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


def make_mesh(num_devices: int = 0) -> jax.sharding.Mesh:
  """A 1-D ('data',) mesh over the first `num_devices` devices (0 = all).

  One process: its local devices. Several processes (`jax.distributed`): the global mesh
  over all processes' devices (`_global_devices`); it must then hold all of them.
  """
  multi = jax.process_count() > 1
  devices = _global_devices() if multi else jax.local_devices()
  n = len(devices) if num_devices <= 0 else num_devices
  if n > len(devices):
    raise ValueError(f"config field train.num_devices={num_devices} but only "
                     f"{len(devices)} devices are visible")
  if multi and n != len(devices):
    raise ValueError(f"config field train.num_devices={num_devices}: with "
                     f"{jax.process_count()} processes the mesh spans all {len(devices)} devices "
                     "of all processes (set 0)")
  return jax.sharding.Mesh(np.array(devices[:n]), ("data",),
                           axis_types=(jax.sharding.AxisType.Auto,))


def replicated(mesh) -> NamedSharding:
  """Sharding that keeps a full copy on every device of `mesh`."""
  return NamedSharding(mesh, P())


def rows_on_devices(mesh) -> NamedSharding:
  """Sharding of an array split on its leading axis over 'data' (a row-sharded cache or
  device table, per-device swap buffers): device d holds block d."""
  return NamedSharding(mesh, P("data"))


def batch_shardings(mesh, rows_on_owners: bool = False, row_tables: bool = False) -> DeviceBatch:
  """Per-field shardings of a DeviceBatch: examples on 'data'; unique rows replicated, or
  (`rows_on_owners`, a row-sharded cache) in per-device blocks on 'data'. `row_tables`:
  the batch carries its rows' table indices, sharded like the rows (else that field is None)."""
  rep, data = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  rows = data if rows_on_owners else rep
  return DeviceBatch(rows, data, data, data, data, data, rows if row_tables else None)
