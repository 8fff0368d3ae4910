"""`experiments.train_ctr` in a subprocess with one fault injected at the file layer (issue #25
item 7), for tests/faults/checkpoint_faults_test.py and table_faults_test.py.

The fault replaces one of the project's own file functions in the child process, so the rest
of the run (threads, checkpoints, the CLI's error line) is the real one:

  table_write:STEP:ERRNO  the chunk writer of step STEP's checkpoint
                          (`sfjax.checkpoint.table_format._write_file`, on the async table
                          save's thread) raises OSError(ERRNO)
  table_write:STEP:kill   ... SIGKILLs the process instead (mid-save)
  meta_write:N:ERRNO      the N-th write that marks the mmap host table dirty (a write-back's
                          `host_table_files.write_meta(clean=False)`) raises OSError(ERRNO)
  create:ERRNO            creating the mmap host table: `written.npy`, the last data file,
                          is created and then its write raises OSError(ERRNO)
  read_eio                the first read of every file under checkpoints/step_* raises
                          OSError(EIO) (`builtins.open`); later reads succeed
"""

import builtins
import errno
import json
import os
import runpy
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _error(code: str, path: str) -> OSError:
  number = getattr(errno, code)
  return OSError(number, os.strerror(number), path)


def _install_table_write(step: str, action: str) -> None:
  from sfjax.checkpoint import table_format  # pylint: disable=g-import-not-at-top
  real, tag = table_format._write_file, f"step_{int(step):08d}"

  def write(directory, name, data):
    if tag in directory:
      if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
      raise _error(action, os.path.join(directory, name))
    return real(directory, name, data)

  table_format._write_file = write


def _install_meta_write(n: str, code: str) -> None:
  from sfjax.embedding import host_table_files  # pylint: disable=g-import-not-at-top
  real, dirty_writes = host_table_files.write_meta, []

  def write_meta(path, spec, num_materialised, clean, *version):
    if not clean:
      dirty_writes.append(path)
      if len(dirty_writes) == int(n):
        raise _error(code, os.path.join(path, host_table_files.META_FILE))
    return real(path, spec, num_materialised, clean, *version)

  host_table_files.write_meta = write_meta


def _install_create(code: str) -> None:
  real = np.lib.format.open_memmap

  def open_memmap(filename, *args, **kwargs):
    if os.path.basename(filename) == "written.npy":
      open(filename, "wb").close()
      raise _error(code, filename)
    return real(filename, *args, **kwargs)

  np.lib.format.open_memmap = open_memmap


def _install_read_eio() -> None:
  real, failed = builtins.open, set()

  def flaky_open(file, mode="r", *args, **kwargs):
    path = os.fspath(file) if isinstance(file, (str, os.PathLike)) else ""
    if ("/checkpoints/step_" in path and not any(c in mode for c in "wax+")
        and path not in failed):
      failed.add(path)
      raise _error("EIO", path)
    return real(file, mode, *args, **kwargs)

  builtins.open = flaky_open


def install(fault: str) -> None:
  """Installs `fault` (the module docstring's forms; '' = none) in this process."""
  kind, *args = fault.split(":") if fault else ("",)
  installers = {"table_write": _install_table_write, "meta_write": _install_meta_write,
                "create": _install_create, "read_eio": _install_read_eio, "": lambda: None}
  installers[kind](*args)


STEPS, EVERY = 160, 20  # the runs' steps; evals and checkpoints every EVERY steps


def smoke_flags(workdir: str) -> dict:
  """The faulted runs' settings: the cache backend on an mmap host table inside `workdir`,
  checkpoints every `EVERY` steps (async table saves), the newest two kept."""
  return {"train.num_devices": 1, "train.steps": STEPS, "train.eval_every": EVERY,
          "train.batch_size": 128, "train.log_every": 40, "checkpoint.every_steps": EVERY,
          "checkpoint.keep": 2, "embedding.backend": "cache", "embedding.cache_rows": 0.25,
          "embedding.host_storage": "mmap", "embedding.host_path": os.path.join(workdir, "table")}


def read_records(workdir: str) -> list[dict]:
  """`workdir/metrics.jsonl`'s records."""
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def run_train_ctr(fault: str, workdir: str, timeout: float = 300) -> subprocess.CompletedProcess:
  """Runs `experiments.train_ctr` (smoke config, `smoke_flags`) with `fault` ('' = none)."""
  argv = ["--config=experiments/configs/ctr.py:smoke", f"--workdir={workdir}",
          *[f"--config.{k}={v}" for k, v in smoke_flags(workdir).items()]]
  code = "from tests.faults.file_faults import main; main()"
  return subprocess.run([sys.executable, "-c", code, fault, *argv], cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""),
                        capture_output=True, text=True, timeout=timeout)


def last_line(result: subprocess.CompletedProcess) -> str:
  """The last line a finished run wrote to stderr (its `error:` line when it failed)."""
  return result.stderr.strip().splitlines()[-1]


def reference_results(workdir: str) -> list[dict]:
  """The training results of an uninterrupted, fault-free run in `workdir`."""
  from sfjax.train import training_result  # here: `main` must install faults before sfjax loads

  result = run_train_ctr("", workdir)
  assert result.returncode == 0, result.stderr[-3000:]
  return [training_result(r) for r in read_records(workdir)]


def kill_once_committed(proc: subprocess.Popen, root: str, min_step: int, limit_s: float) -> int:
  """SIGKILLs `proc` once `root` holds a committed checkpoint of a step >= `min_step` (the
  process must not exit first, nor take longer than `limit_s`); returns the newest
  committed step. The process is killed and reaped whatever happens."""
  from sfjax.checkpoint import committed_steps

  try:
    deadline = time.monotonic() + limit_s
    while not [s for s in committed_steps(root) if s >= min_step]:
      assert proc.poll() is None, f"the run exited ({proc.returncode}) before a checkpoint in {root}"
      assert time.monotonic() < deadline, f"no checkpoint of step >= {min_step} in {root} " \
                                          f"within {limit_s:.0f} s"
      time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait(timeout=30)
  return committed_steps(root)[-1]


def main() -> None:
  """The child: `python -c '...main()' FAULT TRAIN_CTR_ARGS...`."""
  fault, argv = sys.argv[1], sys.argv[2:]
  install(fault)
  sys.argv = [os.path.join(ROOT, "experiments", "train_ctr.py"), *argv]
  runpy.run_module("experiments.train_ctr", run_name="__main__", alter_sys=True)
