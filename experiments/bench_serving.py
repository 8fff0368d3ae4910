"""The serving path under load: HTTP over loopback, and the predictor in-process (issue #23).

  python -m experiments.bench_serving [--config=experiments/configs/bench_serving.py[:smoke]]
      [--config.mode=http|inprocess|both --config.bundle=BUNDLE --config.concurrency=1,8,32,64
       --config.duration_s=10 --config.peak_duration_s=60 --config.out=bench.json]

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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx
import ml_collections
import numpy as np

from experiments import bench_train, cli
from experiments.configs import bench_train as bench_train_config
from experiments.configs import ctr as ctr_config
from sfjax.core import ConfigError
from sfjax.data import SyntheticCTR
from sfjax.serving import Predictor, write_bundle
from sfjax.train import train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("http", "inprocess", "both")


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the config's names and counts.

  Raises:
    ConfigError: naming the field.
  """
  if config.mode not in MODES:
    raise ConfigError(f"config field mode: unknown {config.mode!r} (known: {', '.join(MODES)})")
  for field in ("concurrency", "request_sizes", "inprocess_batch_sizes", "server_batch_sizes"):
    values = tuple(config[field])
    if not values or not all(isinstance(v, int) and v >= 1 for v in values):
      raise ConfigError(f"config field {field}: needs ints >= 1, got {values}")
  for field in ("duration_s", "peak_duration_s", "peak_concurrency", "max_requests",
                "request_timeout_s", "inprocess_seconds", "inprocess_reps", "train_steps",
                "max_batch", "request_lines"):
    if not config[field] > 0:
      raise ConfigError(f"config field {field}: must be > 0, got {config[field]}")
  if config.train_step and tuple(config.mlp_dims) != (400, 400, 400):
    raise ConfigError("config field train_step: the training step's benchmark has MLP "
                      f"400-400-400, not {tuple(config.mlp_dims)}")


def training_config(config: ml_collections.ConfigDict, data_dir: str) -> ml_collections.ConfigDict:
  """The trainer's config of the workload on the Criteo lines under `data_dir`."""
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
  synthetic = SyntheticCTR(ctr_config.get_config().data.synthetic, seed=0)
  if not config.bundle:
    synthetic.write_criteo(f"{data_dir}/train.tsv", "train", config.train_lines)
  synthetic.write_criteo(f"{data_dir}/requests.tsv", "eval", config.request_lines)
  return request_lines(f"{data_dir}/requests.tsv")


def make_bundle(config: ml_collections.ConfigDict, data_dir: str, root: str) -> str:
  """Trains the workload on `data_dir`'s lines and exports its bundle; the bundle's dir."""
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


if __name__ == "__main__":
  cli.run_benchmark("bench_serving", run)
