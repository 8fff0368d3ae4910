"""Helpers of the tests that launch two local `jax.distributed` processes as subprocesses."""

import os
import socket
import subprocess
import sys

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


def launch(worker: str, payload: str, out_dir, timeout: int) -> list[str]:
  """Runs `python -c worker payload port pid out_dir` as processes 0 and 1 of a 2-process
  `jax.distributed` job on loopback (CPU, 4 fake devices each, gloo), bounded by `timeout`
  seconds; asserts both exit 0 (with the tail of the failing one's log). Returns the logs."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS="--xla_force_host_platform_device_count=4")
  env.pop(distributed.ENV_COORDINATOR, None)
  port = str(free_port())
  procs = [subprocess.Popen([sys.executable, "-c", worker, payload, port, str(pid), str(out_dir)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True) for pid in (0, 1)]
  logs = []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for pid, p in enumerate(procs):
    assert p.returncode == 0, f"process {pid} failed:\n{logs[pid][-6000:]}"
  return logs
