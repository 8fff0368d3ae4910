"""`bench_scaling`'s per-process runs: P local `jax.distributed` processes on loopback.

`launch(payload, count, devices_per_process, timeout_s)` starts

  python -m experiments.scaling_processes PAYLOAD PORT PID OUT_DIR COUNT

as processes 0..P-1 of one job (CPU, `devices_per_process` fake devices each, gloo
collectives; one process: no coordinator at all), waits at most `timeout_s` for all of
them (then kills every one still running and raises, naming them), and returns each
process's figures. Every cross-process wait inside is bounded by
`distributed.timeout_s` (`payload['timeout_s']`), so a failed peer ends the others.

Each process (`measure`), on the trainer's config in the payload (device backend,
`embedding.sharding=row`, synthetic data read by index):
  1. links: the median time of an all-reduce over every device of the job, and of the
     input exchange (`host_exchange.gather_batch`: process 0's key-value store), at two
     sizes each (the cost model fits bandwidth and latency to them);
  2. input alone: its own rows of the run's global batches read by index (`read_train`,
     no exchange), then the same batches through the trainer's `InputFeed` (read +
     exchange), each on a fresh data set (cold, as the training's): examples/s;
  3. training: `warmup_steps` untimed, `steps` timed end to end (pipelined), then
     `device_steps` timed each to the end of the step (the device step, input wait
     excluded); the compiled step's collectives (`collective_bytes`) and XLA cost
     analysis per program, weighted by the steps that ran it, and the
     count of each kind of collective in it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from experiments.configs import ctr
from sfjax.core import fake_device_env
from sfjax.data import Batch, make_dataset
from sfjax.parallel import (
  barrier,
  begin_stream,
  collective_bytes,
  gather_batch,
  initialize_distributed,
  make_mesh,
  process_rows,
  rows_to_bytes,
)
from sfjax.train import InputFeed, build_trainer, run_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LINK_REPEATS = 5
_MODELLED = ("all-reduce", "all-gather", "reduce-scatter")  # the kinds the cost model knows
_OP = re.compile(r"\s(" + "|".join(_MODELLED) + r")(?:-start)?\(")  # an HLO instruction


def _free_port() -> int:
  """A TCP port free on the loopback interface now (the coordinator's)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(payload: dict, count: int, devices_per_process: int, timeout_s: float) -> list[dict]:
  """Runs `count` processes of one local job; returns their figures (process order).

  Raises:
    RuntimeError: a process still ran after `timeout_s` (all are then killed) or ended
      with an error (the tail of its log in the message).
  """
  env = dict(fake_device_env(devices_per_process, {**os.environ, "XLA_FLAGS": ""}),
             JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  env.pop("JAX_COORDINATOR_ADDRESS", None)
  port, text = str(_free_port()), json.dumps(payload)
  with tempfile.TemporaryDirectory() as out:
    logs = [open(os.path.join(out, f"p{pid}.log"), "w+") for pid in range(count)]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "experiments.scaling_processes", text, port, str(pid), out,
         str(count)], cwd=ROOT, env=env, stdout=logs[pid], stderr=subprocess.STDOUT)
        for pid in range(count)]
    deadline = time.time() + timeout_s
    try:
      while any(p.poll() is None for p in procs) and time.time() < deadline:
        time.sleep(0.05)
    finally:
      hung = [pid for pid, p in enumerate(procs) if p.poll() is None]
      for pid in hung:
        procs[pid].kill()
        procs[pid].wait()
    tails = []
    for f in logs:
      f.seek(0)
      tails.append(f.read()[-3000:])
      f.close()
    if hung:
      raise RuntimeError(f"bench_scaling: processes {hung} of {count} still ran after "
                         f"{timeout_s:g} s (killed):\n{tails[hung[0]]}")
    failed = [pid for pid, p in enumerate(procs) if p.returncode != 0]
    if failed:
      raise RuntimeError(f"bench_scaling: process {failed[0]} of {count} exited with "
                         f"{procs[failed[0]].returncode}:\n{tails[failed[0]]}")
    results = []
    for pid in range(count):
      with open(os.path.join(out, f"p{pid}.json")) as f:
        results.append(json.load(f))
  return results


def _median_seconds(fn, repeats: int = _LINK_REPEATS) -> float:
  fn()  # compile / first use
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def _allreduce_seconds(mesh, sizes: list[int]) -> list[float]:
  """Median seconds of a psum over every device of `mesh` of `size` bytes per device."""
  d, out = mesh.size, []
  for size in sizes:
    n = max(1, size // 4)
    x = jax.make_array_from_callback((d, n), NamedSharding(mesh, P("data")),
                                     lambda idx, n=n: np.ones((d, n), np.float32)[idx])
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "data"), mesh=mesh,
                              in_specs=P("data"), out_specs=P()))
    out.append(_median_seconds(lambda f=f, x=x: jax.block_until_ready(f(x))))
  return out


def _exchange_seconds(sizes: list[int]) -> list[float]:
  """Median seconds of `gather_batch` of `size` bytes of this process's rows."""
  barrier("bench_scaling/exchange")
  stream, number, out = begin_stream(), [0], []
  for size in sizes:
    rows = (np.zeros(size, np.uint8),)

    def once(rows=rows):
      number[0] += 1
      gather_batch(number[0], rows, stream=stream)

    out.append(_median_seconds(once))
  barrier("bench_scaling/exchange_done")
  return out


def _input_rates(config, batches: int) -> dict:
  """Examples/s of this process's own rows of the run's first `batches` global batches
  read by index, and of the same batches through the trainer's `InputFeed` (read +
  exchange); each on a data set of its own, cold as the training's."""
  batch, seed = config.train.batch_size, config.seed
  data = make_dataset(config.data, seed)
  order, mine = data.train_order(batch, seed), process_rows(batch)
  indices = [order.next_batch()[mine] for _ in range(batches)]
  t = time.perf_counter()
  read = [data.read_train(i) for i in indices]
  read_s = time.perf_counter() - t
  first: Batch = read[0]
  example_bytes = len(rows_to_bytes(tuple(first))) / first.size
  barrier("bench_scaling/feed")
  feed = InputFeed(make_dataset(config.data, seed), batch, seed)
  t = time.perf_counter()
  for _ in range(batches):
    next(feed)
  feed_s = time.perf_counter() - t
  barrier("bench_scaling/feed_done")
  own = batches * (mine.stop - mine.start)
  return {"read_examples_per_sec": own / read_s, "feed_examples_per_sec": own / feed_s,
          "feed_global_examples_per_sec": batches * batch / feed_s,
          "example_bytes": example_bytes}


def _train(config, data, warmup: int, steps: int, device_steps: int) -> dict:
  """Trains and times (module docstring, 3); the compiled programs' bytes and FLOPs."""
  barrier("bench_scaling/train")
  trainer = build_trainer(config, data.spec)
  backend, batch = trainer.backend, config.train.batch_size
  first, keys = {}, []

  def recorded(inputs):
    for x in inputs:
      key = str([leaf.shape for leaf in jax.tree.leaves(x[0])])
      first.setdefault(key, x[0])
      keys.append(key)
      yield x

  inputs = backend.train_inputs(InputFeed(data, batch, config.seed))
  try:
    steps_iter, state = recorded(inputs), trainer.state
    state, warm = run_steps(trainer.run_step, state, steps_iter, 1, warmup, batch)
    state, timed = run_steps(trainer.run_step, state, steps_iter, warmup + 1, warmup + steps,
                             batch)
    state, waited = run_steps(trainer.run_step, state, steps_iter, warmup + steps + 1,
                              warmup + steps + device_steps, batch, wait_each_step=True)
    figures = {}
    for key, db in first.items():
      compiled = trainer.run_step.jitted.lower(state, db).compile()
      cost = compiled.cost_analysis()  # a dict (older JAX: a one-element list of it)
      cost = (cost[0] if isinstance(cost, (list, tuple)) and cost else cost) or {}
      text = compiled.as_text()
      counts = {f"{kind}_count": float(found.count(kind)) for found in [_OP.findall(text)]
                for kind in _MODELLED}
      figures[key] = {**collective_bytes(text, trainer.mesh.size), **counts,
                      "flops": float(cost.get("flops", 0.0)),
                      "bytes_accessed": float(cost.get("bytes accessed", 0.0))}
  finally:
    inputs.close()
    backend.close()
  ran = keys[:warmup + steps + device_steps]
  new = [i == 0 or key not in ran[:i] for i, key in enumerate(ran)]  # the step compiled
  waited_new = new[warmup + steps:]
  device_times = [t for t, n in zip(waited.step_seconds, waited_new, strict=True) if not n]
  per_step = {k: float(np.mean([figures[key][k] for key in ran])) for k in next(
      iter(figures.values()))}
  d = trainer.mesh.size
  return {
      "examples_per_sec": timed.examples_per_sec,
      # the median device step, steps that compiled a new shape left out (all, if every one did)
      "device_step_seconds": float(np.median(device_times or waited.step_seconds)),
      "compiles_in_timed_steps": int(sum(new[warmup:warmup + steps])),
      "losses": [float(x) for x in list(warm.losses) + list(timed.losses) + list(waited.losses)],
      "programs": len(figures),
      "flops_per_device": per_step["flops"], "bytes_accessed_per_device": per_step["bytes_accessed"],
      "collective_ring_bytes_per_step": per_step["ring_bytes"],
      # full sizes (the cost model's S): all-gather result = operand x group
      "all_reduce_bytes_per_step": per_step["all-reduce_bytes"],
      "all_gather_bytes_per_step": per_step["all-gather_bytes"] * d,
      "reduce_scatter_bytes_per_step": per_step["reduce-scatter_bytes"],
      "collective_counts": {kind: per_step[f"{kind}_count"] for kind in _MODELLED},
      "table_rows": int(backend.num_rows), "table_capacity_rows": int(backend.capacity_rows),
      "table_rows_per_device": int(backend.rows_per_device),
  }


def measure(config, bench: dict) -> dict:
  """This process's figures (module docstring) on the trainer's `config`."""
  count, batch = jax.process_count(), config.train.batch_size
  mesh = make_mesh(0)
  out = {"process": jax.process_index(), "processes": count, "devices": mesh.size,
         "local_devices": jax.local_device_count(), "batch_size": batch,
         "allreduce_sizes": bench["allreduce_sizes"],
         "allreduce_seconds": _allreduce_seconds(mesh, bench["allreduce_sizes"]),
         "exchange_sizes": bench["exchange_sizes"],
         "exchange_seconds": _exchange_seconds(bench["exchange_sizes"]) if count > 1 else []}
  steps = bench["warmup_steps"] + bench["steps"] + bench["device_steps"]
  out.update(_input_rates(config, steps))
  # bytes this process sends and receives per step in the input exchange: its B/P rows
  # out, the others' (P-1) B/P in
  out["host_exchange_bytes_per_step"] = (out["example_bytes"] * batch if count > 1 else 0.0)
  out.update(_train(config, make_dataset(config.data, config.seed), bench["warmup_steps"],
                    bench["steps"], bench["device_steps"]))
  return out


def main(argv: list[str]) -> None:
  """The worker: `PAYLOAD PORT PID OUT_DIR COUNT` (see `launch`)."""
  payload, port, pid, out, count = json.loads(argv[1]), argv[2], int(argv[3]), argv[4], int(argv[5])
  config = ctr.get_config("smoke")
  config.update_from_flattened_dict(payload["config"])
  if count > 1:
    config.distributed.coordinator = f"127.0.0.1:{port}"
    config.distributed.num_processes, config.distributed.process_id = count, pid
    config.distributed.timeout_s = float(payload["timeout_s"])
  initialize_distributed(config)
  result = measure(config, payload["bench"])
  with open(os.path.join(out, f"p{pid}.json"), "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  main(sys.argv)
