"""Fault case of issue #25 item 3, through the pipeline CLI (slow tier): the training steps
`fully_train` and `baseline` on the cache backend with an mmap host table, each SIGKILLed
after its first checkpoint and rerun. The rerun must end identical to an uninterrupted
pipeline: the report's metrics, the test scores, the trainers' final metrics and each
step's final host table (each in its own step directory)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sfjax.checkpoint import CHECKPOINT_DIR
from sfjax.ctr_pipeline.train_steps import HOST_TABLE_DIR
from sfjax.embedding.host_table import HostTable
from sfjax.train import training_result
from tests.faults import file_faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, CKPT_EVERY = 200, 20
TRAINING = {"fully_train": 1, "baseline": 2}  # step name -> its index in the order


def _command(workdir):
  """The smoke pipeline cut to the smallest one that reaches both training steps."""
  trainer = {"train.steps": STEPS, "train.eval_every": STEPS, "train.batch_size": 128,
             "train.num_devices": 1, "train.log_every": 50,
             "checkpoint.every_steps": CKPT_EVERY, "checkpoint.keep": 2,
             "embedding.backend": "cache", "embedding.cache_rows": 0.7,
             "embedding.host_storage": "mmap"}
  flags = {"pipeline.order": "nas,fully_train,baseline", "steps.nas.study.num_trials": 1,
           **{f"steps.fully_train.trainer.{k}": v for k, v in trainer.items()}}
  return [sys.executable, "-m", "experiments.pipeline",
          "--config=experiments/configs/pipeline_ctr.py:smoke", f"--workdir={workdir}",
          *[f"--config.{k}={v}" for k, v in flags.items()]]


def _env():
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")


def _step_dir(workdir, name):
  return os.path.join(workdir, "steps", f"{TRAINING[name]}_{name}")


def _run(workdir, log_path):
  with open(log_path, "w") as log:  # a file, not a pipe: a full pipe would block the child
    return subprocess.run(_command(workdir), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=log, timeout=600).returncode


def _kill_after_first_checkpoint(workdir, name, log_path):
  """Runs the pipeline and SIGKILLs it once step `name` has committed a checkpoint; returns
  the newest committed step, which must be short of the end (killed mid-run)."""
  root = os.path.join(_step_dir(workdir, name), CHECKPOINT_DIR)
  with open(log_path, "w") as log:
    proc = subprocess.Popen(_command(workdir), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=log)
    return file_faults.kill_once_committed(proc, root, 0, 600)


def _report(workdir):
  with open(os.path.join(workdir, "report.json"), encoding="utf-8") as f:
    report = json.load(f)
  for step in report["steps"]:
    step.pop("wall_s")
  return report


def _output(workdir, name):
  with open(os.path.join(_step_dir(workdir, name), "output.json"), encoding="utf-8") as f:
    return json.load(f)


def _table(workdir, name):
  path = os.path.join(_step_dir(workdir, name), HOST_TABLE_DIR)
  return HostTable.open_mmap(path, writable=False).read_all()


def test_training_steps_killed_on_an_mmap_table_rerun_to_the_uninterrupted_result(tmp_path):
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "run")
  assert _run(ref_dir, tmp_path / "ref.log") == 0, (tmp_path / "ref.log").read_text()[-3000:]
  killed = {name: _kill_after_first_checkpoint(workdir, name, tmp_path / f"kill_{name}.log")
            for name in TRAINING}  # the second run resumes fully_train, then dies in baseline
  assert all(step < STEPS for step in killed.values()), f"killed too late: {killed}"
  log = tmp_path / "rerun.log"
  assert _run(workdir, log) == 0, log.read_text()[-3000:]
  resumed = (tmp_path / "kill_baseline.log").read_text() + log.read_text()
  assert "FileExistsError" not in resumed
  for name in TRAINING:  # each resumed from its own checkpoint
    assert f"resuming from {_step_dir(workdir, name)}/{CHECKPOINT_DIR}/" in resumed, name

  assert _report(workdir) == _report(ref_dir)
  for name in TRAINING:
    got, want = _output(workdir, name), _output(ref_dir, name)
    assert got["trainer_config"]["embedding"]["host_path"] == os.path.join(
        _step_dir(workdir, name), HOST_TABLE_DIR)  # its own table, in its own directory
    assert training_result(got["final_metrics"]) == training_result(want["final_metrics"])
    np.testing.assert_array_equal(np.load(os.path.join(workdir, got["test_scores"])),
                                  np.load(os.path.join(ref_dir, want["test_scores"])))
    for got_part, want_part in zip(_table(workdir, name), _table(ref_dir, name), strict=True):
      np.testing.assert_array_equal(got_part, want_part)  # values [V, E], then slots [V, S]
