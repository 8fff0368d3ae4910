"""Corrupt checkpoints: detected (naming the file), skipped for the previous good one, or refused.

A finished run with checkpoints at steps 30 and 40 is copied; one file of step 40 is
truncated or altered; rerunning resumes from step 30 (step 40 moved aside) and ends
exactly as the uninterrupted run.
"""

import json
import logging
import os
import shutil

import chex
import jax
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.data import dataset as dataset_lib
from sfjax.train import loop


def _config(backend):
  c = ctr.get_config("smoke")
  c.train.num_devices, c.train.steps, c.train.eval_every, c.train.log_every = 1, 40, 20, 100
  c.train.batch_size = 128
  c.embedding.backend, c.embedding.cache_rows = backend, 0.25  # the cache evicts
  c.checkpoint.every_steps, c.checkpoint.keep = 10, 2
  return c


def _table(trainer, state):
  if trainer.backend.host_table is not None:
    return trainer.backend.host_table.read_all()
  return jax.device_get(state.table)


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
  """{backend: (config, data, metrics, state, table, workdir)} of uninterrupted 40-step runs."""
  runs = {}
  for backend in ("device", "cache"):
    c = _config(backend)
    data = dataset_lib.make_dataset(c.data, c.seed)
    trainer = loop.build_trainer(c, data.spec)
    workdir = str(tmp_path_factory.mktemp(backend) / "ref")
    metrics, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer)
    assert checkpoint.committed_steps(os.path.join(workdir, "checkpoints")) == [30, 40]
    runs[backend] = (c, data, metrics, state, _table(trainer, state), workdir)
  return runs


def _own_chunk(run_dir):
  """A table chunk file of step 40 written by that save (not hard-linked from step 30)."""
  table = os.path.join(run_dir, "checkpoints", "step_00000040", "table")
  for name in sorted(os.listdir(table)):
    if name.startswith("chunk_") and os.stat(os.path.join(table, name)).st_nlink == 1:
      return os.path.join(table, name)
  raise AssertionError("no chunk of step 40 is its own file")


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _flip_byte(path, where=0.75):
  with open(path, "r+b") as f:
    f.seek(int(os.path.getsize(path) * where))
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x5A]))


def _largest_orbax_file(run_dir):
  dense = os.path.join(run_dir, "checkpoints", "step_00000040", "dense")
  files = [os.path.join(d, n) for d, _, names in os.walk(dense) for n in names]
  return max(files, key=os.path.getsize)


def _corrupt_meta(run_dir):
  path = os.path.join(run_dir, "checkpoints", "step_00000040", "meta.json")
  text = open(path).read()
  with open(path, "w") as f:  # still valid JSON: only the CRC notices
    f.write(text.replace('"step": 40', '"step": 41'))
  return path


CASES = {
    "truncated_chunk": ("cache", lambda d: (_truncate(p := _own_chunk(d)), p)[1]),
    "flipped_chunk_byte": ("cache", lambda d: (_flip_byte(p := _own_chunk(d)), p)[1]),
    "corrupt_meta_json": ("device", _corrupt_meta),
    "corrupt_orbax_file": ("device", lambda d: (_flip_byte(p := _largest_orbax_file(d)), p)[1]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous(finished_runs, tmp_path, case,
                                                                caplog):
  backend, corrupt = CASES[case]
  c, data, ref, ref_state, ref_table, ref_dir = finished_runs[backend]
  run_dir = str(tmp_path / "run")
  shutil.copytree(ref_dir, run_dir)
  bad_file = corrupt(run_dir)
  root = os.path.join(run_dir, "checkpoints")
  with pytest.raises(checkpoint.CorruptCheckpointError, match=bad_file):
    checkpoint.verify(os.path.join(root, "step_00000040"))

  trainer = loop.build_trainer(c, data.spec)
  with caplog.at_level(logging.INFO, logger="absl"):  # other tests may lower absl's verbosity
    resumed, state = loop.train_and_evaluate(c, run_dir, dataset=data, trainer=trainer)
  assert f"checkpoint {root}/step_00000040 is corrupt ({bad_file}" in caplog.text
  assert f"resuming from {root}/step_00000030 (step 30)" in caplog.text
  assert os.path.isdir(os.path.join(root, "corrupt.step_00000040"))  # kept for inspection
  assert checkpoint.committed_steps(root) == [30, 40]  # step 40 written again, verified
  checkpoint.verify(os.path.join(root, "step_00000040"))
  assert loop.training_result(resumed) == loop.training_result(ref)
  chex.assert_trees_all_equal(jax.device_get((state.step, state.params, state.opt_state)),
                              jax.device_get((ref_state.step, ref_state.params,
                                              ref_state.opt_state)))
  chex.assert_trees_all_equal(_table(trainer, state), ref_table)
  records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
  assert [r["step"] for r in records] == [20, 40]


def test_every_checkpoint_corrupt_is_an_error_naming_the_files(finished_runs, tmp_path):
  c, data, *_, ref_dir = finished_runs["cache"]
  run_dir = str(tmp_path / "run")
  shutil.copytree(ref_dir, run_dir)
  root = os.path.join(run_dir, "checkpoints")
  meta_30 = os.path.join(root, "step_00000030", "meta.json")
  with open(meta_30, "w") as f:
    f.write('{"format": "sfjax.train_che')  # torn
  manifest_40 = os.path.join(root, "step_00000040", "table", "manifest.json")
  _flip_byte(manifest_40, where=0.5)
  with pytest.raises(checkpoint.CorruptCheckpointError) as err:
    loop.train_and_evaluate(c, run_dir, dataset=data)
  message = str(err.value)
  assert meta_30 in message and manifest_40 in message and "move" in message
  assert checkpoint.committed_steps(root) == [30, 40]  # nothing renamed or deleted
