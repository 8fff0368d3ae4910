"""Config of `python -m experiments.bench_scaling`: the MixCache scaled out over devices.

Run:
  python -m experiments.bench_scaling --config=experiments/configs/bench_scaling.py \\
      [--config.devices=1,2,4,8 --config.shardings=replicated,row --config.steps=24 \\
       --config.batch_size=1024 --config.out=scaling.json]
  python -m experiments.bench_scaling --config=experiments/configs/bench_scaling.py:smoke

Variants (the text after ':'): '' (1, 2, 4 and 8 devices x replicated / row-sharded cache x
VSI on / off, 24 steps of 1024; then 1, 2 and 4 local processes over 4 devices, and the cost
model's projection to 8 and 64 GPUs), 'smoke' (seconds: 2 devices, 3 steps of 32 on a tiny
table; 1 and 2 processes over 2 devices).
"""

import ml_collections


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  """Returns the benchmark's config; `arg` selects a variant ('' or 'smoke')."""
  c = ml_collections.ConfigDict()
  c.devices = (1, 2, 4, 8)  # device counts of the mesh
  c.shardings = "replicated,row"  # embedding.cache_sharding values, comma-separated
  c.vsi = "on,off"  # on: bucketed unique rows; off: U = B*F rows
  c.steps = 24  # train steps per configuration
  c.batch_size = 1024  # examples per step (divisible by every device count)
  c.cardinality_scale = 0.01  # multiplies the Criteo per-field cardinalities
  c.embed_dim = 16  # embedding dim (DeepFM rows hold dim + 1 floats)
  c.mlp_dims = (64,)  # DeepFM MLP widths
  c.cache_rows = 0  # rows per device; 0 = lookahead x B x F (the smallest a replicated cache may be)
  c.out = ""  # also write the JSON result here
  # Per-process input (issue #24): local jax.distributed jobs of P processes, each reading
  # only its own rows, device backend with a row-sharded table; () = skip.
  c.processes = (1, 2, 4)  # P values (1 is required: it calibrates the cost model)
  c.process_devices = 4  # CPU devices of each job in all (process_devices / P per process)
  c.process_warmup_steps = 4  # untimed (the compiles of the bucket shapes)
  c.process_steps = 24  # timed end to end
  c.process_device_steps = 8  # timed each to its end (the device step)
  c.process_timeout_s = 600  # bound of each job (every process killed after it)
  c.allreduce_sizes = (1 << 16, 1 << 22)  # bytes per device of the link timing's all-reduce
  c.exchange_sizes = (1 << 14, 1 << 20)  # bytes per process of the input exchange's timing
  c.project_devices = (8, 16, 32, 64, 128)  # the cost model's projection (H100-class, 8 a node)
  c.project_input_examples_per_sec = 0.0  # input rate of one process (a node); 0 = measured here
  c.project_coordinator_bytes_per_s = 0.0  # process 0's key-value store; 0 = measured here
  c.plot = ""  # also draw the projection here (PNG), e.g. docs/scaling.png
  if arg == "smoke":
    c.devices, c.steps, c.batch_size, c.cardinality_scale = (2,), 3, 32, 0.0005
    c.mlp_dims, c.embed_dim = (8,), 4
    c.processes, c.process_devices = (1, 2), 2
    c.process_warmup_steps, c.process_steps, c.process_device_steps = 2, 3, 4
    c.process_timeout_s, c.project_devices = 240, (8, 64)
  elif arg:
    raise ValueError(f"unknown config variant {arg!r} (known: '', 'smoke')")
  return c
