"""sfjax.parallel: devices, meshes and processes.

The mesh and its sharding rules (`mesh`), the embedding exchange's collectives and
their byte counts (`collectives`), and multi-host runs on JAX's multi-controller
runtime (`distributed`: start-up, per-process rows, agreement checks).
"""

from sfjax.parallel.collectives import collective_bytes
from sfjax.parallel.distributed import (
  distributed_settings,
  initialize_distributed,
  is_main_process,
)
from sfjax.parallel.mesh import batch_shardings, make_mesh, replicated, rows_on_devices

__all__ = [
  "batch_shardings",
  "collective_bytes",
  "distributed_settings",
  "initialize_distributed",
  "is_main_process",
  "make_mesh",
  "replicated",
  "rows_on_devices",
]
