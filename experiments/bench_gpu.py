"""Every speed figure of sfjax in one command, for a GPU machine: one JSON file.

  python -m experiments.bench_gpu --config.out=gpu_figures.json       # on the GPU machine
  python -m experiments.bench_gpu --config=experiments/configs/bench_gpu.py:smoke \\
      --config.out=/tmp/smoke.json                                     # tiny sizes, CPU is fine

Runs, each as its own subprocess (its own JAX runtime, so one benchmark's memory or
crash cannot spoil the next) with a time limit:

  train      bench_train, backend both: the trainer's pipelined step with the whole table
             on device vs the MixCache (5% cache on the accelerator, host table in RAM,
             table 20x the cache), interleaved rounds, medians; plus the step/floor ratio
             against the plain-JAX floor (experiments/floor_deepfm.py)
  input      bench_input: text lines/s vs binary shard examples/s (host only)
  scaling    bench_scaling: 1, 2, 4, ... up to every visible GPU, replicated vs row-sharded
             cache, VSI on/off (on CPU: 2 fake devices, volume and correctness only)
  trials     bench_trials: trials/hour of sequential trials vs vmapped cohorts

The whole run is sized to finish in under 8 minutes on one H200; a benchmark that runs
past its limit or fails is recorded with the reason and the tail of its stderr, and the
others still run. Without a GPU the figures are CPU figures, and the JSON says so
(`platform`), with what it skipped and why. `run(config)` returns the figures; the command
ends stdout with them as one JSON line (also written to `config.out`).

Old flag -> config field: `--smoke` -> the ':smoke' variant (`config.smoke=True`),
`--only=a,b` -> `--config.only=a,b`, `--out` -> `--config.out`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import ml_collections

from experiments import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = ("train", "input", "scaling", "trials")


def probe_devices() -> dict:
  """Platform and device count of the default JAX backend, probed in a subprocess (the
  parent never initialises a backend, so it holds no accelerator memory)."""
  code = "import jax; d = jax.devices(); print(d[0].platform, len(d), d[0].device_kind)"
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                     cwd=ROOT)
  if r.returncode != 0:
    return {"platform": "unknown", "devices": 0, "device_kind": "", "error": r.stderr[-500:]}
  platform, count, kind = r.stdout.strip().splitlines()[-1].split(" ", 2)
  return {"platform": platform, "devices": int(count), "device_kind": kind}


def device_counts(visible: int) -> list[int]:
  """1, 2, 4, ... up to `visible`, plus `visible` itself."""
  counts, n = [], 1
  while n <= visible:
    counts.append(n)
    n *= 2
  if visible and counts[-1] != visible:
    counts.append(visible)
  return counts


def bench_command(name: str, variant: str = "", **overrides) -> list[str]:
  """`experiments.bench_<name>` with its config file (`variant` after ':') and overrides."""
  config = cli.config_path(f"bench_{name}") + (f":{variant}" if variant else "")
  return [f"experiments.bench_{name}", f"--config={config}",
          *(f"--config.{field}={value}" for field, value in overrides.items())]


def plan(smoke: bool, platform: str, visible: int) -> dict[str, tuple[list[str], int]]:
  """benchmark -> (its module and flags, time limit in seconds)."""
  if smoke:
    return {
        "train": (bench_command("train", "smoke", repeats=1), 240),
        "input": (bench_command("input", "smoke", repeats=1), 180),
        "scaling": (bench_command("scaling", "smoke", vsi="on"), 240),
        "trials": (bench_command("trials", "smoke", joint=0), 240),
    }
  on_gpu = platform == "gpu"
  counts = device_counts(visible) if on_gpu else [1, 2]
  return {
      "train": (bench_command("train", backend="both", repeats=3, steps=200 if on_gpu else 40,
                              cache_rows=0.05, floor=True), 200),
      "input": (bench_command("input", repeats=2), 60),
      "scaling": (bench_command("scaling", devices=",".join(map(str, counts)),
                                shardings="replicated,row", vsi="on,off",
                                steps=60 if on_gpu else 24), 110),
      "trials": (bench_command("trials", widths="1,8,32" if on_gpu else "1,4",
                               steps=40 if on_gpu else 20), 100),
  }


def run_one(command: list[str], limit: int) -> dict:
  """Runs one benchmark module; its final JSON, or why there is none."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "out.json")
    t0 = time.perf_counter()
    try:
      r = subprocess.run([sys.executable, "-m", *command, f"--config.out={out}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as err:
      tail = (err.stderr or b"")[-1500:]
      return {"status": "skipped", "reason": f"ran past its {limit} s limit",
              "stderr_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail,
              "seconds": time.perf_counter() - t0}
    seconds = time.perf_counter() - t0
    if r.returncode != 0 or not os.path.exists(out):
      return {"status": "failed", "reason": f"exit status {r.returncode}",
              "stderr_tail": r.stderr[-1500:], "seconds": seconds}
    with open(out, encoding="utf-8") as f:
      return {"status": "done", "seconds": seconds, "result": json.load(f)}


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: for an unknown name in `only`, before anything runs.
  """
  only = cli.split_names(config.only, "only", BENCHMARKS)
  device = probe_devices()
  skipped = {}
  if device["platform"] != "gpu":
    skipped["gpu"] = (f"no GPU visible (platform {device['platform']}): CPU figures, scaling "
                      "on fake CPU devices measures volume and correctness only")
  runs = {}
  t0 = time.perf_counter()
  for name, (command, limit) in plan(config.smoke, device["platform"], device["devices"]).items():
    if only and name not in only:
      skipped[name] = "not in config.only"
      continue
    print(f"bench_gpu: {name}: {' '.join(command)} (limit {limit} s)", file=sys.stderr, flush=True)
    runs[name] = dict(run_one(command, limit), command=" ".join(command))
    if runs[name]["status"] != "done":
      skipped[name] = runs[name]["reason"]
    print(f"bench_gpu: {name}: {runs[name]['status']} in {runs[name]['seconds']:.1f} s",
          file=sys.stderr, flush=True)
  for name, why in skipped.items():
    print(f"bench_gpu: skipped {name}: {why}", file=sys.stderr)
  return {"benchmark": "bench_gpu", "smoke": config.smoke, **device,
          "total_seconds": time.perf_counter() - t0, "skipped": skipped, "runs": runs}


if __name__ == "__main__":
  cli.run_benchmark("bench_gpu", run)
