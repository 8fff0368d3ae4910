"""write_plots finds a run's, a study's and a pipeline's files and writes PNGs beside them."""

import json

import pytest

from sfjax.core import tensorboard
from sfjax.viz import workdir_plots


def test_writes_one_png_per_supported_file(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(
      json.dumps({"step": 5, "loss": 0.5, "eval_auc": 0.7, "cache_hit_rate": 0.3}) + "\n{torn")
  writer = tensorboard.EventWriter(str(tmp_path))
  writer.series("train/loss", 1, [0.9, 0.8])
  writer.close()
  study = tmp_path / "steps" / "0_nas"
  study.mkdir(parents=True)
  trials = [{"trial_id": i, "budget": 1, "status": "done",
             "metrics": {"auc": 0.7 + i / 100, "params": 10 - i}} for i in range(3)]
  (study / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))
  (study / "best.json").write_text(json.dumps({
      "objective": {"metric": "auc", "direction": "maximize"},
      "directions": {"auc": "maximize", "params": "minimize"}}))
  (tmp_path / "report.json").write_text(json.dumps({"steps": [{"name": "nas", "status": "done",
                                                                "wall_s": 1.0}]}))
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "checkpoints" / "metrics.jsonl").write_text('{"step": 1}\n')  # not a run: skipped
  written = workdir_plots.write_plots(str(tmp_path))
  names = sorted(p[len(str(tmp_path)) + 1:] for p in written)
  assert names == ["cache_curves.png", "pipeline.png", "steps/0_nas/leaderboard.png",
                   "steps/0_nas/pareto.png", "training_curves.png"]
  with pytest.raises(FileNotFoundError, match="not a directory"):
    workdir_plots.write_plots(str(tmp_path / "absent"))


def test_an_empty_workdir_has_nothing_to_plot(tmp_path):
  assert workdir_plots.write_plots(str(tmp_path)) == []
