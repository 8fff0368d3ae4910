"""The run's files: config.json once, one flushed JSON line per record, no workdir no files."""

import json
import os

import ml_collections
import pytest

from sfjax.core import tensorboard
from sfjax.train import metrics_writer


def _config():
  c = ml_collections.ConfigDict()
  c.seed = 3
  c.train = ml_collections.ConfigDict({"steps": 7, "mlp_dims": (8,)})
  return c


def _files(path):
  return sorted(n for n in os.listdir(path) if not n.startswith(tensorboard.EVENT_FILE_PREFIX))


def _lines(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_writes_config_and_one_flushed_line_per_record(tmp_path):
  workdir = tmp_path / "run" / "nested"  # created
  writer = metrics_writer.MetricsWriter(str(workdir), _config())
  assert json.loads((workdir / "config.json").read_text()) == {
      "seed": 3, "train": {"steps": 7, "mlp_dims": [8]}}
  assert _lines(workdir / "metrics.jsonl") == []
  writer.write({"step": 1, "auc": 0.5})
  assert _lines(workdir / "metrics.jsonl") == [{"step": 1, "auc": 0.5}]  # readable before close
  writer.write({"step": 2, "auc": 0.75})
  writer.close()
  assert _lines(workdir / "metrics.jsonl") == [{"step": 1, "auc": 0.5}, {"step": 2, "auc": 0.75}]
  assert _files(workdir) == ["config.json", "metrics.jsonl"]  # no temporary file


def test_without_config_only_metrics_are_written(tmp_path):
  with metrics_writer.MetricsWriter(str(tmp_path)) as writer:
    writer.write({"step": 1})
  assert _files(tmp_path) == ["metrics.jsonl"]


def test_no_workdir_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for workdir in (None, ""):
    with metrics_writer.MetricsWriter(workdir, _config()) as writer:
      writer.write({"step": 1})
  assert os.listdir(tmp_path) == []


def test_context_manager_closes(tmp_path):
  with metrics_writer.MetricsWriter(str(tmp_path), _config()) as writer:
    writer.write({"step": 1})
  writer.write({"step": 2})  # after close: dropped, not an error
  writer.close()  # closing twice is fine
  assert _lines(tmp_path / "metrics.jsonl") == [{"step": 1}]


def test_rerun_starts_a_fresh_metrics_file(tmp_path):
  with metrics_writer.MetricsWriter(str(tmp_path)) as writer:
    writer.write({"step": 1})
  with metrics_writer.MetricsWriter(str(tmp_path)) as writer:
    writer.write({"step": 9})
  assert _lines(tmp_path / "metrics.jsonl") == [{"step": 9}]


def test_resume_keeps_records_up_to_the_checkpoint_and_appends(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 10, "auc": 0.6}\n{"step": 20, "auc": 0.7}\n{"step": 30, "au')
  writer = metrics_writer.MetricsWriter(str(tmp_path), _config(), resume_step=20)
  writer.write({"step": 30, "auc": 0.8})
  writer.close()
  assert [r["step"] for r in _lines(path)] == [10, 20, 30]  # torn line dropped, no duplicate
  writer = metrics_writer.MetricsWriter(str(tmp_path), _config(), resume_step=10)
  writer.close()
  assert _lines(path) == [{"step": 10, "auc": 0.6}]
  assert metrics_writer._read_records(str(tmp_path / "absent.jsonl")) == []


def test_resume_appends_to_the_same_file_and_repairs_a_torn_last_line(tmp_path, caplog):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 10}\n{"step": 20}\n{"step": 30}\n{"step": 40, "a')
  inode = os.stat(path).st_ino
  with caplog.at_level("INFO", logger="absl"):
    with metrics_writer.MetricsWriter(str(tmp_path), resume_step=20) as writer:
      writer.write({"step": 30, "again": True})
  assert os.stat(path).st_ino == inode  # truncated and appended in place, never replaced
  assert _lines(path) == [{"step": 10}, {"step": 20}, {"step": 30, "again": True}]
  assert "a partial last line (15 bytes, a crash mid-write) is cut off" in caplog.text
  assert "1 records after step 20 are cut" in caplog.text
  caplog.clear()
  with caplog.at_level("INFO", logger="absl"):
    metrics_writer.cut_after_step(str(path), 30)  # nothing to cut: untouched, nothing logged
  assert _lines(path)[-1] == {"step": 30, "again": True} and "cut" not in caplog.text


def test_config_json_is_never_overwritten(tmp_path):
  metrics_writer.MetricsWriter(str(tmp_path), _config()).close()
  other = _config()
  other.seed = 4
  metrics_writer.MetricsWriter(str(tmp_path), other).close()
  assert json.loads((tmp_path / "config.json").read_text())["seed"] == 3


def test_tensorboard_gets_each_record_and_step_losses_and_a_resume_has_no_duplicates(tmp_path):
  with metrics_writer.MetricsWriter(str(tmp_path), _config()) as writer:
    writer.write_losses(1, [0.9, 0.8, float("nan"), 0.6])  # a NaN step is left out
    writer.write({"step": 4, "auc": 0.7, "split": "eval", "cache": {"hit_rate": 0.5}})
    writer.write_losses(5, [0.5, 0.4])
  scalars = tensorboard.read_scalars(str(tmp_path))
  steps, values = zip(*scalars["train/loss"], strict=True)  # float32 in the event file
  assert steps == (1, 2, 4, 5, 6) and values == pytest.approx((0.9, 0.8, 0.6, 0.5, 0.4))
  assert scalars["eval/auc"] == [(4, pytest.approx(0.7))]
  assert scalars["eval/cache/hit_rate"] == [(4, 0.5)] and "eval/split" not in scalars
  with metrics_writer.MetricsWriter(str(tmp_path), _config(), resume_step=4) as writer:
    writer.write_losses(5, [0.45])  # steps after the checkpoint are written again
  assert [s for s, _ in tensorboard.read_scalars(str(tmp_path))["train/loss"]] == [1, 2, 4, 5]
  with metrics_writer.MetricsWriter(str(tmp_path), _config()) as writer:
    writer.write_losses(1, [2.0])  # a fresh run replaces the old curves
  assert tensorboard.read_scalars(str(tmp_path)) == {"train/loss": [(1, 2.0)]}
