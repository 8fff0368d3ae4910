"""Helpers of the tests that launch two local `jax.distributed` processes as subprocesses."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

from sfjax.core import fake_device_env
from sfjax.parallel import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  """A TCP port free on the loopback interface now (the coordinator's)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def flat_config(config) -> dict:
  """A CTR ConfigDict as `{dotted.key: value}` (tuples as lists: JSON for the workers,
  which rebuild it with `update_from_flattened_dict`), without the `distributed` block
  (each worker sets its own) and with `train.num_devices = 0` (every device of both)."""
  out = {}

  def walk(prefix, d):
    for k, v in d.items():
      if isinstance(v, dict):
        walk(prefix + k + ".", v)
      else:
        out[prefix + k] = list(v) if isinstance(v, tuple) else v

  walk("", config.to_dict())
  out = {k: v for k, v in out.items() if not k.startswith("distributed.")}
  out["train.num_devices"] = 0
  return out


class Ended(NamedTuple):
  """How one launched process ended: exit status, its log (stdout and stderr) and the
  wall-clock time (`time.time()`) it was seen to end."""

  returncode: int
  log: str
  ended_at: float


def run_processes(worker: str, payload: str, out_dir, timeout: int,
                  devices: int = 4, count: int = 2) -> list[Ended]:
  """Runs `python -c worker payload port pid out_dir count` as processes 0..count-1 of one
  `jax.distributed` job on loopback (CPU, `devices` fake devices each, gloo), bounded by
  `timeout` seconds (then all are killed and the test fails, naming the ones still running)."""
  env = dict(fake_device_env(devices, {**os.environ, "XLA_FLAGS": ""}),
             JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  env.pop(distributed.ENV_COORDINATOR, None)
  port = str(free_port())
  with tempfile.TemporaryDirectory() as logs_dir:
    logs = [open(os.path.join(logs_dir, f"p{pid}.log"), "w+") for pid in range(count)]
    procs = [subprocess.Popen([sys.executable, "-c", worker, payload, port, str(pid),
                               str(out_dir), str(count)], cwd=ROOT, env=env, stdout=logs[pid],
                              stderr=subprocess.STDOUT, text=True) for pid in range(count)]
    ended: dict[int, float] = {}
    deadline = time.time() + timeout
    try:
      while len(ended) < count and time.time() < deadline:
        for pid, p in enumerate(procs):
          if pid not in ended and p.poll() is not None:
            ended[pid] = time.time()
        time.sleep(0.05)
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
          p.wait()
    texts = []
    for f in logs:
      f.seek(0)
      texts.append(f.read())
      f.close()
  hung = [pid for pid in range(count) if pid not in ended]
  assert not hung, (f"processes {hung} still ran after {timeout} s:\n" +
                    "\n".join(texts[pid][-3000:] for pid in hung))
  return [Ended(procs[pid].returncode, texts[pid], ended[pid]) for pid in range(count)]


def launch(worker: str, payload: str, out_dir, timeout: int, devices: int = 4,
           count: int = 2) -> list[str]:
  """`run_processes`, asserting every process exits 0 (with the tail of the failing one's
  log). Returns the logs."""
  ended = run_processes(worker, payload, out_dir, timeout, devices, count)
  for pid, e in enumerate(ended):
    assert e.returncode == 0, f"process {pid} failed:\n{e.log[-6000:]}"
  return [e.log for e in ended]


class Joined(NamedTuple):
  """What a launched worker knows once it joined the run (`join_run`)."""

  config: object  # the CTR config (ml_collections.ConfigDict) with its distributed block set
  payload: object  # the launch's payload, parsed from JSON
  pid: int  # this process's index
  out: str  # the launch's output directory
  count: int  # processes in the run


def join_run(cfg_of=lambda payload: payload, initialize: bool = True) -> Joined:
  """In a worker started by `run_processes`: reads `payload port pid out_dir count` from
  argv, builds the smoke CTR config updated with `cfg_of(payload)` (flat dotted keys), points
  it at the loopback coordinator and, unless `initialize` is False, joins the run
  (`distributed.initialize_distributed`, asserting every process joined)."""
  import json

  from experiments.configs import ctr
  payload, port, pid, out = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
  count = int(sys.argv[5])
  c = ctr.get_config("smoke")
  c.update_from_flattened_dict(cfg_of(payload))
  c.distributed.coordinator = "127.0.0.1:" + port
  c.distributed.num_processes, c.distributed.process_id = count, pid
  if initialize:
    assert distributed.initialize_distributed(c) == count
  return Joined(c, payload, pid, out, count)
