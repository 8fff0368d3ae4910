"""Fault cases of issue #25 items 1 and 2, through the CLI (slow tier): two runs racing on one
workdir, a SIGKILL (with a torn metrics line) then a resume, and a resume with a changed
setting. Each asserts a named error or a result identical to an uninterrupted run, and that
no earlier checkpoint or metric is lost."""

import json
import os
import subprocess
import sys

import pytest

from sfjax.checkpoint import CHECKPOINT_DIR, committed_steps
from sfjax.train import training_result
from tests.faults import file_faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, EVAL_EVERY, CKPT_EVERY = 160, 20, 20
EVAL_STEPS = list(range(EVAL_EVERY, STEPS + 1, EVAL_EVERY))


def _command(workdir, *extra):
  flags = {"train.num_devices": 1, "train.steps": STEPS, "train.eval_every": EVAL_EVERY,
           "train.batch_size": 128, "train.log_every": 40, "checkpoint.every_steps": CKPT_EVERY,
           "checkpoint.keep": 2, "embedding.backend": "cache", "embedding.cache_rows": 0.25}
  return [sys.executable, "-m", "experiments.train_ctr", "--config=experiments/configs/ctr.py:smoke",
          f"--workdir={workdir}", *[f"--config.{k}={v}" for k, v in flags.items()], *extra]


def _env():
  return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")


def _run(workdir, *extra):
  return subprocess.run(_command(workdir, *extra), cwd=ROOT, env=_env(), capture_output=True,
                        text=True, timeout=300)


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _last_line(r):
  return r.stderr.strip().splitlines()[-1]


def test_two_runs_on_one_workdir_one_wins_the_other_is_named_and_nothing_is_lost(tmp_path):
  workdir = str(tmp_path / "w")
  procs = [subprocess.Popen(_command(workdir), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  codes = sorted(p.returncode for p in procs)
  assert codes == [0, 2], [(p.returncode, err[-2000:]) for p, (_, err) in zip(procs, outs, strict=True)]
  winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
  line = outs[loser][1].strip().splitlines()[-1]
  assert line.startswith(f"error: {workdir} is in use by pid {procs[winner].pid} on "), line
  assert "experiments/train_ctr.py --config=" in line  # the holder's command
  assert [r["step"] for r in _records(workdir)] == EVAL_STEPS  # the winner's every record
  assert committed_steps(os.path.join(workdir, CHECKPOINT_DIR)) == [STEPS - CKPT_EVERY, STEPS]
  assert not [n for n in os.listdir(os.path.join(workdir, CHECKPOINT_DIR))
              if n.startswith(("tmp.", "old."))]


def _kill_after_checkpoint(workdir, step):
  proc = subprocess.Popen(_command(workdir), cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  return file_faults.kill_once_committed(proc, os.path.join(workdir, CHECKPOINT_DIR), step, 240)


def test_sigkill_with_a_torn_metrics_line_resumes_with_every_record_then_checks_settings(
    tmp_path):
  ref_dir, workdir = str(tmp_path / "ref"), str(tmp_path / "run")
  ref = _run(ref_dir)
  assert ref.returncode == 0, ref.stderr[-3000:]
  at = _kill_after_checkpoint(workdir, 2 * CKPT_EVERY)
  assert at < STEPS, f"killed too late: step {at}"
  metrics = os.path.join(workdir, "metrics.jsonl")
  with open(metrics, "a", encoding="utf-8") as f:
    f.write('{"step": 999, "au')  # a crash mid-write
  inode = os.stat(metrics).st_ino
  resumed = _run(workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "a partial last line" in resumed.stderr and "resuming from" in resumed.stderr
  assert os.stat(metrics).st_ino == inode  # appended in place, never replaced
  records, ref_records = _records(workdir), _records(ref_dir)
  assert [r["step"] for r in records] == EVAL_STEPS
  assert [training_result(r) for r in records] == [training_result(r) for r in ref_records]
  config_json = open(os.path.join(workdir, "config.json")).read()

  # Issue #25 item 2: a changed learning rate is refused, in one line naming it ...
  more = ("--config.train.steps=180", "--config.optimizer.learning_rate=0.002")
  refused = _run(workdir, *more)
  assert refused.returncode == 2 and "Traceback" not in refused.stderr
  assert _last_line(refused).startswith(f"error: cannot resume {workdir}/{CHECKPOINT_DIR}/"
                                        "step_00000160: the run's settings differ: "
                                        "optimizer.learning_rate 0.001 -> 0.002 (rerun with")
  # ... a shape change too, whatever the policy ...
  shape = _run(workdir, "--config.model.embed_dim=8", "--resume=allow_changes")
  assert shape.returncode == 2
  assert "the state's shape differs: model.embed_dim 16 -> 8" in _last_line(shape)
  assert [r["step"] for r in _records(workdir)] == EVAL_STEPS  # nothing was touched
  # ... and accepted with --resume=allow_changes, recorded beside the unchanged config.json.
  allowed = _run(workdir, *more, "--resume=allow_changes")
  assert allowed.returncode == 0, allowed.stderr[-3000:]
  assert [r["step"] for r in _records(workdir)] == [*EVAL_STEPS, 180]
  assert open(os.path.join(workdir, "config.json")).read() == config_json
  with open(os.path.join(workdir, "config_history.jsonl"), encoding="utf-8") as f:
    (history,) = [json.loads(line) for line in f]
  assert history["step"] == STEPS and history["event"] == "resume"
  assert history["changes"]["optimizer.learning_rate"] == {"old": 0.001, "new": 0.002,
                                                           "kind": "meaning"}
  assert history["changes"]["train.steps"] == {"old": STEPS, "new": 180, "kind": "free"}
