"""Cost growth of the cache path: examples/s, peak RSS and device bytes against table size,
batch size and field count.

  python -m experiments.bench_growth [--config=experiments/configs/bench_growth.py[:smoke]]
      [--config.sweeps=rows,spread,batch,fields --config.plot=docs/growth.png]

Four sweeps, each point trained through the cache backend (`build_trainer` + `run_steps`,
the MixCache pipeline included) in its own subprocess, so peak RSS does not accumulate
across points:

  rows     the table grows (1e6 -> 1e9 rows: Criteo's cardinalities scaled), an mmap host
           table initialised lazily (untouched rows cost no disk and no RAM), the device
           cache fixed at `cache_rows`; the synthetic data's ids are drawn from each size's
           fields, so the batches' distinct ids (and the misses) grow with the table
  spread   the same table sizes, with the first size's examples and ids spread over each
           (`SpreadDataset`, one to one): the same misses at every point, only the rows'
           distance in the table grows (the table's size alone)
  batch    the batch grows (1k -> 64k examples), table `batch_sweep_rows` (past the
           largest batch's cache, so every point evicts)
  fields   the categorical fields grow (26 -> 100: the 26 Criteo-like columns repeated,
           each copy its own table with its ids shifted), table `base_rows` per 26 fields

Each point is measured in the cache's steady state: the warm-up (`warm_up`) runs until the
cache is full and evicting (every miss then reads a row from the host table and writes one
back) and no new program shape compiles, then `steps` steps are timed on fresh examples.
(Before 2026-12-07 the bench timed steps 11-20 of a filling cache: the rows sweep's points
wrote no row to the host table, so its flat slope measured neither evictions nor writes.)
Per point: examples/s end to end, B / the median time between the ends of consecutive
timed steps, each step waited for (host work included; `window_examples_per_sec` is the
plain mean), peak RSS (VmHWM of the child process), device bytes
(`device.memory_stats()['peak_bytes_in_use']` where the platform reports it, else the
bytes of the train state's arrays), the table rows materialised, and the timed window's
cache counters: hit rate, evictions per step, host<->device bytes per example, the
pipeline threads' CPU milliseconds per step (loader, manager, write-back), page faults
per step, programs compiled; `warmup_steps` and `steady` (False: `max_warmup_steps` ran
out first). Per sweep, the least-squares slope of log(examples/s) against log(x)
(`slope_examples_per_sec_vs_rows`, `..._vs_batch`, `..._vs_fields`) and of log(peak RSS)
(`slope_peak_rss_vs_*`): a flat (~0) examples/s slope in table size is the cache path's
goal. Prints a table to stderr and ends stdout with one JSON line.
"""

from __future__ import annotations

import abc
import json
import math
import os
import resource
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

SWEEPS = ("rows", "spread", "batch", "fields")
_CRITEO_ROWS_AT_SCALE_1 = 33_762_578  # total rows of the 26 synthetic fields at cardinality_scale 1


class _IdMappedDataset(abc.ABC):
  """A data set whose batches are its base's with the ids mapped (`_map_ids`); `spec`
  describes the mapped fields (set by the subclass)."""

  spec: DatasetSpec

  def __init__(self, base):
    self._base = base
    self.eval_splits, self.oracle, self.stats = base.eval_splits, None, base.stats

  @abc.abstractmethod
  def _map_ids(self, ids: np.ndarray) -> np.ndarray:
    """The batch's ids [B, F] as this data set's fields read them."""

  def _mapped(self, batch: Batch) -> Batch:
    return batch._replace(ids=self._map_ids(batch.ids))

  def train_batches(self, batch_size: int, seed: int):
    """The base's batches, their ids mapped."""
    return (self._mapped(b) for b in self._base.train_batches(batch_size, seed))

  def eval_batches(self, split: str, batch_size: int):
    """The base's eval batches, their ids mapped."""
    return (self._mapped(b) for b in self._base.eval_batches(split, batch_size))


class WideDataset(_IdMappedDataset):
  """A synthetic data set with its 26 id columns repeated to `num_fields` fields.

  Copy k of column f is its own field (own table of the same rows) with ids shifted by a
  k-dependent stride modulo the field's rows, so the copies touch different rows.
  """

  def __init__(self, base, num_fields: int):
    super().__init__(base)
    self.num_fields = int(num_fields)
    fields = base.spec.fields
    self._rows = np.array([fields[i % len(fields)].num_rows for i in range(num_fields)], np.int64)
    wide = tuple(FieldSpec(f"{fields[i % len(fields)].name}_{i // len(fields)}",
                                      int(self._rows[i])) for i in range(num_fields))
    self.spec = DatasetSpec(wide, base.spec.num_dense)

  def _map_ids(self, ids: np.ndarray) -> np.ndarray:
    f = ids.shape[1]
    copies = -(-self.num_fields // f)
    shift = np.repeat(np.arange(copies, dtype=np.int64) * 7919, f)[:self.num_fields]
    return (np.tile(ids, (1, copies))[:, :self.num_fields] + shift) % self._rows


class SpreadDataset(_IdMappedDataset):
  """A data set whose ids are spread over tables `factor` times larger, one to one.

  Id i of a field of n rows becomes `i * factor + (i * 40503) % factor` of a field of
  `n * factor` rows: the same examples and distinct ids per batch (so the same misses, up to
  the pipeline's timing, which decides how many upcoming batches a plan sees), rows further
  apart in the table (the `spread` sweep: the table's size alone, its working set fixed).
  """

  def __init__(self, base, factor: int):
    super().__init__(base)
    self.factor = int(factor)
    self.spec = DatasetSpec(tuple(FieldSpec(f.name, f.num_rows * self.factor)
                                  for f in base.spec.fields), base.spec.num_dense)

  def _map_ids(self, ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    return ids * self.factor + (ids * 40503) % self.factor


def point_config(config: ml_collections.ConfigDict, rows: float, batch: int, fields: int,
                 host_path: str) -> ml_collections.ConfigDict:
  """The trainer's config of one point: cache backend on a lazily initialised mmap table."""
  c = ctr.get_config("smoke")
  s = c.data.synthetic
  s.cardinality_scale = float(rows) / _CRITEO_ROWS_AT_SCALE_1 * 26 / fields
  # Fresh examples for every step (warm-up and timed window): the stream never repeats.
  s.num_train, s.num_eval = max((config.max_warmup_steps + config.steps) * batch, 4096), 1024
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
  # not Linux: ru_maxrss (kB on Linux, bytes on macOS)
  return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _device_bytes(state) -> int:
  stats = jax.local_devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  return int(sum(x.nbytes for x in jax.tree.leaves(state)))


def warm_up(trainer, inputs, config: ml_collections.ConfigDict, batch_size: int):
  """Runs warm-up steps until the cache path is in its steady state; (state, steps, steady).

  Chunks of `warmup_chunk` steps run until at least `warmup_steps` have, the last chunk
  evicted rows (the cache is full: every miss now reads a row from the host table and
  writes one back; a cache that holds the whole table cannot evict and needs only the
  minimum) and compiled no program shape not seen before. `steady` is False when
  `max_warmup_steps` ran out first (the figures are then those of a filling cache).
  """
  backend, state, done = trainer.backend, trainer.state, 0
  holds_table = backend.num_slots >= backend.num_rows
  chunk = max(1, int(config.warmup_chunk))
  while True:
    before = backend.stats()
    state, _ = run_steps(trainer.run_step, state, inputs, done + 1, done + chunk, batch_size)
    done += chunk
    after = backend.stats()
    evicting = holds_table or after["evictions"] > before["evictions"]
    compiled = set(after["steps_per_shape"]) - set(before["steps_per_shape"])
    if done >= config.warmup_steps and evicting and not compiled:
      return state, done, True
    if done >= config.max_warmup_steps:
      return state, done, False


def _window_counters(before: dict, after: dict, steps: int, examples: int) -> dict:
  """The timed window's cache counters (differences of two `stats()`)."""
  keys = ("unique_ids", "hits", "evictions", "h2d_rows", "d2h_rows", "loader_cpu_seconds",
          "manager_cpu_seconds", "writeback_cpu_seconds", "page_faults")
  delta = {k: after[k] - before[k] for k in keys}
  return {"hit_rate": delta["hits"] / max(delta["unique_ids"], 1),
          "evictions_per_step": delta["evictions"] / max(steps, 1),
          "h2d_bytes_per_example": delta["h2d_rows"] * after["row_bytes"] / max(examples, 1),
          "d2h_bytes_per_example": delta["d2h_rows"] * after["row_bytes"] / max(examples, 1),
          "host_cpu_ms_per_step": {k.removesuffix("_cpu_seconds"): delta[k] * 1e3 / max(steps, 1)
                                   for k in keys if k.endswith("_cpu_seconds")},
          "page_faults_per_step": delta["page_faults"] / max(steps, 1),
          "window_compiled_shapes": len(set(after["steps_per_shape"])
                                        - set(before["steps_per_shape"]))}


def _stats(backend) -> dict:
  """The backend's counters and this process's page faults so far (minor + major)."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return dict(backend.stats(), page_faults=usage.ru_minflt + usage.ru_majflt)


def measure_point(config: ml_collections.ConfigDict, point: dict) -> dict:
  """Trains one point in this process; its figures (see the module docstring)."""
  host_path = tempfile.mkdtemp(dir=_host_dir(config))
  os.rmdir(host_path)  # the mmap table creates it
  try:
    spread = int(point.get("spread", 1))
    tc = point_config(config, point["rows"] / spread, point["batch"], point["fields"],
                      host_path)
    data = make_dataset(tc.data, tc.seed)
    if point["fields"] != data.spec.num_fields:
      data = WideDataset(data, point["fields"])
    if "spread" in point:  # factor 1 too: every point of the sweep reads its batches alike
      data = SpreadDataset(data, spread)
    trainer = build_trainer(tc, data.spec)
    backend = trainer.backend
    inputs = backend.train_inputs(data.train_batches(tc.train.batch_size, tc.seed))
    try:
      state, warm, steady = warm_up(trainer, inputs, config, tc.train.batch_size)
      stamps: list[float] = []
      before = _stats(backend)
      state, window = run_steps(trainer.run_step, state, inputs, warm + 1, warm + config.steps,
                                tc.train.batch_size,
                                on_step=lambda st: stamps.append(_ready_at(st)))
      counters = _window_counters(before, _stats(backend), config.steps,
                                  config.steps * tc.train.batch_size)
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
                cache_rows=int(backend.num_slots), warmup_steps=warm, steady=steady,
                loss=float(window.losses[-1]), **counters)
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
  if sweep == "batch":  # a table well past the largest batch's cache: every point evicts
    base["rows"] = float(config.batch_sweep_rows)
  if sweep == "spread":  # the first rows point's ids, spread over ever larger tables
    first = float(config.rows[0])
    return [dict(base, sweep=sweep, x=float(v), rows=float(v), spread=max(1, round(v / first)))
            for v in config.rows]
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
            f"{p['device_bytes'] / 2**20:8.1f} MiB hit {p['hit_rate']:.3f} evicted/step "
            f"{p['evictions_per_step']:.0f} warm-up {p['warmup_steps']}"
            f"{'' if p['steady'] else ' (NOT steady)'} materialised {p['rows_materialised']}",
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


_X_LABELS = {"rows": "table rows", "spread": "table rows (the first point's ids, spread)",
             "batch": "batch", "fields": "fields"}


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
      ax.set(xlabel=_X_LABELS.get(sweep, sweep), ylabel=label,
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
