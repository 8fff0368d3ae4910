"""sfjax.parallel: devices, meshes and processes.

The mesh and its sharding rules (`mesh`), the embedding exchange's collectives and
their byte counts (`collectives`), and multi-host runs on JAX's multi-controller
runtime (`distributed`: start-up, per-process rows, agreement checks; `barriers`;
`host_exchange`: the input rows every process reads). `scaling_model`: a step's rate on N
devices from measured bytes and FLOPs (issue #24).
"""

from sfjax.parallel.barriers import barrier
from sfjax.parallel.collectives import collective_bytes
from sfjax.parallel.distributed import (
  distributed_settings,
  initialize_distributed,
  is_main_process,
  process_rows,
)
from sfjax.parallel.host_exchange import begin_stream, gather_batch, rows_to_bytes
from sfjax.parallel.mesh import batch_shardings, make_mesh, replicated, rows_on_devices
from sfjax.parallel.scaling_model import (
  COLLECTIVE_FACTORS,
  Cluster,
  Link,
  StepProfile,
  StepTime,
  calibrate_compute,
  collective_seconds,
  collectives_seconds,
  fit_link,
  h100_cluster,
  input_seconds,
  predict_step,
  step_sizes,
)

__all__ = [
  "COLLECTIVE_FACTORS",
  "Cluster",
  "Link",
  "StepProfile",
  "StepTime",
  "barrier",
  "batch_shardings",
  "begin_stream",
  "calibrate_compute",
  "collective_bytes",
  "collective_seconds",
  "collectives_seconds",
  "distributed_settings",
  "fit_link",
  "gather_batch",
  "h100_cluster",
  "initialize_distributed",
  "input_seconds",
  "is_main_process",
  "make_mesh",
  "predict_step",
  "process_rows",
  "replicated",
  "rows_on_devices",
  "rows_to_bytes",
  "step_sizes",
]
