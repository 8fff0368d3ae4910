"""The library XLA:CPU computes a train step's dots with (`train.xla_cpu_dots`, issue #27).

jaxlib 0.10.2 compiles CPU dots (and some reductions and elementwise ops beside them) as
YNNPACK fusions (`__ynn_fusion` in a compiled program's text). With the compiler option
`xla_cpu_experimental_ynn_fusion_type` set to '' for one compilation, XLA:CPU computes
them with Eigen instead. On a 2-core AMD EPYC (Zen 4, KVM; 2026-12-07), the benchmark's
DeepFM step (batch 4096, MLP 400-400-400), compiled both ways in one process and
alternated step by step: 76.8 / 79.4 ms with YNNPACK, 68.3 / 70.7 ms with Eigen (12%
faster; the plain-JAX floor's step 14-15% faster). Not measured on Intel CPUs, so 'auto'
keeps XLA's own choice there.

  'auto'   Eigen on AMD CPUs (`vendor_id` AuthenticAMD in /proc/cpuinfo), else 'xla'
  'eigen'  Eigen dots
  'xla'    XLA's default (YNNPACK in jaxlib 0.10.2)

The choice changes float rounding only (the sums run in another order), not results
beyond it. It is applied on CPU devices (`compiler_options` returns {} for other
platforms) to the trainer's train steps (device and cache backends; `train.xla_cpu_dots`)
and to the AutoML programs of a task (`task.xla_cpu_dots` of a search, `CTRTask.xla_cpu_dots`:
the cohort programs, the host-table cohort step, AutoFIS's and AutoGroup's runners;
a cohort of 8 DeepFM trials with 400-wide towers, batch 1024, on the same AMD machine:
6.8-7.1 s with YNNPACK, 5.6-6.3 s with Eigen), and to the pipeline's compress step
(its Prune-EA search, with the trained model's `train.xla_cpu_dots`; `bench_compress`:
12.2-12.5 s against 10.1-10.6 s). The vision programs keep XLA's default: the digits
CNN's 200 steps of 64 images took 1.03-1.08 s with YNNPACK and 1.22-1.39 s with Eigen
(convolutions, not dots, dominate there). Records of what a run's results depend on (a
search's or a pipeline's settings) leave the field out (`unrecorded`), so a workdir
resumes under another choice, on other hardware.
"""

from __future__ import annotations

import functools

from sfjax.core.errors import ConfigError

CHOICES = ("auto", "eigen", "xla")
CONFIG_KEY = "xla_cpu_dots"  # the field's name: `train.xla_cpu_dots`, a search's `task.xla_cpu_dots`
YNN_FUSION_TYPE = "xla_cpu_experimental_ynn_fusion_type"  # XLA's option: '' = no YNNPACK fusion
AMD = "AuthenticAMD"


def cpu_vendor(cpuinfo_path: str = "/proc/cpuinfo") -> str:
  """The CPU's `vendor_id` ('AuthenticAMD', 'GenuineIntel', ...); '' where unknown."""
  try:
    with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
          return value.strip()
  except OSError:
    pass
  return ""


@functools.lru_cache(maxsize=1)
def _this_cpu_vendor() -> str:
  return cpu_vendor()


def dots_choice(train_config) -> str:
  """`train.xla_cpu_dots` of a config's `train` block ('auto' for a block without it)."""
  return train_config.get("xla_cpu_dots", CHOICES[0])


def resolve(choice: str, vendor: str | None = None) -> str:
  """'eigen' or 'xla': what `choice` means on a CPU of `vendor` (None: this machine's).

  Raises:
    ConfigError: `choice` is not one of `CHOICES`.
  """
  if choice not in CHOICES:
    raise ConfigError(f"config field train.xla_cpu_dots: {choice!r} is not one of "
                      f"{', '.join(map(repr, CHOICES))}")
  if choice != "auto":
    return choice
  return "eigen" if (_this_cpu_vendor() if vendor is None else vendor) == AMD else "xla"


def compiler_options(choice: str, platform: str, vendor: str | None = None) -> dict[str, str]:
  """The `jax.jit` compiler options of a train step compiled for `platform` ('cpu', 'gpu',
  ...) under `choice` (checked whatever the platform): {} unless it resolves to Eigen on a
  CPU."""
  if resolve(choice, vendor) == "xla" or platform != "cpu":
    return {}
  return {YNN_FUSION_TYPE: ""}


def unrecorded(tree):
  """`tree` (nested dicts, lists and leaves) without a `CONFIG_KEY` entry at any depth: the
  part of a config that a record of what results depend on keeps."""
  if isinstance(tree, dict):
    return {k: unrecorded(v) for k, v in tree.items() if k != CONFIG_KEY}
  if isinstance(tree, list):
    return [unrecorded(v) for v in tree]
  return tree
