"""A small cost model of a training step's rate on N devices (issue #24, item 7).

From what one measured run gives per step (the step's FLOPs and bytes accessed per
device from XLA's cost analysis, the bytes of its collectives from the compiled HLO, the
host's input rate), and link / device parameters, it predicts examples/s for N devices,
`devices_per_node` per node (NVLink inside a node, InfiniBand between nodes):

  step       = max(input, device)                      the input runs on a host thread,
                                                       overlapped with the device step
             (input + device when they share the same cores: `input_overlaps=False`,
             e.g. fake CPU devices)
  input      = (B / P) / input_rate                    each of the P processes reads its
             + host_exchange                           B/P rows (`input_feed`), then the
                                                       rows go through process 0's key-value
                                                       store: P x B x example_bytes there
  device     = compute + collectives + overhead        no overlap of compute and collectives
  compute    = max(flops / device_flops, bytes accessed / device_bytes_per_s)   (roofline)
  collective = k [(g-1)/g S / bw_intra + (g-1) lat_intra          g devices per node,
                  + (n-1)/n S/g / bw_inter + (n-1) lat_inter]     n nodes (hierarchical ring)

with S the collective's full size (all-reduce: the buffer; all-gather: its result;
reduce-scatter: its input on one device) and k = 2 for an all-reduce (a reduce-scatter
then an all-gather), 1 for an all-gather or a reduce-scatter. A step's collectives of
one kind are summed: their bytes in one bandwidth term, each paying the latency terms. Inside a node each device
sends (g-1)/g S over NVLink; between nodes each of the g devices runs its own ring over
its own NIC on an S/g slice.

Scaling (`project`) is weak: the per-device batch b of the measured run is kept, B = b N.
The dense all-reduce keeps its size; the row-sharded table's owner-block exchange
(`all_gather` of the global batch's unique rows, `psum_scatter` of their gradients)
grows with B (its sizes are per global example); FLOPs and bytes accessed per device are
the measured ones (they depend on b). The unique fraction of the measured batch is kept
(larger batches repeat more ids: this overestimates the exchange).

Default parameters (`h100_cluster`) are assumptions, peak vendor figures, not
measurements: H100 SXM 67 TFLOP/s FP32 (non-tensor; the step is float32) and 3.35 TB/s
HBM3; NVLink 4 450 GB/s per direction per GPU, 2 us a hop; one 400 Gb/s InfiniBand NIC
(50 GB/s) per GPU, 5 us a hop; 100 us of host dispatch per step; the input rate and the
coordinator's key-value bandwidth are to be measured (defaults: those of the caller).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

COLLECTIVE_FACTORS = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0}


class Link(NamedTuple):
  """One kind of link.

  Attributes:
    bytes_per_s: bandwidth per device, one direction.
    latency_s: seconds per ring hop.
  """

  bytes_per_s: float
  latency_s: float


class Cluster(NamedTuple):
  """Devices, links and the host side.

  Attributes:
    num_devices: N.
    devices_per_node: g (N = n x g; a node is one process).
    intra: the link inside a node.
    inter: the link between nodes (per device: one NIC each).
    device_flops: FLOP/s of one device.
    device_bytes_per_s: memory bandwidth of one device.
    input_examples_per_s: examples/s one process reads (its own rows only).
    coordinator_bytes_per_s: bandwidth of process 0's key-value store (the input exchange).
    step_overhead_s: host dispatch per step.
    input_overlaps: the input runs beside the device step (own cores / an accelerator);
      False: they take turns on the same cores (the step is their sum).
  """

  num_devices: int
  devices_per_node: int
  intra: Link
  inter: Link
  device_flops: float
  device_bytes_per_s: float
  input_examples_per_s: float
  coordinator_bytes_per_s: float
  step_overhead_s: float = 0.0
  input_overlaps: bool = True

  @property
  def num_nodes(self) -> int:
    """n, the nodes (processes)."""
    return -(-self.num_devices // self.devices_per_node)


class StepProfile(NamedTuple):
  """What one measured step does, in sizes that scale (`project`).

  Attributes:
    per_device_batch: b, examples per device per step.
    flops: FLOPs per device per step (XLA cost analysis of the step program).
    bytes_accessed: bytes accessed per device per step (idem).
    fixed_collectives: {kind: full bytes per step} that do not grow with the batch
      (the dense gradient's all-reduce).
    per_example_collectives: {kind: full bytes per global example per step} (the
      row-sharded table's all-gather / reduce-scatter of the global batch's rows).
    example_bytes: bytes of one example's input rows in the host exchange.
    collective_counts: {kind: collectives of that kind per step} (each pays the link
      latencies; a kind not named: one).
  """

  per_device_batch: int
  flops: float
  bytes_accessed: float
  fixed_collectives: dict[str, float]
  per_example_collectives: dict[str, float]
  example_bytes: float
  collective_counts: dict[str, float] = {}


class StepTime(NamedTuple):
  """A predicted step, in seconds, and its rate.

  Attributes:
    input: the host input's time per step (one process).
    compute: the device's roofline time.
    collectives: the device collectives' time.
    overhead: host dispatch.
    step: max(input, compute + collectives + overhead) (their sum without overlap).
    examples_per_s: B / step.
  """

  input: float
  compute: float
  collectives: float
  overhead: float
  step: float
  examples_per_s: float


def collective_seconds(kind: str, full_bytes: float, cluster: Cluster, count: float = 1) -> float:
  """Seconds of `count` collectives of `full_bytes` in all over every device of `cluster`
  (hierarchical ring, the module docstring's formula; the latencies paid `count` times).

  Raises:
    ValueError: an unknown kind.
  """
  if kind not in COLLECTIVE_FACTORS:
    raise ValueError(f"collective kind: expected one of {sorted(COLLECTIVE_FACTORS)}, got {kind!r}")
  if full_bytes <= 0 or cluster.num_devices <= 1:
    return 0.0
  g = min(cluster.devices_per_node, cluster.num_devices)
  n = cluster.num_nodes
  intra = inter = 0.0
  if g > 1:
    intra = ((g - 1) / g * full_bytes / cluster.intra.bytes_per_s
             + count * (g - 1) * cluster.intra.latency_s)
  if n > 1:
    inter = ((n - 1) / n * full_bytes / g / cluster.inter.bytes_per_s
             + count * (n - 1) * cluster.inter.latency_s)
  return COLLECTIVE_FACTORS[kind] * (intra + inter)


def collectives_seconds(sizes: dict[str, float], cluster: Cluster,
                        counts: dict[str, float] | None = None) -> float:
  """Sum of `collective_seconds` over `{kind: full bytes}`, `counts[kind]` collectives of
  each kind (default one)."""
  counts = counts or {}
  return sum(collective_seconds(kind, size, cluster, counts.get(kind, 1))
             for kind, size in sizes.items())


def step_sizes(profile: StepProfile, num_devices: int) -> dict[str, float]:
  """{kind: full bytes} of one step on `num_devices` (batch b x N)."""
  batch = profile.per_device_batch * num_devices
  out = dict(profile.fixed_collectives)
  for kind, per_example in profile.per_example_collectives.items():
    out[kind] = out.get(kind, 0.0) + per_example * batch
  return out


def input_seconds(batch: int, cluster: Cluster, example_bytes: float) -> float:
  """Host input time per step: each process reads its B/P rows; with P > 1 every row
  goes through the coordinator's key-value store (P x B x example_bytes: each process
  publishes its rows and reads everyone's)."""
  p = cluster.num_nodes
  read = batch / p / cluster.input_examples_per_s
  exchange = p * batch * example_bytes / cluster.coordinator_bytes_per_s if p > 1 else 0.0
  return read + exchange


def predict_step(profile: StepProfile, cluster: Cluster) -> StepTime:
  """The step time and examples/s of `profile` scaled to `cluster` (weak scaling)."""
  batch = profile.per_device_batch * cluster.num_devices
  compute = max(profile.flops / cluster.device_flops,
                profile.bytes_accessed / cluster.device_bytes_per_s)
  coll = collectives_seconds(step_sizes(profile, cluster.num_devices), cluster,
                             profile.collective_counts)
  host = input_seconds(batch, cluster, profile.example_bytes)
  device = compute + coll + cluster.step_overhead_s
  step = max(host, device) if cluster.input_overlaps else host + device
  return StepTime(host, compute, coll, cluster.step_overhead_s, step, batch / step)


def calibrate_compute(profile: StepProfile, cluster: Cluster, device_seconds: float) -> Cluster:
  """`cluster` with `device_flops` (and memory bandwidth, by the same factor) set so the
  predicted device step of `profile` on it takes `device_seconds` (a measured step).

  Raises:
    ValueError: the collectives and overhead alone already take longer, or no FLOPs.
  """
  coll = collectives_seconds(step_sizes(profile, cluster.num_devices), cluster,
                             profile.collective_counts)
  compute = device_seconds - coll - cluster.step_overhead_s
  if compute <= 0 or profile.flops <= 0:
    raise ValueError(f"cannot calibrate: measured step {device_seconds:.3g} s, collectives "
                     f"{coll:.3g} s + overhead {cluster.step_overhead_s:.3g} s, flops {profile.flops}")
  ratio = cluster.device_bytes_per_s / cluster.device_flops
  flops = profile.flops / compute
  return cluster._replace(device_flops=flops,
                          device_bytes_per_s=max(ratio * flops, profile.bytes_accessed / compute))


def fit_link(sizes: Sequence[float], seconds: Sequence[float], kind: str, group: int) -> Link:
  """The ring link (bandwidth, latency per hop) that explains a collective's measured
  times on `group` devices of one level, by least squares on
  t = k [(G-1)/G S / bw + (G-1) lat].

  Raises:
    ValueError: fewer than two sizes, a group of one, or a fit with no positive bandwidth.
  """
  if len(sizes) < 2 or len(sizes) != len(seconds) or group < 2:
    raise ValueError(f"fit_link: need >= 2 (size, seconds) pairs and a group >= 2, got "
                     f"{len(sizes)} sizes, {len(seconds)} times, group {group}")
  k = COLLECTIVE_FACTORS[kind]
  xs = [k * (group - 1) / group * s for s in sizes]  # bytes on the wire
  n = len(xs)
  mx, my = sum(xs) / n, sum(seconds) / n
  var = sum((x - mx) ** 2 for x in xs)
  slope = sum((x - mx) * (y - my) for x, y in zip(xs, seconds, strict=True)) / var if var else 0.0
  if slope <= 0:
    raise ValueError(f"fit_link: times {list(seconds)} do not grow with sizes {list(sizes)}")
  intercept = max(my - slope * mx, 0.0)
  return Link(1.0 / slope, intercept / (k * (group - 1)))


def h100_cluster(num_devices: int, input_examples_per_s: float,
                 coordinator_bytes_per_s: float, devices_per_node: int = 8) -> Cluster:
  """H100-class nodes of 8 GPUs, NVLink 4 inside, 400 Gb/s InfiniBand between (the
  module docstring's assumptions), one process per node."""
  return Cluster(num_devices=num_devices, devices_per_node=devices_per_node,
                 intra=Link(450e9, 2e-6), inter=Link(50e9, 5e-6), device_flops=67e12,
                 device_bytes_per_s=3.35e12, input_examples_per_s=input_examples_per_s,
                 coordinator_bytes_per_s=coordinator_bytes_per_s, step_overhead_s=1e-4)
