"""SIGKILL the CLI after its first checkpoint, rerun the same command: the exact uninterrupted result."""

import json
import os
import subprocess
import sys

import chex
import jax
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.embedding.host_table import HostTable
from sfjax.train import loop
from tests.faults import file_faults

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, EVERY, EVAL_EVERY = 400, 40, 100


def _overrides(backend):
  return {"train.num_devices": 1, "train.steps": STEPS, "train.eval_every": EVAL_EVERY,
          "train.batch_size": 128, "train.log_every": 100, "checkpoint.every_steps": EVERY,
          "checkpoint.keep": 2, "embedding.backend": backend, "embedding.cache_rows": 0.25}


def _command(workdir, backend):
  overrides = _overrides(backend)
  if backend == "cache-mmap":  # the killed run leaves rows newer than its checkpoint on disk
    overrides.update({"embedding.backend": "cache", "embedding.host_storage": "mmap",
                      "embedding.host_path": os.path.join(workdir, "host_table")})
  flags = [f"--config.{k}={v}" for k, v in overrides.items()]
  return [sys.executable, "-m", "experiments.train_ctr", "--config=experiments/configs/ctr.py:smoke",
          f"--workdir={workdir}", *flags]


def _env():
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")


def _run(workdir, backend):
  r = subprocess.run(_command(workdir, backend), cwd=ROOT, env=_env(), capture_output=True,
                     text=True, timeout=240)
  assert r.returncode == 0, r.stderr[-3000:]
  return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def _run_until_first_checkpoint_then_kill(workdir, backend):
  root = os.path.join(workdir, checkpoint.CHECKPOINT_DIR)
  proc = subprocess.Popen(_command(workdir, backend), cwd=ROOT, env=_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  last = file_faults.kill_once_committed(proc, root, 0, 180)
  assert last < STEPS, f"killed too late: checkpoints {checkpoint.committed_steps(root)}"
  return last


def _final_checkpoint(workdir, backend):
  """(dense state, host table or None) of the run's last checkpoint, restored here."""
  c = ctr.get_config("smoke")  # host storage does not matter: restored into a RAM table here
  for key, value in _overrides(backend.replace("-mmap", "")).items():
    block, field = key.split(".")
    setattr(c[block], field, value)
  data = dataset_lib.make_dataset(c.data, c.seed)
  target = loop.build_trainer(c, data.spec)
  table = target.backend.host_table
  if table is not None:  # a fresh table (the trainer's own is untouched)
    table = HostTable.create_ram(table.num_rows, table.width, table.slot_width,
                                 seed=table.spec.seed, init_stddev=table.spec.init_stddev,
                                 initial_slot_row=table.spec.initial_slot_row)
  root = os.path.join(workdir, checkpoint.CHECKPOINT_DIR)
  ckpt = checkpoint.Checkpointer(str(root), 2, host_table=table)
  restored = ckpt.restore(checkpoint.latest(root), target.state)
  ckpt.close()
  assert restored.step == STEPS
  dense = jax.device_get((restored.state.step, restored.state.params, restored.state.opt_state))
  if table is None:
    return dense, jax.device_get(restored.state.table)
  return dense, table.read_all()


@pytest.mark.parametrize("backend", ["device", "cache", "cache-mmap"])
def test_sigkilled_run_resumes_to_the_uninterrupted_result(tmp_path, backend):
  ref, _ = _run(tmp_path / "ref", backend)
  killed_at = _run_until_first_checkpoint_then_kill(tmp_path / "run", backend)
  final, stderr = _run(tmp_path / "run", backend)
  assert f"step_{killed_at:08d} (step {killed_at})" in stderr  # "resuming from ..."
  assert final["step"] == STEPS
  assert loop.training_result(final) == loop.training_result(ref)
  records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert [r["step"] for r in records] == list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))
  chex.assert_trees_all_equal(_final_checkpoint(tmp_path / "run", backend),
                              _final_checkpoint(tmp_path / "ref", backend))
  if backend == "cache-mmap":  # and the live table at host_path equals the uninterrupted one
    chex.assert_trees_all_equal(
        HostTable.open_mmap(str(tmp_path / "run" / "host_table"), writable=False).read_all(),
        HostTable.open_mmap(str(tmp_path / "ref" / "host_table"), writable=False).read_all())
