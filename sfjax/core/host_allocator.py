"""The host allocator's settings for a training process (glibc malloc, issue #27).

XLA:CPU allocates each step's temporaries as one buffer (61 MB for the benchmark's
DeepFM step at batch 4096, 69 MB for the plain-JAX floor's), on whichever worker thread
runs the step. With glibc's defaults a buffer that size is above the mmap threshold
(at most 32 MiB) or past a thread heap's 64 MiB, so every step maps fresh pages and
unmaps them again: ~15,000-19,000 page faults and the zeroing of every page, inside
the step, on the cores the step runs on.

`tune()` sets, through `mallopt`:

  * M_MMAP_MAX = 0: no allocation is served by a private mapping; large buffers come
    from the heap and go back to it, so the next step reuses warm pages;
  * M_TOP_PAD: the heap grows by this much beyond each request (fewer brk calls);
  * M_TRIM_THRESHOLD: free memory at the top of a heap is returned to the system
    only past this size (so the step's buffer is not returned and faulted in again);
  * M_ARENA_MAX = 1: threads that allocate for the first time after this share the
    main heap. A thread heap holds at most 64 MiB, and glibc maps a larger request
    on such a thread even with M_MMAP_MAX = 0: without it the floor's 69 MB buffer
    kept faulting (19,000 faults, 78 ms per step; 0 faults and 63 ms with it).
    Threads that allocated before keep their heaps, so it is applied before the data
    set and the model are built (`run_training`, `build_trainer`).

Measured on a 2-core Xeon (`bench_train`, batch 4096, same machine, separate runs):
the device backend's step 73-76 ms with glibc's defaults, 53-56 ms tuned (end to end
52-54k -> 68-73k examples/s); the cache backend's 82-84 ms -> 62-66 ms (43-44k ->
52-55k); the floor's 78 -> 58-63 ms. Training results are unchanged (same AUC).

Memory: freed memory stays in the process up to `trim_bytes` at the heap's top (and
in holes below it) instead of being unmapped at once; memory-mapped host tables are
mapped by numpy, not malloc, and are unaffected. It is process-wide, takes effect for
later allocations, and is a no-op where the C library is not glibc (macOS, musl).
`train.host_allocator = 'system'` leaves the defaults (in a process not tuned before).
"""

from __future__ import annotations

import ctypes
import platform
import threading
from typing import NamedTuple

from sfjax.core.errors import ConfigError

CHOICES = ("tuned", "system")

# glibc <malloc.h> parameter numbers.
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8

_lock = threading.Lock()
_applied: list[HostAllocator] = []


class HostAllocator(NamedTuple):
  """glibc malloc settings (module docstring).

  Attributes:
    top_pad_bytes: M_TOP_PAD, extra bytes the heap grows by.
    trim_bytes: M_TRIM_THRESHOLD, free bytes at a heap's top kept before trimming.
  """

  top_pad_bytes: int = 256 << 20
  trim_bytes: int = 1 << 30


def _mallopt():
  """glibc's `mallopt`, or None where the C library is not glibc."""
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return None
  libc = ctypes.CDLL(None)  # the process's own symbols, glibc's malloc among them
  fn = getattr(libc, "mallopt", None)
  if fn is not None:
    fn.argtypes, fn.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
  return fn


def mallopt_pairs(settings: HostAllocator) -> list[tuple[int, int]]:
  """The `(mallopt parameter, value)` pairs of `settings`, in the order they are set.

  Raises:
    ValueError: a byte count below 0 or past a C int.
  """
  for name in ("top_pad_bytes", "trim_bytes"):
    value = getattr(settings, name)
    if isinstance(value, bool) or not 0 <= int(value) < 2**31:
      raise ValueError(f"HostAllocator.{name}: must be in [0, 2**31), got {value!r}")
  return [(_M_MMAP_MAX, 0), (_M_TOP_PAD, int(settings.top_pad_bytes)),
          (_M_TRIM_THRESHOLD, int(settings.trim_bytes)), (_M_ARENA_MAX, 1)]


def tune(settings: HostAllocator | None = None) -> bool:
  """Applies `settings` (None: `HostAllocator()`) to glibc malloc, once per process (a
  later call is a no-op).

  Returns:
    True when glibc accepted every setting (now or at an earlier call); False where
    the C library is not glibc.

  Raises:
    RuntimeError: glibc refused a setting.
  """
  settings = HostAllocator() if settings is None else settings
  pairs = mallopt_pairs(settings)
  with _lock:
    if _applied:
      return True
    mallopt = _mallopt()
    if mallopt is None:
      return False
    for param, value in pairs:
      if mallopt(param, value) != 1:
        raise RuntimeError(f"host allocator: mallopt({param}, {value}) refused")
    _applied.append(settings)
    return True


def applied() -> HostAllocator | None:
  """The settings `tune` applied in this process, or None."""
  return _applied[0] if _applied else None


def choice_of(train_config) -> str:
  """`train.host_allocator` of a config's `train` block ('tuned' for a block without it)."""
  return train_config.get("host_allocator", CHOICES[0])


def apply_choice(choice: str) -> bool:
  """`train.host_allocator`: 'tuned' -> `tune()`; 'system' -> nothing. Returns whether
  the tuned settings are in effect.

  Raises:
    ConfigError: an unknown choice.
  """
  if choice not in CHOICES:
    raise ConfigError(f"config field train.host_allocator: must be one of {CHOICES}, "
                     f"got {choice!r}")
  return tune() if choice == "tuned" else applied() is not None
