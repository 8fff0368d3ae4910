"""Huge mode of `python -m experiments.bench_serving` (`--config.mode=huge`): a lazy table served.

Huge mode (issue #23 item 3): `bench_huge_table`'s ~1.01e9-row workload (cache backend,
mmap host table) trains `huge_train_steps` steps; its bundle stores only the rows
training wrote (`sfjax.serving.lazy_table`). A fresh process (no training code) serves
it through the device row cache, a cold cache per size, replaying the held-out examples
once each as requests of each `huge_batch_sizes` size. Reported: `table_rows`,
`materialised_rows`, `bundle_bytes`, the serving process's `peak_rss_bytes`, and per
size `examples_per_sec`, `hit_rate` (of unique rows) and host->device `bytes_per_request`.

Config: `experiments/configs/bench_serving.py` (`huge_*` fields; variant `huge_smoke`).
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

from experiments import bench_serving
from sfjax.serving import Features, Predictor


def huge_training_config(config: ml_collections.ConfigDict, root: str) -> ml_collections.ConfigDict:
  """`bench_huge_table`'s workload (cache backend, mmap host table under `root/host`) at
  `huge_cardinality_scale`, trained `huge_train_steps` steps with a checkpoint at the end."""
  from experiments import bench_huge_table
  from experiments.configs import bench_huge_table as huge_config
  h = huge_config.get_config()
  h.host_path, h.cardinality_scale = os.path.join(root, "host"), config.huge_cardinality_scale
  h.steps, h.batch_size = config.huge_train_steps, config.huge_train_batch_size
  h.cache_rows = config.huge_train_cache_rows
  c = bench_huge_table.huge_config(h)
  c.model.embed_dim = config.embed_dim
  c.data.synthetic.num_eval = config.huge_request_examples
  c.checkpoint.every_steps = config.huge_train_steps
  return c


def make_huge_bundle(config: ml_collections.ConfigDict, root: str) -> tuple[str, str, dict]:
  """Trains the huge workload, exports its (lazy) bundle and saves its held-out examples as
  requests; (bundle dir, requests .npz, training figures)."""
  from sfjax.data import make_dataset
  from sfjax.serving import write_bundle
  from sfjax.train import train_and_evaluate
  c = huge_training_config(config, root)
  workdir, bundle = os.path.join(root, "run"), os.path.join(root, "bundle")
  t = time.perf_counter()
  data = make_dataset(c.data, c.seed)
  final, _ = train_and_evaluate(c, workdir, dataset=data)
  train_s = time.perf_counter() - t
  t = time.perf_counter()
  write_bundle(workdir, bundle)  # auto: the mmap host table gives a lazy table
  export_s = time.perf_counter() - t
  ids, dense = [], []
  for batch in data.eval_batches("eval", 4096):
    real = batch.mask > 0
    ids.append(batch.ids[real])
    dense.append(batch.dense[real])
  requests = os.path.join(root, "requests.npz")
  np.savez(requests, ids=np.concatenate(ids), dense=np.concatenate(dense))
  return bundle, requests, {"train_seconds": train_s, "export_seconds": export_s,
                            "train_auc": final["auc"],
                            "request_examples": int(sum(x.shape[0] for x in ids))}


def peak_rss_bytes() -> int:
  """This process's peak resident set (VmHWM of /proc/self/status: this program's own, unlike
  `ru_maxrss`, which keeps a forking parent's peak across exec)."""
  if os.path.exists("/proc/self/status"):
    with open("/proc/self/status", encoding="ascii") as f:
      return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmHWM:"))
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def replay_requests(bundle: str, requests: str, batch_sizes: tuple[int, ...], cache_rows: int,
                    seconds: float, reps: int) -> dict:
  """Replays `requests` (ids, dense; each once) through `bundle`'s row cache at each batch
  size, on a cold cache of `cache_rows` (0: 4 x largest batch x columns); the figures."""
  with np.load(requests) as z:
    ids, dense = z["ids"], z["dense"]
  cache_rows = cache_rows or 4 * max(batch_sizes) * ids.shape[1]
  batches = {}
  for b in batch_sizes:
    predictor = Predictor.load(bundle, batch_sizes=(b,), rows="cache", cache_rows=cache_rows)
    count = min(reps, ids.shape[0] // b - 1)  # after one untimed request
    predictor.predict_features(Features(ids[:b], dense[:b]))
    before, times = predictor.rows.stats(), []
    end = time.perf_counter() + seconds
    while len(times) < count and (len(times) < 3 or time.perf_counter() < end):
      lo = (len(times) + 1) * b
      request = Features(ids[lo:lo + b], dense[lo:lo + b])
      t = time.perf_counter()
      predictor.predict_features(request)
      times.append(time.perf_counter() - t)
    after = predictor.rows.stats()
    lookups = after["lookups"] - before["lookups"]
    batches[str(b)] = {
        "requests": len(times), "examples_per_sec": b * len(times) / sum(times),
        "hit_rate": (after["hits"] - before["hits"]) / max(lookups, 1),
        "bytes_per_request": (after["h2d_bytes"] - before["h2d_bytes"]) / len(times)}
  return {"peak_rss_bytes": peak_rss_bytes(), "cache_rows": cache_rows, "batches": batches,
          "training_modules_loaded": sorted(m for m in sys.modules if m.startswith(
              ("sfjax.train", "sfjax.models", "flax", "optax", "orbax")))}


def run_huge(config: ml_collections.ConfigDict, root: str) -> dict:
  """Huge mode (module docstring): train, export lazily, serve in a fresh process."""
  bundle, requests, trained = make_huge_bundle(config, root)
  with open(os.path.join(bundle, "manifest.json"), encoding="utf-8") as f:
    manifest = json.load(f)
  table = manifest["tables"][0]
  args = json.dumps([bundle, requests, list(config.huge_batch_sizes), config.huge_cache_rows,
                     config.inprocess_seconds, config.inprocess_reps])
  code = ("import json, sys\nfrom experiments.serving_huge import replay_requests\n"
          "print(json.dumps(replay_requests(*json.loads(sys.argv[1]))))")
  r = subprocess.run([sys.executable, "-c", code, args], cwd=bench_serving.ROOT,
                     env=bench_serving.server_env(), capture_output=True, text=True,
                     timeout=config.startup_timeout_s * 4)
  if r.returncode != 0:
    raise RuntimeError(f"the serving process exited with {r.returncode}: {r.stderr[-3000:]}")
  served = json.loads(r.stdout.strip().splitlines()[-1])
  return {"benchmark": "bench_serving", "mode": "huge", "table_rows": table["rows"],
          "table_storage": table.get("storage", "dense"),
          "materialised_rows": table["written"]["rows"] if "written" in table else table["rows"],
          "embed_dim": table["dim"], "num_fields": len(manifest["features"]),
          "bundle_bytes": sum(e["bytes"] for e in manifest["files"])
          + os.path.getsize(os.path.join(bundle, "manifest.json")),
          "table_bytes_if_dense": table["rows"] * table["dim"] * 4,
          **trained, **served}
