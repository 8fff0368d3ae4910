"""Many processes (hosts) on `jax.distributed`: start-up, the process's part of a batch,
and agreement across processes (DESIGN.md §3).

JAX's multi-controller runtime is the engine: every process runs the same program on
its own devices; arrays span the global ('data',) mesh (`mesh.make_mesh`), whose
positions `[p*L, (p+1)*L)` are process p's L devices. So process p holds rows
`[p*B/P, (p+1)*B/P)` of every array split on 'data' (`process_rows`), and a whole copy
of every replicated one.

Start-up (`initialize_distributed`), before anything touches a JAX backend:
  explicit   `distributed.coordinator=HOST:PORT`, `distributed.num_processes=P`,
             `distributed.process_id=I` (the same command on every host, I = 0..P-1);
  env        the fields empty and `JAX_COORDINATOR_ADDRESS` set: `JAX_NUM_PROCESSES` and
             `JAX_PROCESS_ID` give P and I (JAX reads the address itself);
  auto       `distributed.auto_detect=True`: JAX's own cluster detection (SLURM, Open MPI,
             Kubernetes, Cloud TPU) fills what is unset;
  otherwise  one process; nothing is started.
On CPU the cross-process collectives go through gloo.

Failures end instead of hanging (issue #24): `jax.distributed.initialize` waits at most
`distributed.timeout_s` for every process to join; process 0's coordinator binds the
address it was given (`distributed.bind_address`, default the coordinator's own
HOST:PORT: loopback when the processes are local; never every interface unless asked);
the agreement checks and `failed_processes` are timed barriers (`barriers`), and a
watchdog ends a process whose peer died or left mid-run (`watchdog`), naming the peer
and the phase.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils

from sfjax.core.errors import ConfigError
from sfjax.parallel import barriers, watchdog

# Environment variables read when the distributed.* fields are empty.
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
# Read (by JAX too) when distributed.bind_address is empty.
ENV_BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"


class Settings(NamedTuple):
  """How this process joins the run.

  Attributes:
    coordinator: "HOST:PORT" of process 0's coordinator service ('' = none / auto).
    num_processes: P (0 = one process, or unknown under auto detection).
    process_id: this process's index I in [0, P) (-1 = unknown under auto detection).
    auto_detect: let JAX detect the cluster (SLURM, Open MPI, Kubernetes, Cloud TPU).
    timeout_s: bound of every cross-process wait (start-up, barriers, a silent peer).
    bind_address: "HOST:PORT" process 0's coordinator listens on ('' = `coordinator`).
  """

  coordinator: str
  num_processes: int
  process_id: int
  auto_detect: bool
  timeout_s: float = barriers.DEFAULT_TIMEOUT_S
  bind_address: str = ""

  @property
  def enabled(self) -> bool:
    """True when `jax.distributed.initialize` is to be called."""
    return bool(self.coordinator) or self.auto_detect


def _env_int(name: str) -> int | None:
  text = os.environ.get(name, "").strip()
  if not text:
    return None
  try:
    return int(text)
  except ValueError:
    raise ConfigError(f"environment variable {name}: expected an integer, got {text!r}") from None


def distributed_settings(config) -> Settings:
  """The `distributed` block of `config` (absent: one process), completed from the
  environment variables when its fields are empty.

  Raises:
    ConfigError: naming the field (or environment variable) that is missing or invalid.
  """
  block = config.get("distributed", None) if hasattr(config, "get") else None
  get = (lambda k, d: block.get(k, d)) if block is not None else (lambda k, d: d)
  coordinator, num, pid = get("coordinator", ""), get("num_processes", 0), get("process_id", -1)
  auto = get("auto_detect", False)
  timeout, bind = get("timeout_s", barriers.DEFAULT_TIMEOUT_S), get("bind_address", "")
  if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
    raise ConfigError(f"config field distributed.timeout_s: must be a number > 0, got {timeout!r}")
  if not isinstance(bind, str) or (bind and not _is_host_port(bind)):
    raise ConfigError(f"config field distributed.bind_address: expected HOST:PORT, got {bind!r}")
  if not isinstance(coordinator, str):
    raise ConfigError(f"config field distributed.coordinator: expected HOST:PORT, got {coordinator!r}")
  if not isinstance(auto, bool):
    raise ConfigError(f"config field distributed.auto_detect: must be True or False, got {auto!r}")
  for field, value in (("num_processes", num), ("process_id", pid)):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
      raise ConfigError(f"config field distributed.{field}: must be an integer, got {value!r}")
  src = "config field distributed"
  if not coordinator and os.environ.get(ENV_COORDINATOR, "").strip():
    coordinator, src = os.environ[ENV_COORDINATOR].strip(), "environment variable"
    num = num or (_env_int(ENV_NUM_PROCESSES) or 0)
    pid = pid if pid >= 0 else (_env_int(ENV_PROCESS_ID) if _env_int(ENV_PROCESS_ID) is not None
                                else -1)
  if coordinator:
    if not _is_host_port(coordinator):
      raise ConfigError(f"config field distributed.coordinator: expected HOST:PORT, got "
                        f"{coordinator!r}")
    if not auto:
      num_name = ENV_NUM_PROCESSES if src.startswith("env") else "distributed.num_processes"
      pid_name = ENV_PROCESS_ID if src.startswith("env") else "distributed.process_id"
      if num < 1:
        raise ConfigError(f"{src} {num_name}: required (>= 1) with a coordinator, got {num}")
      if not 0 <= pid < num:
        raise ConfigError(f"{src} {pid_name}: must be in [0, {num}) with "
                          f"num_processes={num}, got {pid}")
  elif (num > 1 or pid >= 0) and not auto:
    raise ConfigError("config field distributed.coordinator: required (HOST:PORT of process 0) "
                      f"when distributed.num_processes={num} / distributed.process_id={pid} are set")
  return Settings(coordinator, int(num), int(pid), auto, float(timeout), bind)


def _is_host_port(text: str) -> bool:
  host, _, port = text.rpartition(":")
  return bool(host) and port.isdigit()


def initialize_distributed(config) -> int:
  """Joins the run `config.distributed` (or the environment) describes; returns the
  number of processes.

  Call it first, before anything touches a JAX backend (`jax.devices()`, an array). A
  second call with the same settings does nothing.

  Every wait is bounded by `distributed.timeout_s`: the start-up (every process must
  join within it), the later barriers (`barriers.set_timeout`) and a silent peer (the
  `watchdog` this starts; jax's own heartbeat check, at twice the bound, is the backstop).

  Raises:
    ConfigError: invalid settings (`distributed_settings`), or a backend already started by this
      process before a distributed run was asked for.
    barriers.PeerFailureError: not every process joined within `distributed.timeout_s`.
  """
  s = distributed_settings(config)
  barriers.set_timeout(s.timeout_s)
  if not s.enabled:
    return jax.process_count() if jax.distributed.is_initialized() else 1
  if jax.distributed.is_initialized():
    if s.num_processes and jax.process_count() != s.num_processes:
      raise ConfigError(f"config field distributed.num_processes={s.num_processes}, but this "
                        f"process already joined a run of {jax.process_count()}")
    return jax.process_count()
  # CPU devices talk across processes through gloo (harmless for GPU/TPU backends).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  s, local_device_ids = _detected(s)
  seconds = int(np.ceil(s.timeout_s))
  try:
    jax.distributed.initialize(
        coordinator_address=s.coordinator or None,
        num_processes=s.num_processes or None,
        process_id=s.process_id if s.process_id >= 0 else None, local_device_ids=local_device_ids,
        initialization_timeout=seconds, heartbeat_timeout_seconds=2 * seconds + 10,
        shutdown_timeout_seconds=seconds, coordinator_bind_address=bind_address(s))
  except RuntimeError as err:
    if "before" in str(err) or "backend" in str(err).lower():
      raise ConfigError(f"config field distributed.coordinator: jax.distributed could not start "
                        f"({err}); initialize before anything uses JAX") from err
    if "DEADLINE_EXCEEDED" in str(err) or "timed out" in str(err).lower():
      raise barriers.PeerFailureError(
          f"process {s.process_id} could not join the run of {s.num_processes or '?'} processes at "
          f"{s.coordinator or '(auto-detected)'} within {s.timeout_s:g} s (phase 'start-up'): "
          f"{str(err).splitlines()[0]}") from err
    raise
  watchdog.start_watchdog(s.timeout_s)
  watchdog.set_base_phase("running, before this run's first checkpoint")
  return jax.process_count()


def bind_address(s: Settings) -> str | None:
  """The HOST:PORT process 0's coordinator listens on: `distributed.bind_address`, else
  `JAX_COORDINATOR_BIND_ADDRESS`, else the coordinator address itself (so loopback stays
  loopback; JAX's own default is every interface, `[::]:PORT`). None: unknown yet (auto
  detection that found no coordinator: JAX then fails to start and says why)."""
  return s.bind_address or os.environ.get(ENV_BIND_ADDRESS, "").strip() or s.coordinator or None


def _detected(s: Settings) -> tuple[Settings, Any]:
  """`s` with what JAX's cluster detection (SLURM, Open MPI, Kubernetes...) finds filled in
  when `auto_detect` is on, so the coordinator's bind address is known before it starts;
  and the local device ids the detection assigns this process (None: all)."""
  if not s.auto_detect:
    return s, None
  from jax._src import clusters  # the detection `jax.distributed.initialize` runs itself

  coordinator, num, pid, local_device_ids = clusters.ClusterEnv.auto_detect_unset_distributed_params(
      s.coordinator or None, s.num_processes or None,
      s.process_id if s.process_id >= 0 else None, None, None, int(np.ceil(s.timeout_s)))
  return s._replace(coordinator=coordinator or "", num_processes=num or 0,
                    process_id=pid if pid is not None else -1), local_device_ids


def is_main_process() -> bool:
  """True on process 0, the one that writes metrics, the final JSON and reports."""
  return jax.process_index() == 0


def process_path(path: str) -> str:
  """This process's own directory under `path` (e.g. `embedding.host_path`, an mmap host
  table): `path/process-<i>` in a run of several processes, so two never share one;
  `path` itself for one process."""
  return os.path.join(path, f"process-{jax.process_index()}") if jax.process_count() > 1 else path


def process_rows(global_size: int) -> slice:
  """This process's rows `[p*n/P, (p+1)*n/P)` of an axis of `global_size` split on 'data'.

  Raises:
    ValueError: `global_size` is not a multiple of the process count.
  """
  count, index = jax.process_count(), jax.process_index()
  if global_size % count:
    raise ValueError(f"{global_size} rows cannot be split evenly over {count} processes")
  per = global_size // count
  return slice(index * per, (index + 1) * per)


def put_global(tree: Any, shardings: Any) -> Any:
  """Global arrays of a host pytree whose leaves hold the whole (global) value on every
  process: a leaf split on 'data' is built from this process's rows only
  (`jax.make_array_from_process_local_data`), a replicated leaf from its whole value.

  One process: `jax.device_put` (the same arrays).
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)

  def put(x, sharding):
    if x is None:  # an absent optional field (a DeviceBatch's weights without a layout)
      return None
    x = np.asarray(x)
    if sharding.is_fully_replicated:
      return jax.make_array_from_process_local_data(sharding, x, x.shape)
    return jax.make_array_from_process_local_data(sharding, x[process_rows(x.shape[0])], x.shape)

  return jax.tree.map(put, tree, shardings, is_leaf=lambda x: x is None)


def local_rows(x: jax.Array) -> np.ndarray:
  """This process's rows of a global array split on its leading axis (the whole array on
  one process, or when it is replicated), as numpy."""
  if x.is_fully_addressable or x.sharding.is_fully_replicated:
    full = np.asarray(x)
    return full if jax.process_count() == 1 or x.is_fully_addressable else full[
        process_rows(full.shape[0])]
  shards: dict[int, np.ndarray] = {}
  for shard in x.addressable_shards:
    start = shard.index[0].start or 0
    shards.setdefault(start, np.asarray(shard.data))
  return np.concatenate([shards[k] for k in sorted(shards)])


def allgather_rows(x: np.ndarray) -> np.ndarray:
  """Every process's `x` concatenated in process order on the leading axis (one
  process: `x`). Shapes must agree across processes."""
  if jax.process_count() == 1:
    return np.asarray(x)
  return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=True))


def broadcast(x: Any) -> Any:
  """Process 0's value of a pytree of arrays on every process (one process: `x`)."""
  if jax.process_count() == 1:
    return x
  return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(x))


def _fingerprint(*arrays: np.ndarray) -> np.ndarray:
  """16-byte digest of the arrays' bytes, shapes and dtypes, as uint8 [16]."""
  h = hashlib.blake2b(digest_size=16)
  for a in arrays:
    a = np.ascontiguousarray(a)
    h.update(str((a.shape, a.dtype.str)).encode())
    h.update(a.tobytes())
  return np.frombuffer(h.digest(), np.uint8).copy()


def check_agreement(what: str, *arrays: np.ndarray) -> None:
  """Raises RuntimeError naming `what` unless every process holds the same `arrays`
  (compares fingerprints through a timed barrier, `barriers.exchange`: the first
  cross-process wait of a run; one process: nothing to check).

  Raises:
    RuntimeError: the processes disagree.
    barriers.PeerFailureError: a process did not arrive within `distributed.timeout_s`.
  """
  if jax.process_count() == 1:
    return
  prints = barriers.exchange(f"agreement on {what}", _fingerprint(*arrays).tobytes().hex())
  differ = [p for p in range(len(prints)) if prints[p] != prints[0]]
  if differ:
    raise RuntimeError(f"processes disagree on {what}: processes {differ} differ from process 0 "
                       "(same config, data and seed on every host?)")


def put_process_blocks(x: np.ndarray, sharding) -> jax.Array:
  """A global `[D, *x.shape]` array split on 'data' (`sharding`) whose block on this
  process's first device is `x` and whose other blocks are zeros: its sum over axis 0
  (one all-reduce inside a jitted step) is the sum of every process's `x`.

  With each row owned by one process and zeros elsewhere, that sum assembles the rows
  of all processes exactly (x + 0 = x). One process: `x` on its first device.
  """
  x = np.asarray(x)
  per_process = jax.local_device_count()
  local = np.zeros((per_process, *x.shape), x.dtype)
  local[0] = x
  global_shape = (per_process * jax.process_count(), *x.shape)
  if jax.process_count() == 1:
    return jax.device_put(local, sharding)
  return jax.make_array_from_process_local_data(sharding, local, global_shape)


def failed_processes(ok: bool, what: str = "a flag exchange") -> list[int]:
  """The processes whose `ok` is False (every process calls it: it is also a barrier
  named `what`, timed: `barriers.exchange`). One process: `[0]` if not ok, else `[]`.

  Raises:
    barriers.PeerFailureError: a process did not arrive within `distributed.timeout_s`.
  """
  if jax.process_count() == 1:
    return [] if ok else [0]
  flags = barriers.exchange(what, "1" if ok else "0")
  return [p for p, flag in enumerate(flags) if flag != "1"]
