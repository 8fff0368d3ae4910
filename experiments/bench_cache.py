"""MixCache hit rate and host<->device row traffic versus cache size.

  python -m experiments.bench_cache [--config=experiments/configs/bench_cache.py[:smoke]]
      [--config.steps=800 --config.batch_size=512 --config.out=cache.json]

Stream: `SyntheticCTR` train rows (26 Criteo-like fields, `cardinality_scale`
0.05 = 1.7M rows in the concatenated table, hot ids scattered), `steps` batches
of `batch_size`, deduplicated per batch (VSI). For each Zipf exponent and each
cache size (a fraction of the table's rows), the same stream is run through:

  lru / lfu   `CachePlanner` with `lookahead` steps in flight (step t - L
              retires before step t is planned);
  belady      the optimal offline policy (`belady.py`), the hit-rate ceiling;
  no cache    every batch's unique rows go host->device and back (a parameter
              server with VSI);
  no VSI      every batch's B*F rows, duplicates included, go host->device and back.

Bytes per example = rows moved * (E + S) * 4 / examples (rows travel with their
optimizer slots; index buffers such as `vids` are not counted, they are the same
for every VSI variant). Host->device rows are the fills (cache), the unique rows
(no cache) or B*F (no VSI); device->host rows are the evictions (cache; the
final flush is not counted), the unique rows or B*F. Hit rates count each
batch's unique ids as accesses, cold-start misses included; `steady` rates use
only the last half of the steps. `planner_ms_per_batch` times `CachePlanner.plan`
alone on a worst case: 50k unique ids per batch, almost all misses, 1M slots.
`run(config)` returns the figures; the command prints a table to stderr and ends stdout
with the figures as one JSON line (also written to `config.out`).

Old flag -> config field: each `--X` is `--config.X` (steps, batch_size,
cardinality_scale, zipf, cache_fraction, policies, lookahead, embed_width, slot_width,
timing_steps, seed, out); `zipf` and `cache_fraction` are tuples
(`--config.zipf=1.05,1.2`), `policies` a comma-separated string.
"""

from __future__ import annotations

import math
import sys
import time
import types

import ml_collections
import numpy as np

from experiments import cli
from sfjax.data import SyntheticCTR
from sfjax.embedding import (
  CACHE_POLICIES,
  CacheCapacityError,
  CachePlanner,
  global_row_ids,
  simulate_belady,
)


def unique_id_stream(zipf: float, steps: int, batch_size: int, scale: float, seed: int):
  """Per-batch unique global row ids of a synthetic stream.

  Returns:
    ([steps] sorted int64 arrays, total table rows, fields).
  """
  cfg = types.SimpleNamespace(num_train=steps * batch_size, num_eval=1, cardinality_scale=scale,
                              min_rows=4, zipf_exponent=zipf, planted_dim=8, num_dense=13)
  data = SyntheticCTR(cfg, seed)
  batch, _ = data.generate("train", 0, steps * batch_size)
  ids = global_row_ids(batch.ids, data.spec.field_offsets)
  uniq = [np.unique(ids[i * batch_size:(i + 1) * batch_size]) for i in range(steps)]
  return uniq, data.spec.total_rows, data.spec.num_fields


def run_planner(uniq: list[np.ndarray], capacity: int, policy: str, lookahead: int) -> dict:
  """Counts of one planner run, per-step hits (for the steady rate) and mean ms per plan."""
  planner = CachePlanner(capacity, max(b.size for b in uniq), policy=policy,
                         lookahead=lookahead)
  step_hits = np.zeros((len(uniq),), np.int64)
  fills = evictions = 0
  seconds = 0.0
  for t, ids in enumerate(uniq):
    if t >= lookahead:
      planner.retire(t - lookahead)
    start = time.perf_counter()
    plan = planner.plan(t, ids)
    seconds += time.perf_counter() - start
    step_hits[t] = plan.hits
    fills += plan.num_fills
    evictions += plan.num_evictions
  return {"step_hits": step_hits, "fills": fills, "evictions": evictions,
          "plan_ms": seconds * 1e3 / max(1, len(uniq))}


def planner_ms_per_batch(policy: str, timed_steps: int, unique: int = 50_000,
                         capacity: int = 1_000_000, seed: int = 0) -> float:
  """Median ms of `plan` with a full cache and ~all misses (the eviction-heavy worst case)."""
  rng = np.random.default_rng(seed)
  planner = CachePlanner(capacity, unique, policy=policy, lookahead=2)
  warm = math.ceil(capacity / unique) + 1
  times = []
  for t in range(warm + timed_steps):
    ids = np.unique(rng.integers(0, 1 << 40, unique))
    if t >= 2:
      planner.retire(t - 2)
    start = time.perf_counter()
    planner.plan(t, ids)
    if t >= warm:
      times.append(time.perf_counter() - start)
  return float(np.median(times) * 1e3)


def _rates(step_hits: np.ndarray, sizes: np.ndarray) -> tuple[float, float]:
  half = len(sizes) // 2
  return (float(step_hits.sum() / max(1, sizes.sum())),
          float(step_hits[half:].sum() / max(1, sizes[half:].sum())))


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: for an unknown policy.
  """
  policies = cli.split_names(config.policies, "policies", CACHE_POLICIES)
  begin = time.time()
  row_bytes = (config.embed_width + config.slot_width) * 4
  steps, batch_size = config.steps, config.batch_size
  examples = steps * batch_size

  def per_example(rows):
    return rows * row_bytes / examples

  results, baselines = [], []
  for zipf in (float(z) for z in config.zipf):
    uniq, num_rows, num_fields = unique_id_stream(zipf, steps, batch_size,
                                                  config.cardinality_scale, config.seed)
    sizes = np.array([b.size for b in uniq], np.int64)
    baselines.append({
        "zipf": zipf, "num_rows": num_rows, "unique_per_batch": float(sizes.mean()),
        "distinct_ids": int(np.unique(np.concatenate(uniq)).size),
        "no_cache_bytes_per_example": per_example(sizes.sum()),
        "no_vsi_bytes_per_example": per_example(steps * batch_size * num_fields),
    })
    for fraction in (float(f) for f in config.cache_fraction):
      capacity = max(1, int(fraction * num_rows))
      entry = {"zipf": zipf, "cache_fraction": fraction, "capacity": capacity}
      try:
        runs = {p: run_planner(uniq, capacity, p, config.lookahead) for p in policies}
      except CacheCapacityError as err:
        entry["error"] = str(err)
        results.append(entry)
        continue
      for policy, planned in runs.items():
        hit_rate, steady = _rates(planned["step_hits"], sizes)
        entry[policy] = {
            "hit_rate": hit_rate, "steady_hit_rate": steady,
            "h2d_bytes_per_example": per_example(planned["fills"]),
            "d2h_bytes_per_example": per_example(planned["evictions"]),
            "evictions": planned["evictions"], "plan_ms": planned["plan_ms"],
        }
      opt = simulate_belady(uniq, capacity)
      entry["belady_hit_rate"], entry["belady_steady_hit_rate"] = _rates(opt.batch_hits, sizes)
      entry["belady_h2d_bytes_per_example"] = per_example(opt.accesses - opt.hits)
      results.append(entry)

  timing = ({p: planner_ms_per_batch(p, config.timing_steps) for p in policies}
            if config.timing_steps else {})
  return {
      "benchmark": "bench_cache", "steps": steps, "batch_size": batch_size,
      "cardinality_scale": config.cardinality_scale, "lookahead": config.lookahead,
      "row_bytes": row_bytes, "results": results, "baselines": baselines,
      "planner_ms_per_batch_50k_unique_1M_slots": timing, "elapsed_s": time.time() - begin,
  }


def print_table(result: dict) -> None:
  """The figures of `run` as tables on stderr."""
  _print_table(result["results"], result["baselines"],
               result["planner_ms_per_batch_50k_unique_1M_slots"])


def _print_table(results: list[dict], baselines: list[dict], timing: dict) -> None:
  """Baselines, per-policy rates and traffic, and plan timings, as tables on stderr."""
  err = sys.stderr
  print(f"{'zipf':>5} {'rows':>9} {'uniq/b':>7} {'noVSI B/ex':>11} {'nocache B/ex':>12}", file=err)
  for b in baselines:
    print(f"{b['zipf']:>5} {b['num_rows']:>9} {b['unique_per_batch']:>7.0f} "
          f"{b['no_vsi_bytes_per_example']:>11.0f} {b['no_cache_bytes_per_example']:>12.0f}", file=err)
  print(f"{'zipf':>5} {'cache':>5} {'policy':>6} {'hit':>6} {'steady':>6} {'h2d B/ex':>9} "
        f"{'d2h B/ex':>9} {'plan ms':>7}", file=err)
  for r in results:
    if "error" in r:
      print(f"{r['zipf']:>5} {r['cache_fraction']:>5} {r['error'][:100]}", file=err)
      continue
    for policy in [p for p in CACHE_POLICIES if p in r]:
      s = r[policy]
      print(f"{r['zipf']:>5} {r['cache_fraction']:>5} {policy:>6} {s['hit_rate']:>6.3f} "
            f"{s['steady_hit_rate']:>6.3f} {s['h2d_bytes_per_example']:>9.1f} "
            f"{s['d2h_bytes_per_example']:>9.1f} {s['plan_ms']:>7.2f}", file=err)
    print(f"{r['zipf']:>5} {r['cache_fraction']:>5} {'belady':>6} {r['belady_hit_rate']:>6.3f} "
          f"{r['belady_steady_hit_rate']:>6.3f} {r['belady_h2d_bytes_per_example']:>9.1f}", file=err)
  for policy, ms in timing.items():
    print(f"plan() {policy}: {ms:.1f} ms/batch (50k unique ids, 1M slots, ~all misses)", file=err)


if __name__ == "__main__":
  cli.run_benchmark("bench_cache", run, print_table)
