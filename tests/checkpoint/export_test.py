"""Exports of a trained run's table, read back with numpy and json only."""

import json
import os
import zlib

import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.checkpoint import export
from sfjax.data import dataset as dataset_lib
from sfjax.train import loop


def _trained(backend, workdir, hash_rows=0):
  c = ctr.get_config("smoke")
  c.train.num_devices, c.train.steps, c.train.eval_every, c.train.batch_size = 1, 12, 12, 128
  c.embedding.backend, c.embedding.cache_rows = backend, 0.25
  c.checkpoint.every_steps, c.checkpoint.keep = 6, 2
  data = dataset_lib.make_dataset(c.data, c.seed)
  trainer = loop.build_trainer(c, data.spec)
  _, state = loop.train_and_evaluate(c, workdir, dataset=data, trainer=trainer)
  if trainer.backend.host_table is not None:
    table = trainer.backend.host_table.read_all()
  else:
    table = jax.device_get((state.table.values, state.table.opt_slots))
  return c, data.spec, table


def _read_with_numpy(out_dir):
  """What a user without sfjax does: the manifest, then np.load every chunk in order."""
  with open(os.path.join(out_dir, "export.json")) as f:
    manifest = json.load(f)
  parts = {}
  for kind in ("values", "slots"):
    chunks, next_row = [], 0
    for entry in manifest[kind]:
      path = os.path.join(out_dir, entry["file"])
      assert zlib.crc32(open(path, "rb").read()) == entry["crc32"]
      assert entry["rows"][0] == next_row
      chunks.append(np.load(path))
      next_row = entry["rows"][1]
    parts[kind] = np.concatenate(chunks)
  return manifest, parts["values"], parts["slots"]


@pytest.mark.parametrize("backend", ["device", "cache"])
def test_export_reads_back_with_numpy_as_the_final_table(tmp_path, backend):
  c, spec, (values, slots) = _trained(backend, str(tmp_path / "run"))
  out = str(tmp_path / "export")
  written = export.export_checkpoint(str(tmp_path / "run"), out)
  manifest, got_values, got_slots = _read_with_numpy(out)
  assert manifest == written and manifest["step"] == 12
  chex.assert_trees_all_equal((got_values, got_slots), (values, slots))
  assert manifest["num_rows"] == spec.total_rows == got_values.shape[0]
  assert manifest["field_names"] == [f.name for f in spec.fields]
  assert manifest["field_offsets"] == spec.field_offsets.tolist()
  assert manifest["field_rows"] == list(spec.field_rows)
  assert manifest["row_optimizer"] == c.embedding.optimizer
  assert manifest["mapping"]["kind"] == "synthetic"
  chex.assert_trees_all_equal(export.read_export(out)[1:], (values, slots))
  with pytest.raises(FileExistsError, match="not empty"):
    export.export_checkpoint(str(tmp_path / "run"), out)


def test_export_skips_a_corrupt_latest_and_records_the_mapping(tmp_path):
  workdir = str(tmp_path / "run")
  c, _, _ = _trained("cache", workdir)
  root = os.path.join(workdir, "checkpoints")
  with open(os.path.join(root, "step_00000012", "meta.json"), "w") as f:
    f.write("{")
  config_path = os.path.join(workdir, "config.json")
  config = json.load(open(config_path))
  config["data"]["format"], config["data"]["hash_rows"] = "criteo", 1000
  json.dump(config, open(config_path, "w"))
  manifest = export.export_checkpoint(workdir, str(tmp_path / "export"))
  assert manifest["step"] == 6 and manifest["checkpoint"].endswith("step_00000006")
  assert manifest["mapping"]["kind"] == "hashing" and manifest["mapping"]["hash_rows"] == 1000
  assert "0xC7F0E1D2A3B4C5D6" in manifest["mapping"]["salt"]
  config["data"]["hash_rows"] = 0
  json.dump(config, open(config_path, "w"))
  manifest = export.export_checkpoint(workdir, str(tmp_path / "export2"))
  assert manifest["mapping"]["kind"] == "vocabulary" and "rebuild" in manifest["mapping"]["note"]
  prep = tmp_path / "prep"
  (prep / "vocabulary").mkdir(parents=True)
  (prep / "mapping.json").write_text(json.dumps({"kind": "vocabulary", "fields": []}))
  np.save(prep / "vocabulary" / "C1.keys.npy", np.arange(3, dtype=np.uint64))
  config["data"]["format"], config["data"]["train_path"] = "preprocessed", str(prep)
  json.dump(config, open(config_path, "w"))
  manifest = export.export_checkpoint(workdir, str(tmp_path / "export3"))
  assert manifest["mapping"]["saved"] == "mapping/mapping.json"
  np.testing.assert_array_equal(
      np.load(tmp_path / "export3" / "mapping" / "vocabulary" / "C1.keys.npy"), np.arange(3))
  assert checkpoint.committed_steps(root) == [6, 12]  # an export renames nothing


def test_export_refuses_a_mapping_other_than_the_one_trained_on(tmp_path):
  mapping = tmp_path / "mapping.json"
  mapping.write_bytes(b'{"kind": "vocabulary"}')
  meta = {"fingerprint": {"data": {"data.train_path files": {
      str(mapping): {"bytes": len(mapping.read_bytes()), "crc32": zlib.crc32(mapping.read_bytes())}}}}}
  export._check_trained_mapping(meta, str(mapping))  # the same file: passes
  export._check_trained_mapping({}, str(mapping))  # a checkpoint without the record: passes
  mapping.write_bytes(b'{"kind": "hashing!!!"}')  # same size, other bytes (a swapped mapping)
  with pytest.raises(ValueError, match=f"{mapping}: not the mapping this run trained on"):
    export._check_trained_mapping(meta, str(mapping))
