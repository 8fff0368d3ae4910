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
access log off, uvicorn's `server_http` / `server_loop`); a client in this process
(`sfjax.serving.load_client`: `client=raw`, HTTP/1.1 on asyncio streams with pre-encoded
requests, or `client=httpx`; `raw,httpx` runs both) keeps `concurrency` keep-alive
connections each with one request in flight (the next one is sent when the last is
answered), for each request size (1 and 64 examples) and each level of `concurrency`;
then one long run at `peak_concurrency` with the first client (`peak`: the issue's 60 s
without errors or lost requests). A level runs `warmup_s` untimed, then until
`duration_s` (`peak_duration_s` for the long run) or `max_requests`, whichever comes
first. Per level: `qps`, `examples_per_sec`, `p50_ms`/`p95_ms`/`p99_ms` (client-side
latency of verified answers), `errors` (non-200 answers), `lost` (no answer within
`request_timeout_s`, a transport error, or a body that is not one probability per
example), the server batcher's mean batch size over the level, and `server_cpu_ms` /
`client_cpu_ms`: CPU milliseconds per verified answer of the server process (every thread,
from /proc) and of this process (the client). Client and server share the 2 cores: the
client's CPU is part of what the figures pay for, and the CPU figures hold up on a busy
machine where the rates do not.

In-process mode: `Predictor.predict_features` on already-parsed records at each batch size
(median of repeated calls, bounded in count and time), the parse rate of raw lines, and
the training step's pipelined examples/s on the same model (`experiments/bench_train.py`,
device backend, batch 4096) for `predict_to_train_ratio`. Beside each batch's `predict`,
interleaved in the same window: the floor, the bundle's forward alone on the batch's rows
already gathered on the device (`Predictor.forward_logits`; `floor_ms`,
`floor_examples_per_sec`, `floor_gflops_per_sec` from XLA's cost analysis of that program,
and `predict_over_floor` = predict's examples/s over the floor's), and with
`inprocess_host_gather` the host-gather path (`device_table=False`: rows gathered in
numpy and copied in, the predictor before the one-dispatch path; `host_gather_ms`).
`compiler_options` (XLA options of the predictor's compiles,
`forward_program.parse_compiler_options`) apply to every program timed here.

Huge mode (issue #23 item 3): `experiments/serving_huge.py`.
"""

from __future__ import annotations

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
import urllib.request

import jax
import ml_collections
import numpy as np

from experiments import cli
from sfjax.core import ConfigError
from sfjax.data import SyntheticCTR
from sfjax.serving import (
  LOAD_CLIENTS,
  Predictor,
  encode_request,
  measure_level,
  parse_compiler_options,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("http", "inprocess", "both", "huge")
HTTP_IMPLS = ("auto", "httptools", "h11")  # uvicorn's --http (auto: httptools if installed)
LOOP_IMPLS = ("auto", "uvloop", "asyncio")  # uvicorn's --loop (auto: uvloop if installed)


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the config's names and counts.

  Raises:
    ConfigError: naming the field.
  """
  if config.mode not in MODES:
    raise ConfigError(f"config field mode: unknown {config.mode!r} (known: {', '.join(MODES)})")
  parse_clients(config.client)
  for field, known in (("server_http", HTTP_IMPLS), ("server_loop", LOOP_IMPLS)):
    if config[field] not in known:
      raise ConfigError(f"config field {field}: unknown {config[field]!r} (known: "
                        f"{', '.join(known)})")
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
  try:
    parse_compiler_options(config.compiler_options)
  except ValueError as e:
    raise ConfigError(f"config field {e}") from None
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
         f"--max_delay_ms={config.max_delay_ms}", f"--http={config.server_http}",
         f"--loop={config.server_loop}",
         "--batch_sizes=" + ",".join(str(b) for b in config.server_batch_sizes)]
  with open(log_path, "w") as log:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=server_env(), stdout=log, stderr=log)
  url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + config.startup_timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"the server exited with {proc.returncode}: "
                         f"{open(log_path).read()[-3000:]}")
    try:
      with urllib.request.urlopen(f"{url}/healthz", timeout=1.0) as r:
        if r.status == 200:
          return proc, url
    except OSError:  # refused until it listens (urllib's URLError is an OSError)
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


def run_level(url: str, bodies: list[bytes], size: int, concurrency: int, seconds: float,
              config: ml_collections.ConfigDict, client: str, server_pid: int) -> dict:
  """One level's figures (after `warmup_s` of untimed load on the same connections),
  with the CPU milliseconds per answered request of the server and of the client."""
  host, port = url.removeprefix("http://").rsplit(":", 1)
  payloads = [encode_request("POST", host, int(port), "/v1/predict", b)
              for b in bodies]
  got = measure_level(client, host, int(port), payloads, size, concurrency, config.warmup_s,
                      seconds, config.max_requests, config.request_timeout_s, server_pid)
  raw, before, after = got.drive, got.stats_before, got.stats_after
  client_cpu, server_cpu = got.client_cpu_s, got.server_cpu_s
  ok, ms = len(raw.latencies), np.asarray(raw.latencies) * 1e3
  p50, p95, p99 = (np.percentile(ms, [50, 95, 99]).tolist() if ok else [float("nan")] * 3)
  batches = max(after["batches"] - before["batches"], 1)
  return {"client": client, "request_size": size, "concurrency": concurrency,
          "seconds": raw.seconds, "requests": ok, "sent": raw.sent, "errors": raw.errors,
          "lost": raw.lost, "qps": ok / raw.seconds, "examples_per_sec": ok * size / raw.seconds,
          "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
          "mean_batch": (after["examples"] - before["examples"]) / batches,
          "server_cpu_ms": server_cpu * 1e3 / max(ok, 1),
          "client_cpu_ms": client_cpu * 1e3 / max(ok, 1)}


def request_bodies(lines: list[str], size: int) -> list[bytes]:
  """JSON bodies of `size` records each, cycling through `lines`."""
  count = max(len(lines) // size, 1)
  cycled = itertools.cycle(lines)
  return [json.dumps({"records": [next(cycled) for _ in range(size)]}).encode()
          for _ in range(count)]


def run_http(config: ml_collections.ConfigDict, bundle: str, lines: list[str], root: str) -> dict:
  """Every (client, request size, concurrency) level against one server subprocess, then
  the long run at `peak_concurrency` per request size with the first client."""
  # httpx logs each request at INFO (absl's level): a line per request costs the client
  # more CPU than the request, and the client shares the cores with the server.
  logging.getLogger("httpx").setLevel(logging.WARNING)
  clients = parse_clients(config.client)
  proc, url = start_server(config, bundle, os.path.join(root, "server.log"))
  levels, peak = [], {}
  try:
    for size in config.request_sizes:
      bodies = request_bodies(lines, size)
      for client in clients:
        for concurrency in config.concurrency:
          levels.append(run_level(url, bodies, size, concurrency, config.duration_s, config,
                                  client, proc.pid))
      peak[str(size)] = run_level(url, bodies, size, config.peak_concurrency,
                                  config.peak_duration_s, config, clients[0], proc.pid)
    alive = proc.poll() is None
  finally:
    stop_server(proc)
  with open(os.path.join(root, "server.log"), encoding="utf-8") as f:
    stack = next((line.strip() for line in f if line.startswith("http stack:")), "")
  return {"levels": levels, "peak": peak, "server_alive_after": alive,
          "server": {"max_batch": config.max_batch, "max_delay_ms": config.max_delay_ms,
                     "batch_sizes": list(config.server_batch_sizes), "stack": stack}}


def parse_clients(text: str) -> tuple[str, ...]:
  """'raw,httpx' -> ('raw', 'httpx'); raises ConfigError naming the field."""
  clients = tuple(cli.split_names(str(text), "client", LOAD_CLIENTS))
  if not clients:
    raise ConfigError(f"config field client: needs one of {', '.join(LOAD_CLIENTS)}")
  return clients


def time_calls(fn, seconds: float, reps: int) -> float:
  """Median seconds of `fn()` (after one untimed call), over `reps` calls or `seconds`."""
  fn()
  times, end = [], time.perf_counter() + seconds
  while len(times) < reps and (len(times) < 3 or time.perf_counter() < end):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def time_interleaved(fns: dict, seconds: float, reps: int) -> dict[str, float]:
  """Median seconds of each `fns[name]()`, called in turn (one untimed round first) for
  `reps` rounds or `seconds` (at least 3 rounds): every function sees the same load."""
  for fn in fns.values():
    fn()
  times: dict[str, list[float]] = {name: [] for name in fns}
  end, rounds = time.perf_counter() + seconds, 0
  while rounds < reps and (rounds < 3 or time.perf_counter() < end):
    for name, fn in fns.items():
      t = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t)
    rounds += 1
  return {name: statistics.median(ts) for name, ts in times.items()}


def floor_call(predictor: Predictor, features):
  """() -> the bundle's forward alone on `features`' rows, gathered and on the device
  beforehand (waited for); and its XLA FLOPs per call."""
  from sfjax.cohorts import cost_dict  # loads model code: huge mode's serving
  # process imports this module and must not
  ids, dense = np.asarray(features.ids, np.int64), np.asarray(features.dense, np.float32)
  rows = (ids + predictor.offsets[None, :]).reshape(-1)
  emb = np.asarray(predictor.rows.gather(rows)).reshape(ids.shape[0], ids.shape[1], -1)
  emb_on_device, dense_on_device = jax.device_put(emb), jax.device_put(dense)
  program = predictor.forward_program(ids.shape[0])
  flops = float(cost_dict(program.cost_analysis()).get("flops", 0.0))
  return (lambda: predictor.forward_logits(emb_on_device, dense_on_device).block_until_ready(),
          flops)


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
  load = {"batch_sizes": tuple(sorted(set(sizes))),
          "compiler_options": parse_compiler_options(config.compiler_options)}
  predictor = Predictor.load(bundle, **load)
  host = Predictor.load(bundle, device_table=False, **load) if config.inprocess_host_gather else None
  records = list(itertools.islice(itertools.cycle(lines), max(sizes)))
  parse_s = time_calls(lambda: predictor.parse_records(records), config.inprocess_seconds, 20)
  features = predictor.parse_records(records)
  batches = {}
  for b in sizes:
    part = type(features)(*(None if x is None else np.ascontiguousarray(x[:b]) for x in features))
    floor, flops = floor_call(predictor, part)
    fns = {"predict": lambda part=part: predictor.predict_features(part), "floor": floor}
    if host is not None:
      fns["host_gather"] = lambda part=part: host.predict_features(part)
    median = time_interleaved(fns, config.inprocess_seconds, config.inprocess_reps)
    batches[str(b)] = {"ms": median["predict"] * 1e3, "examples_per_sec": b / median["predict"],
                       "floor_ms": median["floor"] * 1e3,
                       "floor_examples_per_sec": b / median["floor"],
                       "predict_over_floor": median["floor"] / median["predict"],
                       "floor_gflops_per_sec": flops / median["floor"] / 1e9,
                       "flops_per_example": flops / b}
    if host is not None:
      batches[str(b)]["host_gather_ms"] = median["host_gather"] * 1e3
  out = {"batches": batches, "parse_records_per_sec": len(records) / parse_s,
         "device_table": predictor.device_table, "compiler_options": load["compiler_options"]}
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
    from experiments import serving_huge  # its workload loads bench_huge_table
    with tempfile.TemporaryDirectory(prefix="bench_serving_huge_") as root:
      return serving_huge.run_huge(config, root)
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
