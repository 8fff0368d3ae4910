"""The largest table a cohort of trials can search: full trial tables vs touched rows.

  python -m experiments.bench_trial_tables [--trials=32 --scales=0.01,0.03,0.1,0.3,1,3 --out=t.json]

Every trial of a cohort owns its table. With full tables (`CTRTask.compact_rows`
False) a cohort of N trials holds N x V rows (values and optimizer slots); with
touched rows (True) it holds N x U, U the rows the task's batches touch
(`sfjax.cohorts.task`). For each synthetic Criteo cardinality scale in
--scales (V grows with it) and each mode, the cohort's table bytes are estimated
first; a point whose estimate exceeds --memory_fraction of the memory available
now is reported as not fitting and not run. Every other point runs in a fresh
subprocess (so its peak RSS is its own): the data are generated, N fresh DeepFM
trials train --steps steps as one vmapped program, and the point reports its wall
time (data preparation included), peak RSS, V, U and the trials' mean held-out AUC.

The headline is, per mode, the largest V that ran. Ends stdout with one JSON line
(also written to --out). On an accelerator the same command measures device
memory only indirectly (RSS is host memory); the estimate uses host memory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from experiments import report
from experiments.configs import ctr as ctr_config
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts import task as trial_data

_TRIALS = flags.DEFINE_integer("trials", 32, "Trials in the cohort.")
_SCALES = flags.DEFINE_list("scales", ["0.01", "0.03", "0.1", "0.3", "1", "3"],
                            "Synthetic cardinality scales (V grows with them).")
_STEPS = flags.DEFINE_integer("steps", 20, "Train steps per trial.")
_BATCH = flags.DEFINE_integer("batch_size", 128, "Examples per train step.")
_EVAL_ROWS = flags.DEFINE_integer("eval_rows", 2048, "Eval examples per trial.")
_FRACTION = flags.DEFINE_float("memory_fraction", 0.7,
                               "Run a point only if its estimate is below this share of "
                               "the memory available.")
_TIMEOUT = flags.DEFINE_integer("timeout", 900, "Seconds one point may take.")
_POINT = flags.DEFINE_string("point", "", "Internal: run one point 'scale,compact' and print it.")
_OUT = flags.DEFINE_string("out", "", "Write the JSON result here too.")

ARCH = {"model.name": "deepfm", "model.embed_dim": 8, "model.mlp.depth": 1, "model.mlp.width": 16}
BYTES_PER_ENTRY = 4 * 3  # float32, x3: the stacked input, the program's state, the host copy


def make_task(scale: float, compact: bool) -> trial_data.CTRTask:
  """The synthetic task of one point."""
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale = scale
  d.synthetic.num_train, d.synthetic.num_eval = 200_000, 8192
  return trial_data.CTRTask(d, batch_size=_BATCH.value, eval_rows=_EVAL_ROWS.value,
                            steps_per_budget_unit=_STEPS.value, eval_batch_size=1024,
                            max_steps=_STEPS.value, compact_rows=compact)


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
  from sfjax.data import dataset as dataset_lib  # pylint: disable=g-import-not-at-top
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale = scale
  return int(dataset_lib.make_dataset(d, 0).spec.total_rows)


def estimate_bytes(rows: int, trials: int) -> int:
  """Table bytes of a cohort: trials x rows x (E + slots) entries, with copies."""
  arch = arch_lib.split_config(ARCH)[0]
  width = arch.embedding_width
  return int(trials) * int(rows) * 2 * width * BYTES_PER_ENTRY  # adagrad: one slot per value


def run_point(scale: float, compact: bool, trials: int) -> dict:
  """Builds the data and trains `trials` fresh trials as one cohort (this process)."""
  t = time.perf_counter()
  data = trial_data.TrialData(make_task(scale, compact))
  arch = arch_lib.split_config(ARCH)[0]
  runner = cohort.CohortRunner(data.task, cohort_width=trials, data=data)
  lrs = np.geomspace(0.003, 0.3, trials)
  results = runner.run(arch, [{"optim.embedding_lr": float(lr)} for lr in lrs], list(range(trials)),
                       [0] * trials, _STEPS.value, [None] * trials)
  seconds = time.perf_counter() - t
  auc = [r.metrics["auc"] for r in results]
  return {"scale": scale, "compact_rows": compact, "full_rows": data.full_rows,
          "trial_rows": data.num_rows, "trials": trials, "seconds": seconds,
          "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
          "failed": int(sum(r.status != "done" for r in results)),
          "mean_auc": float(np.nanmean(auc))}


def measure(scale: float, compact: bool) -> dict:
  """One point in a subprocess, or why it was not run."""
  rows = table_rows(scale)
  point = {"scale": scale, "compact_rows": compact, "full_rows": rows}
  if not compact:
    need, have = estimate_bytes(rows, _TRIALS.value), available_bytes()
    point["estimate_gb"] = need / 2**30
    if need > _FRACTION.value * have:
      return {**point, "ran": False,
              "reason": f"needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} GiB available"}
  cmd = [sys.executable, "-m", "experiments.bench_trial_tables", f"--point={scale},{int(compact)}",
         f"--trials={_TRIALS.value}", f"--steps={_STEPS.value}", f"--batch_size={_BATCH.value}",
         f"--eval_rows={_EVAL_ROWS.value}"]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT.value, check=False)
  except subprocess.TimeoutExpired:
    return {**point, "ran": False, "reason": f"ran past {_TIMEOUT.value} s"}
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode or not lines:
    return {**point, "ran": False, "reason": f"exit {proc.returncode}: {proc.stderr[-400:]}"}
  return {**point, "ran": True, **json.loads(lines[-1])}


def main(argv):
  del argv
  if _POINT.value:
    scale, compact = _POINT.value.split(",")
    print(json.dumps(run_point(float(scale), bool(int(compact)), _TRIALS.value)))
    return
  scales = sorted(float(s) for s in _SCALES.value)
  if not scales or scales[0] <= 0 or _TRIALS.value < 1:
    raise app.UsageError("--scales must list positive numbers and --trials be >= 1")
  points = []
  for compact in (False, True):
    for scale in scales:
      points.append(measure(scale, compact))
      print(json.dumps(points[-1], sort_keys=True), file=sys.stderr)
  largest = {}
  for compact, name in ((False, "full_tables"), (True, "touched_rows")):
    ran = [p for p in points if p["compact_rows"] == compact and p["ran"] and not p["failed"]]
    largest[name] = max((p["full_rows"] for p in ran), default=0)
  report.emit_json_line({
      "benchmark": "bench_trial_tables", "trials": _TRIALS.value, "steps": _STEPS.value,
      "arch": arch_lib.split_config(ARCH)[0].describe(),
      "available_gb": available_bytes() / 2**30, "points": points,
      "largest_table_rows": largest}, _OUT.value)


if __name__ == "__main__":
  app.run(main)
