"""The largest table a cohort of trials can search: full trial tables vs touched rows.

  python -m experiments.bench_trial_tables [--config=experiments/configs/bench_trial_tables.py[:smoke]]
      [--config.trials=32 --config.scales=0.01,0.03,0.1,0.3,1,3 --config.out=t.json]

Every trial of a cohort owns its table. With full tables (`CTRTask.compact_rows`
False) a cohort of N trials holds N x V rows (values and optimizer slots); with
touched rows (True) it holds N x U, U the rows the task's batches touch
(`sfjax.cohorts.task`). For each synthetic Criteo cardinality scale in
`scales` (V grows with it) and each mode, the cohort's table bytes are estimated
first; a point whose estimate exceeds `memory_fraction` of the memory available
now is reported as not fitting and not run. Every other point runs in a fresh
subprocess (so its peak RSS is its own): the data are generated, N fresh DeepFM
trials train `steps` steps as one vmapped program, and the point reports its wall
time (data preparation included), peak RSS, V, U and the trials' mean held-out AUC.

The headline is, per mode, the largest V that ran. `run(config)` returns the figures;
the command ends stdout with them as one JSON line (also written to `config.out`). On
an accelerator the same command measures device memory only indirectly (RSS is host
memory); the estimate uses host memory.

Old flag -> config field: each `--X` is `--config.X` (trials, scales, steps, batch_size,
eval_rows, memory_fraction, timeout, point, out); `scales` is a tuple
(`--config.scales=0.01,0.1`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import ml_collections
import numpy as np

from experiments import cli
from experiments.configs import ctr as ctr_config
from sfjax.cohorts import CohortRunner, CTRTask, TrialData, split_config
from sfjax.core import ConfigError
from sfjax.data import make_dataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCH = {"model.name": "deepfm", "model.embed_dim": 8, "model.mlp.depth": 1, "model.mlp.width": 16}
BYTES_PER_ENTRY = 4 * 3  # float32, x3: the stacked input, the program's state, the host copy


def make_task(config: ml_collections.ConfigDict, scale: float, compact: bool) -> CTRTask:
  """The synthetic task of one point."""
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale = scale
  d.synthetic.num_train, d.synthetic.num_eval = 200_000, 8192
  return CTRTask(d, batch_size=config.batch_size, eval_rows=config.eval_rows,
                 steps_per_budget_unit=config.steps, eval_batch_size=1024,
                 max_steps=config.steps, compact_rows=compact)


def available_bytes() -> int:
  """MemAvailable of /proc/meminfo (bytes); total physical memory where it is missing."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def table_rows(scale: float) -> int:
  """V of the synthetic data set at `scale` (from its spec; no rows generated)."""
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale = scale
  return int(make_dataset(d, 0).spec.total_rows)


def estimate_bytes(rows: int, trials: int) -> int:
  """Table bytes of a cohort: trials x rows x (E + slots) entries, with copies."""
  arch = split_config(ARCH)[0]
  width = arch.embedding_width
  return int(trials) * int(rows) * 2 * width * BYTES_PER_ENTRY  # adagrad: one slot per value


def run_point(config: ml_collections.ConfigDict, scale: float, compact: bool) -> dict:
  """Builds the data and trains `config.trials` fresh trials as one cohort (this process)."""
  trials = config.trials
  t = time.perf_counter()
  data = TrialData(make_task(config, scale, compact))
  arch = split_config(ARCH)[0]
  runner = CohortRunner(data.task, cohort_width=trials, data=data)
  lrs = np.geomspace(0.003, 0.3, trials)
  results = runner.run(arch, [{"embedding.learning_rate": float(lr)} for lr in lrs], list(range(trials)),
                       [0] * trials, config.steps, [None] * trials)
  seconds = time.perf_counter() - t
  auc = [r.metrics["auc"] for r in results]
  return {"scale": scale, "compact_rows": compact, "full_rows": data.full_rows,
          "trial_rows": data.num_rows, "trials": trials, "seconds": seconds,
          "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
          "failed": int(sum(r.status != "done" for r in results)),
          "mean_auc": float(np.nanmean(auc))}


def point_command(config: ml_collections.ConfigDict, scale: float, compact: bool) -> list[str]:
  """The command that runs one point in a fresh interpreter (`config.point`)."""
  return [sys.executable, "-m", "experiments.bench_trial_tables",
          f"--config={cli.config_path('bench_trial_tables')}",
          f"--config.point={scale},{int(compact)}", f"--config.trials={config.trials}",
          f"--config.steps={config.steps}", f"--config.batch_size={config.batch_size}",
          f"--config.eval_rows={config.eval_rows}"]


def measure(config: ml_collections.ConfigDict, scale: float, compact: bool) -> dict:
  """One point in a subprocess, or why it was not run."""
  rows = table_rows(scale)
  point = {"scale": scale, "compact_rows": compact, "full_rows": rows}
  if not compact:
    need, have = estimate_bytes(rows, config.trials), available_bytes()
    point["estimate_gb"] = need / 2**30
    if need > config.memory_fraction * have:
      return {**point, "ran": False,
              "reason": f"needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"}
  try:
    proc = subprocess.run(point_command(config, scale, compact), cwd=ROOT, capture_output=True,
                          text=True, timeout=config.timeout, check=False)
  except subprocess.TimeoutExpired:
    return {**point, "ran": False, "reason": f"ran past {config.timeout} s"}
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode or not lines:
    return {**point, "ran": False, "reason": f"exit {proc.returncode}: {proc.stderr[-400:]}"}
  return {**point, "ran": True, **json.loads(lines[-1])}


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures (one point's with `config.point`).

  Raises:
    ConfigError: for no or a non-positive scale, or fewer than one trial.
  """
  if config.point:
    scale, compact = config.point.split(",")
    return run_point(config, float(scale), bool(int(compact)))
  scales = sorted(float(s) for s in config.scales)
  if not scales or scales[0] <= 0:
    raise ConfigError(f"config field scales: must list positive numbers, got {config.scales}")
  if config.trials < 1:
    raise ConfigError(f"config field trials: must be >= 1, got {config.trials}")
  points = []
  for compact in (False, True):
    for scale in scales:
      points.append(measure(config, scale, compact))
      print(json.dumps(points[-1], sort_keys=True), file=sys.stderr)
  largest = {}
  for compact, name in ((False, "full_tables"), (True, "touched_rows")):
    ran = [p for p in points if p["compact_rows"] == compact and p["ran"] and not p["failed"]]
    largest[name] = max((p["full_rows"] for p in ran), default=0)
  return {"benchmark": "bench_trial_tables", "trials": config.trials, "steps": config.steps,
          "arch": split_config(ARCH)[0].describe(),
          "available_gb": available_bytes() / 2**30, "points": points,
          "largest_table_rows": largest}


if __name__ == "__main__":
  cli.run_benchmark("bench_trial_tables", run)
