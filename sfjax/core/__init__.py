"""sfjax.core: the small shared base every subpackage may import (and nothing else of sfjax).

Errors that name the bad place, the per-step device input type, SplitMix64 hashing,
background pipeline stages, exact metrics, atomic file writes, JSON-lines and
TensorBoard event files, the quiet console of the entry points, the workdir lock (one
owner per workdir), the glibc malloc settings of a training process and the environment
of fake CPU devices that cannot deadlock (`host_devices`), and the library XLA:CPU's train steps
compute their dots with (`xla_cpu_dots`).
"""

from sfjax.core.atomic import atomic_write, fsync_directory
from sfjax.core.background import BackgroundIterator, map_in_background
from sfjax.core.console import set_up_console
from sfjax.core.entries import named_entries
from sfjax.core.errors import ConfigError, DataFormatError, closest_name, unknown_key_error
from sfjax.core.feature_layout import POOLINGS
from sfjax.core.hashing import splitmix64, splitmix64_in_place
from sfjax.core.host_allocator import HostAllocator
from sfjax.core.host_allocator import applied as tuned_host_allocator
from sfjax.core.host_allocator import tune as tune_host_allocator
from sfjax.core.host_devices import (
  device_count_flag,
  fake_device_env,
  guard_launch_threads,
  launch_threads,
)
from sfjax.core.jsonl import read_jsonl
from sfjax.core.metrics import auc, logloss, sigmoid
from sfjax.core.tensorboard import EventWriter, read_scalars
from sfjax.core.types import DeviceBatch
from sfjax.core.workdir_lock import WorkdirLock, WorkdirLockedError, hold_workdir
from sfjax.core.xla_cpu_dots import compiler_options as xla_cpu_compiler_options
from sfjax.core.xla_cpu_dots import resolve as resolve_xla_cpu_dots
from sfjax.core.xla_cpu_dots import unrecorded as without_xla_cpu_dots

__all__ = [
  "POOLINGS",
  "BackgroundIterator",
  "ConfigError",
  "DataFormatError",
  "DeviceBatch",
  "EventWriter",
  "HostAllocator",
  "WorkdirLock",
  "WorkdirLockedError",
  "atomic_write",
  "auc",
  "closest_name",
  "device_count_flag",
  "fake_device_env",
  "fsync_directory",
  "guard_launch_threads",
  "hold_workdir",
  "launch_threads",
  "logloss",
  "map_in_background",
  "named_entries",
  "read_jsonl",
  "read_scalars",
  "resolve_xla_cpu_dots",
  "set_up_console",
  "sigmoid",
  "splitmix64",
  "splitmix64_in_place",
  "tune_host_allocator",
  "tuned_host_allocator",
  "unknown_key_error",
  "without_xla_cpu_dots",
  "xla_cpu_compiler_options",
]
