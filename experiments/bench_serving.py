"""The serving path under load: HTTP over loopback, and the predictor in-process (issue #23).

  python -m experiments.bench_serving [--config=experiments/configs/bench_serving.py[:smoke]]
      [--config.mode=http|inprocess|both|huge --config.bundle=BUNDLE
       --config.concurrency=1,8,32,64 --config.duration_s=10 --config.peak_duration_s=60
       --config.out=bench.json]

Workload (the issue's): DeepFM, 26 fields x 100k hashed rows, dim 16, MLP 400-400-400,
trained `train_steps` steps on synthetic Criteo lines (`SyntheticCTR.write_criteo`) and
exported as a serving bundle; the requests carry held-out raw Criteo lines, so the server
parses and hashes every record as a client would have it do.

HTTP mode: `python -m experiments.serve` runs in a subprocess on 127.0.0.1 (a free port,
access log off); an httpx async client in this process keeps `concurrency` requests in
flight (each client sends its next request when the last is answered), for each request
size (1 and 64 examples) and each level of `concurrency`; then one long run at
`peak_concurrency` (`peak`: the issue's 60 s without errors or lost requests). A level
runs `warmup_s` untimed, then until `duration_s` (`peak_duration_s` for the long run) or
`max_requests`, whichever comes first. Per level: `qps`, `examples_per_sec`, `p50_ms`/`p95_ms`/`p99_ms` (client-side
latency of answered requests), `errors` (non-200 answers), `lost` (no answer within
`request_timeout_s`, a transport error, or an answer without one score per example), and
the server batcher's mean batch size over the level. Client and server share the 2 cores:
the client's CPU is part of what the figures pay for.

In-process mode: `Predictor.predict_features` on already-parsed records at each batch size
(median of repeated calls, bounded in count and time), the parse rate of raw lines, and
the training step's pipelined examples/s on the same model (`experiments/bench_train.py`,
device backend, batch 4096) for `predict_to_train_ratio`.

Huge mode (issue #23 item 3): `bench_huge_table`'s ~1.01e9-row workload (cache backend,
mmap host table) trains `huge_train_steps` steps; its bundle stores only the rows
training wrote (`sfjax.serving.lazy_table`). A fresh process (no training code) serves
it through the device row cache, a cold cache per size, replaying the held-out examples
once each as requests of each `huge_batch_sizes` size. Reported: `table_rows`,
`materialised_rows`, `bundle_bytes`, the serving process's `peak_rss_bytes`, and per
size `examples_per_sec`, `hit_rate` (of unique rows) and host->device `bytes_per_request`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import ml_collections
import numpy as np

from experiments import cli
from sfjax.core import ConfigError
from sfjax.data import SyntheticCTR
from sfjax.serving import Features, Predictor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("http", "inprocess", "both", "huge")


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the config's names and counts.

  Raises:
    ConfigError: naming the field.
  """
  if config.mode not in MODES:
    raise ConfigError(f"config field mode: unknown {config.mode!r} (known: {', '.join(MODES)})")
  for field in ("concurrency", "request_sizes", "inprocess_batch_sizes", "server_batch_sizes",
                "huge_batch_sizes"):
    values = tuple(config[field])
    if not values or not all(isinstance(v, int) and v >= 1 for v in values):
      raise ConfigError(f"config field {field}: needs ints >= 1, got {values}")
  for field in ("duration_s", "peak_duration_s", "peak_concurrency", "max_requests",
                "request_timeout_s", "inprocess_seconds", "inprocess_reps", "train_steps",
                "max_batch", "request_lines", "huge_cardinality_scale", "huge_train_steps",
                "huge_train_batch_size", "huge_train_cache_rows", "huge_request_examples"):
    if not config[field] > 0:
      raise ConfigError(f"config field {field}: must be > 0, got {config[field]}")
  if config.huge_cache_rows < 0:
    raise ConfigError(f"config field huge_cache_rows: must be >= 0, got {config.huge_cache_rows}")
  if config.train_step and tuple(config.mlp_dims) != (400, 400, 400):
    raise ConfigError("config field train_step: the training step's benchmark has MLP "
                      f"400-400-400, not {tuple(config.mlp_dims)}")


def training_config(config: ml_collections.ConfigDict, data_dir: str) -> ml_collections.ConfigDict:
  """The trainer's config of the workload on the Criteo lines under `data_dir`."""
  from experiments.configs import ctr as ctr_config  # loads the training code (huge mode's
  # serving process imports this module and must not)
  c = ctr_config.get_config()
  c.data.format, c.data.hash_rows = "criteo", config.rows_per_field
  c.data.train_path, c.data.eval_path = f"{data_dir}/train.tsv", f"{data_dir}/requests.tsv"
  c.model.name, c.model.embed_dim, c.model.mlp_dims = config.model, config.embed_dim, tuple(
      config.mlp_dims)
  c.train.steps, c.train.eval_every = config.train_steps, config.train_steps
  c.train.batch_size, c.train.num_devices = config.train_batch_size, 1
  c.checkpoint.every_steps = config.train_steps
  return c


def write_lines(config: ml_collections.ConfigDict, data_dir: str) -> list[str]:
  """Writes the synthetic Criteo lines (train, requests) under `data_dir`; the request lines."""
  from experiments.configs import ctr as ctr_config
  synthetic = SyntheticCTR(ctr_config.get_config().data.synthetic, seed=0)
  if not config.bundle:
    synthetic.write_criteo(f"{data_dir}/train.tsv", "train", config.train_lines)
  synthetic.write_criteo(f"{data_dir}/requests.tsv", "eval", config.request_lines)
  return request_lines(f"{data_dir}/requests.tsv")


def make_bundle(config: ml_collections.ConfigDict, data_dir: str, root: str) -> str:
  """Trains the workload on `data_dir`'s lines and exports its bundle; the bundle's dir."""
  from sfjax.serving import write_bundle  # the model and training code load only for a bundle
  from sfjax.train import train_and_evaluate
  workdir, bundle = os.path.join(root, "run"), os.path.join(root, "bundle")
  train_and_evaluate(training_config(config, data_dir), workdir)
  write_bundle(workdir, bundle)
  return bundle


def request_lines(path: str) -> list[str]:
  """The raw lines of `path`, without their line ends."""
  with open(path) as f:
    return [line.rstrip("\n") for line in f]


def free_port() -> int:
  """A port nothing listens on now (127.0.0.1)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def server_env() -> dict:
  """This process's environment without the tests' fake-device flag (a server sees one CPU)."""
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  return dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")


def start_server(config: ml_collections.ConfigDict, bundle: str, log_path: str):
  """`experiments.serve` in a subprocess; (process, base url) once /healthz answers."""
  port = free_port()
  cmd = [sys.executable, "-m", "experiments.serve", f"--bundle={bundle}", "--host=127.0.0.1",
         f"--port={port}", f"--max_batch={config.max_batch}",
         f"--max_delay_ms={config.max_delay_ms}",
         "--batch_sizes=" + ",".join(str(b) for b in config.server_batch_sizes)]
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=server_env(), stdout=log, stderr=log)
  url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + config.startup_timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"the server exited with {proc.returncode}: "
                         f"{open(log_path).read()[-3000:]}")
    try:
      if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
        return proc, url
    except httpx.HTTPError:
      pass
    time.sleep(0.2)
  stop_server(proc)
  raise RuntimeError(f"the server did not answer /healthz in {config.startup_timeout_s} s")


def stop_server(proc) -> None:
  """Stops the server (SIGTERM, then SIGKILL after 10 s)."""
  proc.terminate()
  try:
    proc.wait(10)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


async def drive(clients: list[httpx.AsyncClient], bodies: list[bytes], size: int,
                seconds: float, max_requests: int) -> dict:
  """One closed loop per client for `seconds` or `max_requests` in all; the raw counts."""
  end, counter = time.perf_counter() + seconds, itertools.count()
  latencies, counts = [], {"errors": 0, "lost": 0, "sent": 0}
  headers = {"content-type": "application/json"}

  async def client_loop(client: httpx.AsyncClient, offset: int):
    while time.perf_counter() < end and (i := next(counter)) < max_requests:
      counts["sent"] += 1
      t = time.perf_counter()
      try:
        r = await client.post("/v1/predict", content=bodies[(i + offset) % len(bodies)],
                              headers=headers)
      except httpx.HTTPError:
        counts["lost"] += 1
        continue
      if r.status_code != 200:
        counts["errors"] += 1
      elif len(json.loads(r.content)["scores"]) != size:
        counts["lost"] += 1
      else:
        latencies.append(time.perf_counter() - t)

  t0 = time.perf_counter()
  await asyncio.gather(*(client_loop(c, k) for k, c in enumerate(clients)))
  return dict(counts, latencies=latencies, seconds=time.perf_counter() - t0)


async def run_level(url: str, bodies: list[bytes], size: int, concurrency: int, seconds: float,
                    config: ml_collections.ConfigDict) -> dict:
  """One level's figures (after `warmup_s` of untimed load on the same connections)."""
  # One client (one connection) per closed loop: httpx's pool costs CPU per request that
  # grows with its connection count (at 64 connections in one pool, the client alone
  # saturated a core at 200 requests/s), and that CPU is taken from the server here.
  limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
  async with contextlib.AsyncExitStack() as stack:
    clients = [await stack.enter_async_context(httpx.AsyncClient(
        base_url=url, limits=limits, timeout=config.request_timeout_s))
               for _ in range(concurrency)]
    await drive(clients, bodies, size, config.warmup_s, config.max_requests)
    before = (await clients[0].get("/v1/stats")).json()
    raw = await drive(clients, bodies, size, seconds, config.max_requests)
    after = (await clients[0].get("/v1/stats")).json()
  ok, ms = len(raw["latencies"]), np.asarray(raw["latencies"]) * 1e3
  p50, p95, p99 = (np.percentile(ms, [50, 95, 99]).tolist() if ok else [float("nan")] * 3)
  batches = max(after["batches"] - before["batches"], 1)
  return {"request_size": size, "concurrency": concurrency, "seconds": raw["seconds"],
          "requests": ok, "sent": raw["sent"], "errors": raw["errors"], "lost": raw["lost"],
          "qps": ok / raw["seconds"], "examples_per_sec": ok * size / raw["seconds"],
          "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
          "mean_batch": (after["examples"] - before["examples"]) / batches}


def request_bodies(lines: list[str], size: int) -> list[bytes]:
  """JSON bodies of `size` records each, cycling through `lines`."""
  count = max(len(lines) // size, 1)
  cycled = itertools.cycle(lines)
  return [json.dumps({"records": [next(cycled) for _ in range(size)]}).encode()
          for _ in range(count)]


def run_http(config: ml_collections.ConfigDict, bundle: str, lines: list[str], root: str) -> dict:
  """Every (request size, concurrency) level against one server subprocess."""
  # httpx logs each request at INFO (absl's level): a line per request costs the client
  # more CPU than the request, and the client shares the cores with the server.
  logging.getLogger("httpx").setLevel(logging.WARNING)
  proc, url = start_server(config, bundle, os.path.join(root, "server.log"))
  levels, peak = [], {}
  try:
    for size in config.request_sizes:
      bodies = request_bodies(lines, size)
      for concurrency in config.concurrency:
        levels.append(asyncio.run(run_level(url, bodies, size, concurrency, config.duration_s,
                                            config)))
      peak[str(size)] = asyncio.run(run_level(url, bodies, size, config.peak_concurrency,
                                              config.peak_duration_s, config))
    alive = proc.poll() is None
  finally:
    stop_server(proc)
  return {"levels": levels, "peak": peak, "server_alive_after": alive,
          "server": {"max_batch": config.max_batch, "max_delay_ms": config.max_delay_ms,
                     "batch_sizes": list(config.server_batch_sizes)}}


def time_calls(fn, seconds: float, reps: int) -> float:
  """Median seconds of `fn()` (after one untimed call), over `reps` calls or `seconds`."""
  fn()
  times, end = [], time.perf_counter() + seconds
  while len(times) < reps and (len(times) < 3 or time.perf_counter() < end):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def train_step_rate(config: ml_collections.ConfigDict) -> float:
  """The training step's pipelined examples/s on the same model (bench_train, batch 4096)."""
  from experiments import bench_train
  from experiments.configs import bench_train as bench_train_config
  c = bench_train_config.get_config()
  c.model, c.embed_dim, c.rows_per_field = config.model, config.embed_dim, config.rows_per_field
  c.num_fields, c.backend = 26, "device"  # the Criteo lines' 26 fields, the on-device table
  c.steps, c.warmup = config.train_step_steps, 4
  return bench_train.run(c)["examples_per_sec"]


def run_inprocess(config: ml_collections.ConfigDict, bundle: str, lines: list[str]) -> dict:
  """`Predictor.predict_features` at each batch size, the parse rate, the training step."""
  sizes = tuple(config.inprocess_batch_sizes)
  predictor = Predictor.load(bundle, batch_sizes=tuple(sorted(set(sizes))))
  records = list(itertools.islice(itertools.cycle(lines), max(sizes)))
  parse_s = time_calls(lambda: predictor.parse_records(records), config.inprocess_seconds, 20)
  features = predictor.parse_records(records)
  batches = {}
  for b in sizes:
    part = type(features)(*(None if x is None else np.ascontiguousarray(x[:b]) for x in features))
    median = time_calls(lambda part=part: predictor.predict_features(part),
                        config.inprocess_seconds, config.inprocess_reps)
    batches[str(b)] = {"ms": median * 1e3, "examples_per_sec": b / median}
  out = {"batches": batches, "parse_records_per_sec": len(records) / parse_s}
  if config.train_step:
    out["train_examples_per_sec"] = train_step_rate(config)
    largest = batches[str(max(sizes))]["examples_per_sec"]
    out["predict_to_train_ratio"] = largest / out["train_examples_per_sec"]
  return out


def run(config: ml_collections.ConfigDict) -> dict:
  """The benchmark (see the module docstring); its figures.

  Raises:
    ConfigError: see `validate`.
  """
  validate(config)
  if config.mode == "huge":
    with tempfile.TemporaryDirectory(prefix="bench_serving_huge_") as root:
      return run_huge(config, root)
  with tempfile.TemporaryDirectory(prefix="bench_serving_") as root:
    t = time.perf_counter()
    data_dir = os.path.join(root, "data")
    os.makedirs(data_dir)
    lines = write_lines(config, data_dir)
    bundle = config.bundle or make_bundle(config, data_dir, root)
    result = {"benchmark": "bench_serving", "mode": config.mode, "model": config.model,
              "rows_per_field": config.rows_per_field, "embed_dim": config.embed_dim,
              "mlp_dims": list(config.mlp_dims), "bundle_s": time.perf_counter() - t}
    if config.mode in ("http", "both"):
      result["http"] = run_http(config, bundle, lines, root)
    if config.mode in ("inprocess", "both"):
      result["inprocess"] = run_inprocess(config, bundle, lines)
  return result


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
  code = ("import json, sys\nfrom experiments.bench_serving import replay_requests\n"
          "print(json.dumps(replay_requests(*json.loads(sys.argv[1]))))")
  r = subprocess.run([sys.executable, "-c", code, args], cwd=ROOT, env=server_env(),
                     capture_output=True, text=True, timeout=config.startup_timeout_s * 4)
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


if __name__ == "__main__":
  cli.run_benchmark("bench_serving", run)
