"""`bench_scaling`'s per-process input runs (1, 2, 4 local processes) and the cost model's
check and projection (`sfjax/parallel/scaling_model.py`).

For each P in `config.processes`, one local `jax.distributed` job of P processes with
`process_devices / P` CPU devices each (`scaling_processes`) trains the device backend
with a row-sharded table (`embedding.sharding=row`) on synthetic data read by index,
each process reading only its own rows. A row per P:

  examples_per_sec             end to end (process 0; warm-up steps excluded)
  input_examples_per_sec_per_process   a process's own rows/s through the trainer's
                               `InputFeed` (read + the input exchange), alone
  read_examples_per_sec_per_process    the same rows read by index, no exchange
  host_exchange_bytes_per_step bytes a process sends + receives in the input exchange
  collective_*_bytes_per_step  the compiled step's collectives (all-gather / reduce-scatter:
                               the row-sharded table's owner blocks; all-reduce: the dense
                               gradient and the loss), full sizes, and their ring bytes
  table_capacity_rows          rows the devices hold in all (D x rows per device)
  max_loss_diff                against P = 1 (the same global batches: float noise only)

The model's check: the 1-process run gives the step profile (FLOPs and bytes accessed per
device, collective sizes and counts, input bytes per example) and calibrates the compute
rate to its measured device step; each run's own link timings (an all-reduce over all
devices, the key-value input exchange, at two sizes) give the links; the input rate per
process is the 1-process read rate. Here the input thread and the fake devices share the
machine's cores, so the local model adds input and device step (`input_overlaps=False`);
every process of a job shares them too, which the model (one host per process) does not
see. It predicts each P's examples/s, device step and input time, printed with
predicted / measured (the 1-process device step equals the measurement by construction).
The projection: the same profile on H100-class nodes (`h100_cluster`,
8 GPUs a node over NVLink, nodes over 400 Gb/s InfiniBand) for `project_devices`, with
the input rate per process and the key-value bandwidth measured here (this CPU's; or
`project_input_examples_per_sec` / `project_coordinator_bytes_per_s`), and again with the
input left out (the devices' own bound).
"""

from __future__ import annotations

import sys

import ml_collections
import numpy as np

from experiments import scaling_processes
from sfjax.core import ConfigError
from sfjax.parallel import (
  COLLECTIVE_FACTORS,
  Cluster,
  Link,
  StepProfile,
  calibrate_compute,
  collective_seconds,
  fit_link,
  h100_cluster,
  predict_step,
)

_FAST_LINK = Link(1e15, 0.0)  # a level with one device: no link


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the field when the per-process settings are invalid."""
  processes = tuple(int(p) for p in config.processes)
  for p in processes:
    if p < 1 or config.process_devices % p or config.batch_size % config.process_devices:
      raise ConfigError(
          f"config field processes: {p} processes must divide process_devices="
          f"{config.process_devices}, which must divide batch_size={config.batch_size}")
  if processes and 1 not in processes:
    raise ConfigError("config field processes: must include 1 (the model's calibration)")
  if any(int(n) < 1 for n in config.project_devices):
    raise ConfigError(f"config field project_devices: must be >= 1, got {config.project_devices}")


def process_train_config(base: ml_collections.ConfigDict, config: ml_collections.ConfigDict
                         ) -> dict:
  """The per-process runs' trainer config (flattened, JSON-able): `base` with the device
  backend, a row-sharded table and every device of the job."""
  c = ml_collections.ConfigDict(base.to_dict())
  c.embedding.backend, c.embedding.sharding = "device", "row"
  c.train.num_devices = 0
  steps = config.process_warmup_steps + config.process_steps + config.process_device_steps
  c.train.steps = c.train.eval_every = c.train.log_every = steps
  c.data.synthetic.num_train = max((steps + 8) * config.batch_size, 4096)
  out = {}

  def walk(prefix, d):
    for k, v in d.items():
      if isinstance(v, dict):
        walk(prefix + k + ".", v)
      elif not prefix.startswith("distributed."):
        out[prefix + k] = list(v) if isinstance(v, tuple) else v

  walk("", c.to_dict())
  return out


def measure_processes(config: ml_collections.ConfigDict, base) -> list[dict]:
  """One row per P (module docstring) with every process's raw figures under `per_process`."""
  payload = {"config": process_train_config(base, config),
             "timeout_s": float(config.process_timeout_s) / 2,
             "bench": {"warmup_steps": int(config.process_warmup_steps),
                       "steps": int(config.process_steps),
                       "device_steps": int(config.process_device_steps),
                       "allreduce_sizes": [int(s) for s in config.allreduce_sizes],
                       "exchange_sizes": [int(s) for s in config.exchange_sizes]}}
  rows = []
  for p in sorted({int(x) for x in config.processes}):
    procs = scaling_processes.launch(payload, p, config.process_devices // p,
                                     float(config.process_timeout_s))
    first = procs[0]
    rows.append({
        "processes": p, "devices": first["devices"], "local_devices": first["local_devices"],
        "batch_size": first["batch_size"], "examples_per_sec": first["examples_per_sec"],
        "device_step_seconds": first["device_step_seconds"],
        "compiles_in_timed_steps": first["compiles_in_timed_steps"],
        "input_examples_per_sec_per_process": float(np.mean(
            [r["feed_examples_per_sec"] for r in procs])),
        "input_global_examples_per_sec": min(r["feed_global_examples_per_sec"] for r in procs),
        "read_examples_per_sec_per_process": float(np.mean(
            [r["read_examples_per_sec"] for r in procs])),
        "host_exchange_bytes_per_step": first["host_exchange_bytes_per_step"],
        "collective_ring_bytes_per_step": first["collective_ring_bytes_per_step"],
        "collective_all_reduce_bytes_per_step": first["all_reduce_bytes_per_step"],
        "collective_all_gather_bytes_per_step": first["all_gather_bytes_per_step"],
        "collective_reduce_scatter_bytes_per_step": first["reduce_scatter_bytes_per_step"],
        "collectives_per_step": first["collective_counts"],
        "table_rows": first["table_rows"], "table_capacity_rows": first["table_capacity_rows"],
        "table_rows_per_device": first["table_rows_per_device"],
        "per_process": procs})
  base_losses = np.asarray(rows[0]["per_process"][0]["losses"])
  for row in rows:
    row["max_loss_diff"] = max(float(np.max(np.abs(np.asarray(r["losses"]) - base_losses)))
                               for r in row["per_process"])
  return rows


def step_profile(row: dict) -> StepProfile:
  """The cost model's step profile from a measured row (its process 0's figures)."""
  first = row["per_process"][0]
  batch = row["batch_size"]
  return StepProfile(
      per_device_batch=batch // row["devices"], flops=first["flops_per_device"],
      bytes_accessed=first["bytes_accessed_per_device"],
      fixed_collectives={"all-reduce": row["collective_all_reduce_bytes_per_step"]},
      per_example_collectives={
          "all-gather": row["collective_all_gather_bytes_per_step"] / batch,
          "reduce-scatter": row["collective_reduce_scatter_bytes_per_step"] / batch},
      example_bytes=first["example_bytes"], collective_counts=first["collective_counts"])


def fit_allreduce_link(sizes, seconds, group: int) -> Link:
  """`fit_link` of an all-reduce's timings; when noise makes the times not
  grow with the size, the bandwidth of the largest alone (no latency)."""
  try:
    return fit_link(sizes, seconds, "all-reduce", group)
  except ValueError:
    wire = COLLECTIVE_FACTORS["all-reduce"] * (group - 1) / group * sizes[-1]
    return Link(wire / max(seconds[-1], 1e-12), 0.0)


def local_cluster(row: dict, intra: Link, input_rate: float) -> Cluster:
  """This machine as the model sees a P-process run: P 'nodes' (processes) of L fake
  devices, `intra` inside a process, the inter-process link and the key-value store's
  bandwidth fitted to the run's own link timings."""
  first, p, local = row["per_process"][0], row["processes"], row["local_devices"]
  inter, coordinator = _FAST_LINK, 1e15
  if p > 1:
    sizes, times = first["allreduce_sizes"], first["allreduce_seconds"]
    within = Cluster(local, local, intra, _FAST_LINK, 1.0, 1.0, 1.0, 1.0)
    rest = [max(t - collective_seconds("all-reduce", s, within), 1e-9)
            for s, t in zip(sizes, times, strict=True)]
    inter = fit_allreduce_link([s / local for s in sizes], rest, p)
    # P^2 x s bytes through the store per exchange of s bytes a process (`input_seconds`)
    coordinator = p * p * first["exchange_sizes"][-1] / first["exchange_seconds"][-1]
  # the input thread and the fake devices share this machine's cores: no overlap
  return Cluster(row["devices"], local, intra, inter, 1.0, 1.0, input_rate, coordinator,
                    input_overlaps=False)


def model_check(rows: list[dict]) -> tuple[list[dict], StepProfile, Cluster]:
  """Predicted vs measured examples/s of every P; also the profile and the calibrated
  1-process cluster. The intra-process link is fitted to the 1-process row's all-reduce
  timings; when its latency alone makes the collectives outlast the measured step, the
  latency is dropped and the bandwidth kept (`intra_link_latency_dropped`)."""
  one = rows[0]
  first = one["per_process"][0]
  profile = step_profile(one)
  intra = _FAST_LINK
  if one["devices"] > 1:
    intra = fit_allreduce_link(first["allreduce_sizes"], first["allreduce_seconds"],
                               one["devices"])
  input_rate = one["read_examples_per_sec_per_process"]

  def calibrate(link: Link) -> Cluster:
    return calibrate_compute(profile, local_cluster(one, link, input_rate),
                             one["device_step_seconds"])

  try:
    calibrated, latency_dropped = calibrate(intra), False
  except ValueError:
    # Each timed all-reduce is a call of its own and pays a dispatch that the step's fused
    # collectives do not; on a busy machine the fitted per-hop latency can then outlast the
    # whole measured step. The step bounds it: keep the link's bandwidth, drop its latency.
    intra = intra._replace(latency_s=0.0)
    calibrated, latency_dropped = calibrate(intra), True
  out = []
  for row in rows:
    cluster = local_cluster(row, intra, input_rate)._replace(
        device_flops=calibrated.device_flops, device_bytes_per_s=calibrated.device_bytes_per_s)
    t = predict_step(profile, cluster)
    own = row["batch_size"] // row["processes"]
    out.append({"processes": row["processes"], "predicted_examples_per_sec": t.examples_per_s,
                "measured_examples_per_sec": row["examples_per_sec"],
                "ratio": t.examples_per_s / row["examples_per_sec"],
                "predicted_device_step_s": t.compute + t.collectives + t.overhead,
                "measured_device_step_s": row["device_step_seconds"],
                "predicted_input_s": t.input,
                "measured_input_s": own / row["input_examples_per_sec_per_process"],
                "predicted_compute_s": t.compute, "predicted_collectives_s": t.collectives,
                "intra_link_bytes_per_s": intra.bytes_per_s,
                "intra_link_latency_s": intra.latency_s,
                "intra_link_latency_dropped": latency_dropped,
                "inter_link_bytes_per_s": cluster.inter.bytes_per_s,
                "inter_link_latency_s": cluster.inter.latency_s,
                "coordinator_bytes_per_s": cluster.coordinator_bytes_per_s})
  return out, profile, calibrated


def project(profile: StepProfile, devices, input_rate: float,
            coordinator_bytes_per_s: float) -> list[dict]:
  """The profile on H100-class nodes for each device count, with this machine's input
  rate per process, and with the input left out."""
  out = []
  for n in devices:
    cluster = h100_cluster(int(n), input_rate, coordinator_bytes_per_s)
    t = predict_step(profile, cluster)
    free = predict_step(profile, cluster._replace(input_examples_per_s=1e18,
                                                coordinator_bytes_per_s=1e18))
    batch = profile.per_device_batch * int(n)
    read = batch / cluster.num_nodes / input_rate
    out.append({"devices": int(n), "nodes": cluster.num_nodes, "global_batch": batch,
                "input_s": t.input, "input_read_s": read, "input_exchange_s": t.input - read, "compute_s": t.compute, "collectives_s": t.collectives,
                "overhead_s": t.overhead, "step_s": t.step, "examples_per_sec": t.examples_per_s,
                "bound": "input" if t.input >= t.step else "device",
                "device_only_examples_per_sec": free.examples_per_s})
  return out


def plot_projection(projection: list[dict], per_device_batch: int, path: str) -> None:
  """The projected examples/s against GPUs (with this machine's input, and the devices
  alone) as a PNG at `path`."""
  import matplotlib  # pylint: disable=import-outside-toplevel  (only when a plot is asked)
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  devices = [r["devices"] for r in projection]
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.loglog(devices, [r["device_only_examples_per_sec"] for r in projection], "o-",
            label="devices alone (input kept up)")
  ax.loglog(devices, [r["examples_per_sec"] for r in projection], "s--",
            label="with the measured input per node")
  ax.set_xlabel("H100-class GPUs (8 per node)")
  ax.set_ylabel("examples/s (cost model)")
  ax.set_title(f"bench_scaling projection, {per_device_batch} examples per GPU")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def run_processes(config: ml_collections.ConfigDict, base) -> dict:
  """The per-process rows, the model's check and the projection (module docstring);
  prints their tables to stderr."""
  rows = measure_processes(config, base)
  check, profile, calibrated = model_check(rows)
  coordinator = (config.project_coordinator_bytes_per_s or
                 max([c["coordinator_bytes_per_s"] for c in check if c["processes"] > 1],
                     default=1e15))
  input_rate = (config.project_input_examples_per_sec
                or rows[0]["read_examples_per_sec_per_process"])
  projection = project(profile, config.project_devices, input_rate, coordinator)
  for row, c in zip(rows, check, strict=True):
    print(f"P={row['processes']} x {row['local_devices']} dev  {row['examples_per_sec']:9.0f} ex/s "
          f"input/process {row['input_examples_per_sec_per_process']:9.0f} ex/s "
          f"host xchg {row['host_exchange_bytes_per_step'] / 1e6:7.3f} MB/step "
          f"coll ring {row['collective_ring_bytes_per_step'] / 1e6:7.3f} MB/step "
          f"capacity {row['table_capacity_rows']} rows  dloss {row['max_loss_diff']:.1e}  "
          f"model {c['predicted_examples_per_sec']:9.0f} ex/s (x{c['ratio']:.2f}; device step "
          f"x{c['predicted_device_step_s'] / c['measured_device_step_s']:.2f}, input "
          f"x{c['predicted_input_s'] / c['measured_input_s']:.2f})", file=sys.stderr)
  for r in projection:
    print(f"H100 x {r['devices']:3d} ({r['nodes']} nodes, B={r['global_batch']}): "
          f"{r['examples_per_sec']:12.0f} ex/s ({r['bound']}-bound; devices alone "
          f"{r['device_only_examples_per_sec']:12.0f}) step {r['step_s'] * 1e3:.3f} ms = max(input "
          f"{r['input_read_s'] * 1e3:.3f} read + {r['input_exchange_s'] * 1e3:.3f} exchange, compute {r['compute_s'] * 1e3:.3f} + coll "
          f"{r['collectives_s'] * 1e3:.3f} + overhead {r['overhead_s'] * 1e3:.3f})", file=sys.stderr)
  if config.get("plot", ""):
    plot_projection(projection, profile.per_device_batch, config.plot)
  for row in rows:
    row.pop("per_process")
  return {"processes": rows, "model_check": check,
          "model_profile": profile._asdict(),
          "model_calibrated_device_flops": calibrated.device_flops,
          "projection_input_examples_per_sec_per_node": input_rate,
          "projection_coordinator_bytes_per_s": coordinator,
          "projection": projection}
