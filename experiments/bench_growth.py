"""Cost growth of the cache path: examples/s, peak RSS and device bytes against table size,
batch size and field count.

  python -m experiments.bench_growth [--config=experiments/configs/bench_growth.py[:smoke]]
      [--config.sweeps=rows,batch,fields --config.plot=docs/growth.png]

Three sweeps, each point trained for `steps` steps through the cache backend (`build_trainer`
+ `run_steps`, the MixCache pipeline included) in its own subprocess, so peak RSS does not
accumulate across points:

  rows     the table grows (1e6 -> 1e9 rows: Criteo's cardinalities scaled), an mmap host
           table initialised lazily (untouched rows cost no disk and no RAM: a 1e9-row
           table is never written), the device cache fixed at `cache_rows`
  batch    the batch grows (1k -> 64k examples), table `base_rows`
  fields   the categorical fields grow (26 -> 100: the 26 Criteo-like columns repeated,
           each copy its own table with its ids shifted), table `base_rows` per 26 fields

Per point: examples/s end to end in the steady state, B / the median time between the
ends of consecutive steps of the second half, each step waited for (the first half warms
up; a step that compiles a bucket shape not seen before is an outlier the median ignores;
`window_examples_per_sec` is the plain mean over that half), peak RSS (VmHWM of the
child process), device bytes (`device.memory_stats()['peak_bytes_in_use']` where the
platform reports it, else the bytes of the train state's arrays), the table rows really
materialised. Per sweep, the least-squares slope of log(examples/s) against log(x)
(`slope_examples_per_sec_vs_rows`, `..._vs_batch`, `..._vs_fields`) and of log(peak RSS)
(`slope_peak_rss_vs_*`): a flat (≈ 0) examples/s slope in table size is the cache path's
goal. Prints a table to stderr and ends stdout with one JSON line.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import jax
import ml_collections
import numpy as np

from experiments import cli
from experiments.configs import ctr
from sfjax.data import Batch, DatasetSpec, FieldSpec, make_dataset
from sfjax.train import build_trainer, run_steps

SWEEPS = ("rows", "batch", "fields")
_CRITEO_ROWS_AT_SCALE_1 = 33_762_578  # total rows of the 26 synthetic fields at cardinality_scale 1


class WideDataset:
  """A synthetic data set with its 26 id columns repeated to `num_fields` fields.

  Copy k of column f is its own field (own table of the same rows) with ids shifted by a
  k-dependent stride modulo the field's rows, so the copies touch different rows.
  """

  def __init__(self, base, num_fields: int):
    self._base, self.num_fields = base, int(num_fields)
    fields = base.spec.fields
    self._rows = np.array([fields[i % len(fields)].num_rows for i in range(num_fields)], np.int64)
    wide = tuple(FieldSpec(f"{fields[i % len(fields)].name}_{i // len(fields)}",
                                      int(self._rows[i])) for i in range(num_fields))
    self.spec = DatasetSpec(wide, base.spec.num_dense)
    self.eval_splits, self.oracle, self.stats = base.eval_splits, None, base.stats

  def _widen(self, batch: Batch) -> Batch:
    f = batch.ids.shape[1]
    copies = -(-self.num_fields // f)
    shift = np.repeat(np.arange(copies, dtype=np.int64) * 7919, f)[:self.num_fields]
    ids = (np.tile(batch.ids, (1, copies))[:, :self.num_fields] + shift) % self._rows
    return batch._replace(ids=ids)

  def train_batches(self, batch_size: int, seed: int):
    """The base's batches, widened."""
    return (self._widen(b) for b in self._base.train_batches(batch_size, seed))

  def eval_batches(self, split: str, batch_size: int):
    """The base's eval batches, widened."""
    return (self._widen(b) for b in self._base.eval_batches(split, batch_size))


def point_config(config: ml_collections.ConfigDict, rows: float, batch: int, fields: int,
                 host_path: str) -> ml_collections.ConfigDict:
  """The trainer's config of one point: cache backend on a lazily initialised mmap table."""
  c = ctr.get_config("smoke")
  s = c.data.synthetic
  s.cardinality_scale = float(rows) / _CRITEO_ROWS_AT_SCALE_1 * 26 / fields
  s.num_train, s.num_eval = max(config.steps * batch, 4096), 1024
  c.model.name, c.model.embed_dim = "deepfm", config.embed_dim
  c.model.mlp_dims = tuple(int(x) for x in config.mlp_dims)
  e = c.embedding
  e.backend, e.host_storage, e.host_path = "cache", "mmap", host_path
  e.optimizer, e.learning_rate, e.lookahead = "rowwise_adagrad", 0.05, 2
  e.cache_rows = float(max(config.cache_rows, 2 * batch * fields))
  c.train.batch_size, c.train.num_devices = batch, 1
  c.train.steps = c.train.eval_every = c.train.log_every = config.steps
  return c


def _peak_rss_bytes() -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  import resource  # not Linux: ru_maxrss (kB on Linux, bytes on macOS)
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _device_bytes(state) -> int:
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  return int(sum(x.nbytes for x in jax.tree.leaves(state)))


def measure_point(config: ml_collections.ConfigDict, point: dict) -> dict:
  """Trains one point in this process; its figures (see the module docstring)."""
  host_path = tempfile.mkdtemp(dir=_host_dir(config))
  os.rmdir(host_path)  # the mmap table creates it
  try:
    tc = point_config(config, point["rows"], point["batch"], point["fields"], host_path)
    data = make_dataset(tc.data, tc.seed)
    if point["fields"] != data.spec.num_fields:
      data = WideDataset(data, point["fields"])
    trainer = build_trainer(tc, data.spec)
    backend = trainer.backend
    inputs = backend.train_inputs(data.train_batches(tc.train.batch_size, tc.seed))
    try:
      # Warm-up first: the first steps compile the step's unique / swap bucket shapes.
      warm = max(1, config.steps // 2)
      state, _ = run_steps(trainer.run_step, trainer.state, inputs, 1, warm, tc.train.batch_size)
      stamps: list[float] = []
      state, window = run_steps(trainer.run_step, state, inputs, warm + 1, config.steps,
                                tc.train.batch_size,
                                on_step=lambda st: stamps.append(_ready_at(st)))
      hit_rate = backend.stats()["cache_hit_rate"]
    finally:
      inputs.close()
      backend.close()
    # Median step interval: a step that compiles a bucket shape not seen before is an outlier.
    median_step = float(np.median(np.diff(stamps))) if len(stamps) > 1 else window.seconds
    return dict(point, table_rows=int(backend.num_rows),
                examples_per_sec=tc.train.batch_size / max(median_step, 1e-9),
                window_examples_per_sec=window.examples_per_sec,
                peak_rss_bytes=_peak_rss_bytes(), device_bytes=_device_bytes(state),
                rows_materialised=int(backend.host_table.num_materialised),
                cache_rows=int(backend.num_slots), hit_rate=float(hit_rate),
                loss=float(window.losses[-1]))
  finally:
    shutil.rmtree(host_path, ignore_errors=True)


def _ready_at(state) -> float:
  """Waits for a step's state; the time it was ready (one step end to end, host work included)."""
  jax.block_until_ready(state)
  return time.perf_counter()


def _host_dir(config) -> str:
  os.makedirs(config.host_dir, exist_ok=True)
  return config.host_dir


def run_point_subprocess(config: ml_collections.ConfigDict, point: dict) -> dict:
  """`measure_point` in a fresh Python process (its own peak RSS); its JSON result."""
  request = json.dumps({"config": config.to_dict(), "point": point})
  cmd = [sys.executable, "-c", "from experiments import bench_growth; bench_growth.child_main()"]
  out = subprocess.run(cmd, input=request, capture_output=True, text=True, cwd=_repo_root(),
                       check=False)
  if out.returncode != 0:
    raise RuntimeError(f"bench_growth point {point} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def child_main() -> None:
  """A sweep's child: reads `{config, point}` JSON from stdin, prints the point's JSON."""
  request = json.load(sys.stdin)
  print(json.dumps(measure_point(ml_collections.ConfigDict(request["config"]), request["point"])))


def _repo_root() -> str:
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log_log_slope(xs, ys) -> float:
  """Least-squares slope of log(y) against log(x); NaN with fewer than 2 points."""
  if len(xs) < 2:
    return float("nan")
  return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


def sweep_points(config: ml_collections.ConfigDict, sweep: str) -> list[dict]:
  """The points `{sweep, x, rows, batch, fields}` of one sweep."""
  base = {"rows": float(config.base_rows), "batch": int(config.base_batch), "fields": 26}
  values = {"rows": config.rows, "batch": config.batches, "fields": config.fields}[sweep]
  key = {"rows": "rows", "batch": "batch", "fields": "fields"}[sweep]
  return [dict(base, sweep=sweep, x=float(v), **{key: type(base[key])(v)}) for v in values]


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: an unknown sweep name.
  """
  sweeps = cli.split_names(config.sweeps, "sweeps", SWEEPS)
  result: dict = {"benchmark": "bench_growth", "platform": jax.devices()[0].platform,
                  "steps": config.steps, "points": []}
  for sweep in sweeps:
    points = [run_point_subprocess(config, p) for p in sweep_points(config, sweep)]
    for p in points:
      print(f"{sweep:6s} x={p['x']:>12.0f} rows={p['table_rows']:>11d} {p['examples_per_sec']:9.0f} "
            f"ex/s rss {p['peak_rss_bytes'] / 2**20:8.1f} MiB device "
            f"{p['device_bytes'] / 2**20:8.1f} MiB materialised {p['rows_materialised']}",
            file=sys.stderr)
    result["points"] += points
    xs = [p["x"] for p in points]
    result[f"slope_examples_per_sec_vs_{sweep}"] = log_log_slope(
        xs, [p["examples_per_sec"] for p in points])
    result[f"slope_peak_rss_vs_{sweep}"] = log_log_slope(xs, [p["peak_rss_bytes"] for p in points])
    result[f"slope_device_bytes_vs_{sweep}"] = log_log_slope(
        xs, [p["device_bytes"] for p in points])
  if config.plot:
    result["plot"] = plot_growth(result, config.plot)
  return result


def plot_growth(result: dict, path: str) -> str:
  """Log-log panels of examples/s and peak RSS against each sweep's x; writes `path`."""
  from matplotlib import pyplot as plt  # on demand: only a run with `plot` needs matplotlib

  from sfjax.viz import save_figure

  sweeps = [s for s in SWEEPS if any(p["sweep"] == s for p in result["points"])]
  fig, axes = plt.subplots(2, len(sweeps), figsize=(4 * len(sweeps), 6.5), squeeze=False)
  for j, sweep in enumerate(sweeps):
    pts = [p for p in result["points"] if p["sweep"] == sweep]
    xs = [p["x"] for p in pts]
    for i, (key, label) in enumerate((("examples_per_sec", "examples / s"),
                                      ("peak_rss_bytes", "peak RSS (bytes)"))):
      ax = axes[i][j]
      ax.loglog(xs, [p[key] for p in pts], "o-")
      slope = result[f"slope_{'examples_per_sec' if i == 0 else 'peak_rss'}_vs_{sweep}"]
      ax.set(xlabel=sweep, ylabel=label,
             title=f"{label} vs {sweep}: slope {slope:.2f}" if math.isfinite(slope) else sweep)
  fig.tight_layout()
  return save_figure(fig, path)


def print_table(result: dict) -> None:
  """The slopes (stderr); the points were printed as they finished."""
  if "points" not in result:
    return
  for key in sorted(k for k in result if k.startswith("slope_")):
    print(f"{key:36s} {result[key]:+.3f}", file=sys.stderr)


if __name__ == "__main__":
  cli.run_benchmark("bench_growth", run, print_table)
