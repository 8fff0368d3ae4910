"""Crash-safe training: a run killed mid-window resumes to exactly the uninterrupted result.

In-process crashes (a step that raises) for both backends; the SIGKILLed CLI is
tests/experiments/train_ctr_resume_test.py. Ending equal is not enough (a run that
silently started over ends equal too): the resumed process must train only the steps
after the checkpoint (`assert_resumed_at`, on its per-step losses), and the same check
must reject a run from step 0.
"""

import json
import logging

import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.embedding.host_table import HostTable
from sfjax.train import loop


def _config(backend, steps=40, host_path=""):
  c = ctr.get_config("smoke")
  devices = 1
  if backend.endswith("-8dev"):  # the state replicated over 8 fake devices
    backend, devices = backend[:-len("-8dev")], 8
  placed = backend == "placed-mmap"  # embedding.backend says device; the placement says cache
  if backend in ("cache-mmap", "placed-mmap"):
    backend, c.embedding.host_storage, c.embedding.host_path = "cache", "mmap", host_path
  c.train.num_devices, c.train.steps, c.train.eval_every, c.train.log_every = devices, steps, 20, 100
  c.train.batch_size = 128
  c.embedding.backend, c.embedding.cache_rows = backend, 0.25  # the cache evicts
  if placed:
    c.embedding.backend, c.embedding.placement = "device", "cache"
  c.checkpoint.every_steps, c.checkpoint.keep = 10, 2
  return c


def _crashing(trainer, at_call, exc):
  calls = [0]

  def run_step(state, inputs):
    calls[0] += 1
    if calls[0] == at_call:
      raise exc
    return trainer.run_step(state, inputs)

  return trainer._replace(run_step=run_step)


def assert_resumed_at(losses, ref_losses, step):
  """`losses` (one per step this process trained) are exactly the uninterrupted run's
  `ref_losses` after `step`: the process resumed at `step`, it did not start over."""
  assert len(losses) == len(ref_losses) - step, (
      f"trained {len(losses)} steps; resuming at step {step} of {len(ref_losses)} leaves "
      f"{len(ref_losses) - step}")
  np.testing.assert_array_equal(losses, ref_losses[step:])


def _table(trainer, state):
  if trainer.backend.host_table is not None:
    return trainer.backend.host_table.read_all()
  return jax.device_get(state.table)


@pytest.mark.parametrize("backend", ["device", "cache", "cache-mmap", "placed-mmap",
                                     "cache-8dev"])
def test_resume_after_a_crash_equals_the_uninterrupted_run(tmp_path, backend, caplog):
  c_ref = _config(backend, host_path=str(tmp_path / "ref_host"))
  data = dataset_lib.make_dataset(c_ref.data, c_ref.seed)
  ref_trainer = loop.build_trainer(c_ref, data.spec)
  ref_losses = []
  ref, ref_state = loop.train_and_evaluate(c_ref, str(tmp_path / "ref"), dataset=data,
                                           trainer=ref_trainer, loss_log=ref_losses)
  with pytest.raises(AssertionError, match="trained 40 steps"):  # a run from step 0 is caught
    assert_resumed_at(ref_losses, ref_losses, 10)
  c = _config(backend, host_path=str(tmp_path / "run_host"))

  crashed = _crashing(loop.build_trainer(c, data.spec), 15, RuntimeError("node lost"))
  with caplog.at_level(logging.INFO, logger="absl"):  # other tests may lower absl's verbosity
    with pytest.raises(RuntimeError, match="node lost"):
      loop.train_and_evaluate(c, str(tmp_path / "run"), dataset=data, trainer=crashed)
  assert "last good checkpoint: " + str(tmp_path / "run" / "checkpoints" / "step_00000010") \
      in caplog.text
  assert "training stopped at step 14" in caplog.text  # the live state was flushed
  if backend == "cache":  # nothing lost: the host table holds every row of step 14
    c14 = _config(backend, steps=14)
    c14.checkpoint.every_steps = 0
    t14 = loop.build_trainer(c14, data.spec)
    loop.train_and_evaluate(c14, None, dataset=data, trainer=t14)
    chex.assert_trees_all_equal(crashed.backend.host_table.read_all(),
                                t14.backend.host_table.read_all())

  if backend in ("cache-mmap", "placed-mmap"):
    crashed.backend.host_table.close()  # its rows after step 10 stay on disk, as after a kill
    trainer = None  # the loop resets host_path and loads the checkpoint into a new table
  else:
    trainer = loop.build_trainer(c, data.spec)
  losses = []
  resumed, state = loop.train_and_evaluate(c, str(tmp_path / "run"), dataset=data, trainer=trainer,
                                           loss_log=losses)
  assert_resumed_at(losses, ref_losses, 10)  # steps 11..40 only, each as the uninterrupted run
  assert loop.training_result(resumed) == loop.training_result(ref)
  chex.assert_trees_all_equal(jax.device_get((state.step, state.params, state.opt_state)),
                              jax.device_get((ref_state.step, ref_state.params,
                                              ref_state.opt_state)))
  table = (_table(trainer, state) if trainer is not None
           else HostTable.open_mmap(c.embedding.host_path, writable=False).read_all())
  chex.assert_trees_all_equal(table, _table(ref_trainer, ref_state))
  records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  ref_records = [json.loads(line) for line in open(tmp_path / "ref" / "metrics.jsonl")]
  assert [r["step"] for r in records] == [20, 40]
  assert ([loop.training_result(r) for r in records]
          == [loop.training_result(r) for r in ref_records])
  assert checkpoint.committed_steps(str(tmp_path / "run" / "checkpoints")) == [30, 40]

  if backend not in ("device", "cache"):
    return
  # Rerunning a finished run trains nothing and reports the same result.
  losses = []
  again, _ = loop.train_and_evaluate(c, str(tmp_path / "run"), dataset=data, loss_log=losses)
  assert_resumed_at(losses, ref_losses, 40)
  assert loop.training_result(again) == loop.training_result(ref)


def test_a_non_finite_loss_stops_at_its_step_before_any_eval_or_save(tmp_path, caplog):
  c = _config("device")
  c.checkpoint.every_steps = 5
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  calls = [0]

  def nan_at_7(state, inputs):
    calls[0] += 1
    state, metrics, n = trainer.run_step(state, inputs)
    if calls[0] == 7:
      metrics = dict(metrics, loss=metrics["loss"] * np.nan)
    return state, metrics, n

  with caplog.at_level(logging.INFO, logger="absl"):  # other tests may lower absl's verbosity
    with pytest.raises(FloatingPointError, match="at step 7"):
      loop.train_and_evaluate(c, str(tmp_path), dataset=data,
                              trainer=trainer._replace(run_step=nan_at_7))
  assert checkpoint.committed_steps(str(tmp_path / "checkpoints")) == [5]
  assert "nothing was flushed" in caplog.text and "step_00000005" in caplog.text
