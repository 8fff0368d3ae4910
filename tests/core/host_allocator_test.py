"""Tests for sfjax.core.host_allocator: glibc malloc keeps large buffers warm once tuned."""

import ctypes
import platform
import subprocess
import sys
import textwrap

import pytest

from sfjax.core import ConfigError, host_allocator

_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Mallocs, touches and frees a 96 MiB buffer `n` times, as XLA:CPU does with a step's
# temporaries (through malloc, without numpy's huge-page advice, on a worker thread);
# prints the minor page faults of the last n-1 rounds (the first may grow the heap): on
# the main thread with the defaults, then on a thread started after the choice. 96 MiB
# is past a thread heap's 64 MiB, which the tuned settings must also keep warm.
_PROBE = textwrap.dedent("""
    import ctypes, ctypes.util, resource, sys, threading
    from sfjax.core import host_allocator

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    SIZE = 96 << 20

    def round_trip():
      ptr = libc.malloc(SIZE)
      ctypes.memset(ptr, 1, SIZE)
      libc.free(ptr)

    def faults(out, n=5):
      round_trip()
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      for _ in range(n - 1):
        round_trip()
      out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    default = []
    faults(default)
    on = host_allocator.apply_choice(sys.argv[1])
    after = []
    worker = threading.Thread(target=faults, args=(after,))
    worker.start()
    worker.join()
    print(default[0], after[0], on, host_allocator.applied() is not None)
""")


def _probe(choice: str) -> tuple[int, int, bool, bool]:
  out = subprocess.run([sys.executable, "-c", _PROBE, choice], check=True, capture_output=True,
                       text=True, timeout=120).stdout.split()
  return int(out[0]), int(out[1]), out[2] == "True", out[3] == "True"


@pytest.mark.skipif(not _GLIBC, reason="glibc malloc only")
def test_tuned_allocator_reuses_a_large_buffer_instead_of_faulting_it_in_again():
  default, tuned, on, applied = _probe("tuned")
  # Defaults: a 96 MiB buffer is mapped and unmapped each round, 24,576 pages faulted in.
  assert default > 4 * 24_576 * 0.9, default
  assert tuned < default / 20, (default, tuned)
  assert on and applied


@pytest.mark.skipif(not _GLIBC, reason="glibc malloc only")
def test_system_choice_leaves_the_defaults():
  default, system, on, applied = _probe("system")
  assert system > default * 0.9, (default, system)
  assert not on and not applied


def test_mallopt_pairs_disable_mappings_set_pad_and_trim_and_share_one_heap():
  pairs = host_allocator.mallopt_pairs(host_allocator.HostAllocator(1 << 20, 3 << 20))
  # M_MMAP_MAX, M_TOP_PAD, M_TRIM_THRESHOLD, M_ARENA_MAX
  assert pairs == [(-4, 0), (-2, 1 << 20), (-1, 3 << 20), (-8, 1)]


@pytest.mark.parametrize("field,value", [("top_pad_bytes", -1), ("trim_bytes", 2**31),
                                         ("trim_bytes", True)])
def test_out_of_range_settings_name_the_field(field, value):
  with pytest.raises(ValueError, match=f"HostAllocator.{field}"):
    host_allocator.mallopt_pairs(host_allocator.HostAllocator()._replace(**{field: value}))


def test_unknown_choice_names_the_config_field():
  with pytest.raises(ConfigError, match=r"train\.host_allocator: must be one of"):
    host_allocator.apply_choice("jemalloc")


def test_zero_bytes_are_valid_settings():
  assert host_allocator.mallopt_pairs(host_allocator.HostAllocator(0, 0))[1:3] == [(-2, 0), (-1, 0)]


@pytest.fixture
def fake_mallopt(monkeypatch):
  """An untuned module whose mallopt records its calls (the process's malloc untouched)."""
  calls = []
  monkeypatch.setattr(host_allocator, "_applied", [])
  monkeypatch.setattr(host_allocator, "_mallopt", lambda: lambda p, v: calls.append((p, v)) or 1)
  return calls


def test_tune_sets_every_pair_once(fake_mallopt):
  settings = host_allocator.HostAllocator(4096, 8192)
  assert host_allocator.tune(settings)
  assert fake_mallopt == host_allocator.mallopt_pairs(settings)
  assert host_allocator.applied() == settings
  assert host_allocator.tune() and len(fake_mallopt) == 4  # a later call changes nothing
  assert host_allocator.applied() == settings


def test_apply_choice_tunes_only_when_tuned(fake_mallopt):
  assert not host_allocator.apply_choice("system")
  assert fake_mallopt == [] and host_allocator.applied() is None
  assert host_allocator.apply_choice("tuned")
  assert fake_mallopt == host_allocator.mallopt_pairs(host_allocator.HostAllocator())
  assert host_allocator.apply_choice("system")  # tuned earlier: still in effect


def test_a_refused_setting_raises_and_is_not_recorded(monkeypatch):
  monkeypatch.setattr(host_allocator, "_applied", [])
  monkeypatch.setattr(host_allocator, "_mallopt", lambda: lambda p, v: 0)
  with pytest.raises(RuntimeError, match=r"mallopt\(-4, 0\) refused"):
    host_allocator.tune()
  assert host_allocator.applied() is None


def test_without_glibc_nothing_is_tuned(monkeypatch):
  monkeypatch.setattr(host_allocator, "_applied", [])
  monkeypatch.setattr(host_allocator, "_mallopt", lambda: None)
  assert not host_allocator.tune() and host_allocator.applied() is None


@pytest.mark.parametrize("system,libc", [("Darwin", ("glibc", "2.36")), ("Linux", ("musl", ""))])
def test_mallopt_is_looked_up_only_on_linux_with_glibc(monkeypatch, system, libc):
  monkeypatch.setattr(host_allocator.platform, "system", lambda: system)
  monkeypatch.setattr(host_allocator.platform, "libc_ver", lambda: libc)
  assert host_allocator._mallopt() is None


@pytest.mark.skipif(not _GLIBC, reason="glibc malloc only")
def test_glibc_mallopt_is_found_with_its_c_signature():
  fn = host_allocator._mallopt()
  assert fn is not None and fn.restype is ctypes.c_int
  assert fn.argtypes == (ctypes.c_int, ctypes.c_int)


def test_choice_of_reads_the_train_block_and_defaults_to_tuned():
  assert host_allocator.choice_of({"host_allocator": "system"}) == "system"
  assert host_allocator.choice_of({}) == "tuned"  # a config from before the field
