"""Fake CPU devices (`--xla_force_host_platform_device_count=N`) without the launch deadlock.

XLA:CPU runs each device's part of a multi-device program as a task of ONE thread pool
(`XLAPjRtCpuClient`, also the size of its intra-op pool) of `max(cores, N)` threads, where
`PJRT_NPROC`, when set, stands for the cores. A device's task holds its thread until the
program ends there, and the next program's tasks are launched onto the same pool while the
current one runs: with only N threads, those launches can hold the threads that the
current program's last devices need to reach its collective, and the process hangs in the
collective forever (XLA logs "Expected N threads to join the rendezvous, but not all of them
arrived"). On a 2-core machine with 8 fake devices a jitted step with an all-reduce,
dispatched ahead 300 times, hung in every run (2 of 2 on a quiet machine, 3 of 3 under
load), and so did, rarely, the AutoML notebook under the test suite; with `PJRT_NPROC`
15 it still hung (2 of 2), with 16 (= 2N) and above it never did (1,500 steps dispatched
ahead, two processes at once, 3 of 3; 2026-12-06). A machine with at least 2N cores never
sees it.

So whatever starts fake CPU devices sets `PJRT_NPROC` to `launch_threads(N)` = max(cores,
4N), twice the measured minimum, unless it is already set: the test suite
(`tests/conftest.py`), the local multi-process launchers, `bench_scaling`, and every
`experiments` entry point (`guard_launch_threads`, for an `XLA_FLAGS` the user set). It must
happen before JAX starts its CPU backend (the first computation or `jax.devices()`), as the
pool is made then; `guard_launch_threads` says when it came too late.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, MutableMapping

from absl import logging

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
LAUNCH_THREADS_ENV = "PJRT_NPROC"  # XLA:CPU's pool size stands in for the cores
_COUNT = re.compile(re.escape(DEVICE_COUNT_FLAG) + r"=(\d+)")


def launch_threads(devices: int) -> int:
  """XLA:CPU launch threads for `devices` fake CPU devices: max(cores, 4 x devices)."""
  return max(os.cpu_count() or 1, 4 * int(devices))


def device_count_flag(xla_flags: str) -> int | None:
  """The fake CPU device count an `XLA_FLAGS` value asks for (the last one given), or None."""
  counts = _COUNT.findall(xla_flags or "")
  return int(counts[-1]) if counts else None


def fake_device_env(devices: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
  """A copy of `env` (default: this process's environment) for a process of `devices` fake
  CPU devices: `XLA_FLAGS` with the count (replacing any other count; other flags kept) and
  `PJRT_NPROC` at least `launch_threads(devices)` (a larger value already set is kept).

  Raises:
    ValueError: `devices` < 1.
  """
  if int(devices) < 1:
    raise ValueError(f"fake CPU devices: the count must be >= 1, got {devices}")
  out = dict(os.environ if env is None else env)
  flags = _COUNT.sub("", out.get("XLA_FLAGS", "")).split()
  out["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_COUNT_FLAG}={int(devices)}"])
  out[LAUNCH_THREADS_ENV] = str(max(launch_threads(devices), _set_threads(out) or 0))
  return out


def _set_threads(env: Mapping[str, str]) -> int | None:
  value = env.get(LAUNCH_THREADS_ENV, "")
  return int(value) if value.strip().isdigit() else None


def guard_launch_threads(env: MutableMapping[str, str] | None = None) -> int | None:
  """Sets `PJRT_NPROC` in `env` (default `os.environ`) to `launch_threads(N)` when its
  `XLA_FLAGS` asks for N > 1 fake CPU devices and `PJRT_NPROC` is not set; returns the value
  set, else None. Logs a warning when JAX's CPU backend already runs (too late to matter)."""
  own = env is None
  env = os.environ if env is None else env
  devices = device_count_flag(env.get("XLA_FLAGS", ""))
  if devices is None or devices < 2 or _set_threads(env) is not None:
    return None
  threads = launch_threads(devices)
  env[LAUNCH_THREADS_ENV] = str(threads)
  if own and _backend_started():
    logging.warning("%s=%d set after JAX started its CPU backend: %d fake devices may hang in "
                    "a collective; set it before the first computation", LAUNCH_THREADS_ENV,
                    threads, devices)
  return threads


def _backend_started() -> bool:
  if "jax" not in sys.modules:  # sfjax.core imports no JAX (tests/conftest.py needs that)
    return False
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel  (no public accessor)
  return bool(xla_bridge.backends_are_initialized())
