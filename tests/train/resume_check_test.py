"""Resume checks what it resumes: each kind of change, the one-line messages, config.json kept,
config_history.jsonl, and through the trainer (refused, allowed and recorded, shape named)."""

import json
import os

import numpy as np
import pytest

from experiments.configs import ctr
from sfjax.core.errors import ConfigError
from sfjax.data import dataset as dataset_lib
from sfjax.train import loop, resume_check


def _config(steps=20):
  c = ctr.get_config("smoke")
  c.data.synthetic.num_train, c.data.synthetic.num_eval = 4096, 1024
  c.model.mlp_dims = (8,)
  c.train.steps, c.train.eval_every, c.train.batch_size, c.train.num_devices = steps, 10, 64, 1
  c.checkpoint.every_steps = 10
  return c


@pytest.mark.parametrize("field,kind", [
    ("model.embed_dim", "shape"), ("model.name", "shape"), ("data.hash_rows", "shape"),
    ("embedding.backend", "shape"), ("embedding.optimizer", "shape"), ("optimizer.name", "shape"),
    ("data.synthetic.cardinality_scale", "shape"), ("data spec", "shape"),
    ("seed", "meaning"), ("data.train_path", "meaning"), ("optimizer.learning_rate", "meaning"),
    ("embedding.learning_rate", "meaning"), ("train.batch_size", "meaning"),
    ("train.eval_every", "meaning"), ("data.train_path files", "meaning"),
    ("some.new_field", "meaning"),  # unknown: counted as meaning, never passed silently
    ("train.steps", "free"), ("train.log_every", "free"), ("train.eval_batch_size", "free"),
    ("train.num_devices", "free"), ("train.host_allocator", "free"), ("train.loader_nice", "free"),
    ("train.xla_cpu_dots", "free"),
    ("train.loader_idle", "free"), ("embedding.cache_rows", "free"),
    ("checkpoint.every_steps", "free"), ("distributed.process_id", "free"), ("resume", "free"),
    ("model", "meaning"),  # a prefix rule matches only whole dotted parts
])
def test_field_kinds(field, kind):
  assert resume_check.field_kind(field) == kind


def _fp(config, spec=None):
  return {"config": resume_check.flat_config(config),
          "spec": spec or {"fields": [["C1", 10]], "num_dense": 1}, "data": {}}


def test_shape_change_is_one_line_naming_every_field_old_to_new():
  c = _config()
  new = _config()
  new.model.embed_dim, new.data.hash_rows, new.seed = 32, 1000, 5
  with pytest.raises(resume_check.ResumeMismatchError) as info:
    resume_check.check_resume(_fp(c), _fp(new, {"fields": [["C1", 12]], "num_dense": 1}),
                              "allow_changes", "ckpt/step_10")
  message = str(info.value)
  assert "\n" not in message and isinstance(info.value, ConfigError)
  assert "cannot resume ckpt/step_10: the state's shape differs" in message
  for part in ("model.embed_dim 16 -> 32", "data.hash_rows 0 -> 1000", "data spec "):
    assert part in message
  assert "seed" not in message  # only the shape fields are named: they decide


def test_meaning_change_refused_unless_allowed_and_free_changes_pass():
  c, new = _config(), _config()
  new.optimizer.learning_rate, new.train.log_every, new.train.steps = 0.002, 7, 40
  with pytest.raises(resume_check.ResumeMismatchError,
                     match=r"settings differ: optimizer.learning_rate 0.001 -> 0.002 \(rerun with "
                           r"--config.resume=allow_changes"):
    resume_check.check_resume(_fp(c), _fp(new), "strict", "p")
  changes = resume_check.check_resume(_fp(c), _fp(new), "allow_changes", "p")
  assert changes == {"optimizer.learning_rate": [0.001, 0.002], "train.log_every": [20, 7],
                     "train.steps": [20, 40]}
  free = _config()
  free.train.log_every, free.embedding.cache_rows = 7, 0.5
  assert set(resume_check.check_resume(_fp(c), _fp(free), "strict", "p")) == {
      "train.log_every", "embedding.cache_rows"}
  assert resume_check.check_resume(None, _fp(free), "strict", "p") == {}  # an old checkpoint
  with pytest.raises(ConfigError, match="config field resume: unknown value 'maybe'"):
    resume_check.check_resume(_fp(c), _fp(c), "maybe", "p")


def test_data_files_are_digested_by_content_and_a_changed_file_is_named(tmp_path):
  a, b = tmp_path / "a.txt", tmp_path / "b.txt"
  a.write_bytes(b"x" * 100)
  b.write_bytes(b"y" * (3 << 20))  # past 2 MiB: first and last MiB digested
  data = {"train_path": f"{tmp_path}/*.txt", "eval_path": str(a), "test_path": ""}
  before = resume_check.data_fingerprint(data)
  assert set(before) == {"data.train_path files", "data.eval_path files"}
  assert before["data.train_path files"][str(b)]["bytes"] == 3 << 20
  assert resume_check.data_fingerprint(data) == before  # deterministic; mtime plays no part
  os.utime(a, (1, 1))
  assert resume_check.data_fingerprint(data) == before
  a.write_bytes(b"x" * 99 + b"z")
  after = resume_check.data_fingerprint(data)
  line = resume_check.describe_change("data.eval_path files", [before["data.eval_path files"],
                                                        after["data.eval_path files"]])
  assert line.startswith(f"data.eval_path files: {a} (crc32 ") and "bytes" not in line


def test_a_preprocessed_directory_digests_spec_and_mapping_whole(tmp_path):
  (tmp_path / "train").mkdir()
  (tmp_path / "spec.json").write_text('{"fields": 1}')
  (tmp_path / "mapping.json").write_text("m" * (3 << 20))
  (tmp_path / "train" / "shard_0.bin").write_bytes(b"s" * 10)
  before = resume_check.data_fingerprint({"train_path": str(tmp_path)})["data.train_path files"]
  assert set(before) == {str(tmp_path / n) for n in ("spec.json", "mapping.json",
                                                      "train/shard_0.bin")}
  text = bytearray((tmp_path / "mapping.json").read_bytes())
  text[len(text) // 2] = ord("n")  # the middle: outside a sample digest, inside a whole one
  (tmp_path / "mapping.json").write_bytes(bytes(text))
  after = resume_check.data_fingerprint({"train_path": str(tmp_path)})["data.train_path files"]
  assert after[str(tmp_path / "mapping.json")] != before[str(tmp_path / "mapping.json")]


def test_config_json_is_written_once_and_changes_go_to_the_history(tmp_path):
  c = _config()
  resume_check.record_config(str(tmp_path), c, "start", {})
  first = (tmp_path / "config.json").read_text()
  resume_check.record_config(str(tmp_path), _config(), "start", {})  # the same config
  assert not (tmp_path / "config_history.jsonl").exists()
  resume_check.record_config(str(tmp_path), c, "resume", {"seed": [0, 5]}, step=10)
  assert (tmp_path / "config.json").read_text() == first  # a resume keeps it
  restart = _config()
  restart.seed = 9
  resume_check.record_config(str(tmp_path), restart, "start", {})  # a run from step 0
  assert json.loads((tmp_path / "config.json").read_text())["seed"] == 9
  history = [json.loads(x) for x in open(tmp_path / "config_history.jsonl")]
  assert [(h["event"], h["step"], h["changes"]) for h in history] == [
      ("resume", 10, {"seed": {"old": 0, "new": 5, "kind": "meaning"}}),
      ("start", 0, {"seed": {"old": 0, "new": 9, "kind": "meaning"}})]


def _resume_twice(tmp_path, change, policy="strict"):
  """A 10-step run, then the 20-step run resumed from its checkpoint with `change`."""
  c = _config(steps=10)
  data = dataset_lib.make_dataset(c.data, c.seed)
  loop.train_and_evaluate(c, str(tmp_path), dataset=data)
  c2 = _config(steps=20)
  change(c2)
  c2.resume = policy
  return loop.train_and_evaluate(c2, str(tmp_path), dataset=data)


def test_trainer_refuses_a_changed_learning_rate_and_keeps_the_workdir(tmp_path):
  def change(c):
    c.optimizer.learning_rate = 0.002

  with pytest.raises(resume_check.ResumeMismatchError, match="optimizer.learning_rate 0.001 -> "
                                                             "0.002"):
    _resume_twice(tmp_path, change)
  assert json.loads((tmp_path / "config.json").read_text())["optimizer"]["learning_rate"] == 0.001
  assert not (tmp_path / "config_history.jsonl").exists()
  assert [json.loads(x)["step"] for x in open(tmp_path / "metrics.jsonl")] == [10]


def test_trainer_with_allow_changes_resumes_and_records_the_change(tmp_path):
  def change(c):
    c.optimizer.learning_rate = 0.002

  final, _ = _resume_twice(tmp_path, change, "allow_changes")
  assert final["step"] == 20 and np.isfinite(final["auc"])
  assert [json.loads(x)["step"] for x in open(tmp_path / "metrics.jsonl")] == [10, 20]
  (history,) = [json.loads(x) for x in open(tmp_path / "config_history.jsonl")]
  assert history["event"] == "resume" and history["step"] == 10
  assert history["changes"]["optimizer.learning_rate"] == {"old": 0.001, "new": 0.002,
                                                           "kind": "meaning"}
  assert history["changes"]["train.steps"]["kind"] == "free"  # extended: recorded, allowed
  assert json.loads((tmp_path / "config.json").read_text())["optimizer"]["learning_rate"] == 0.001


def test_trainer_names_a_shape_change_in_one_line_before_loading(tmp_path):
  def change(c):
    c.model.embed_dim = 8

  with pytest.raises(resume_check.ResumeMismatchError) as info:
    _resume_twice(tmp_path, change, "allow_changes")
  assert "\n" not in str(info.value) and "model.embed_dim 16 -> 8" in str(info.value)


def test_a_field_added_since_the_checkpoint_at_its_default_is_no_change():
  c = _config()
  old = _fp(c)
  del old["config"]["model.din_attention_dims"]  # a checkpoint from before the field existed
  assert resume_check.differences(old, _fp(c)) == {}
  other = _config()
  other.model.din_attention_dims = (8,)  # not the default: a change, shape refused
  changes = resume_check.differences(old, _fp(other))
  assert list(changes) == ["model.din_attention_dims"]
  with pytest.raises(resume_check.ResumeMismatchError, match="din_attention_dims"):
    resume_check.check_resume(old, _fp(other), "allow_changes", "p")
