"""The three smoke pipelines end to end through `run_pipeline`, and the steps' checks."""

import json
import os

import pytest

from experiments.configs import pipeline_augment, pipeline_compress, pipeline_digits
from sfjax.automl.pipeline import parse_steps, run_pipeline
from sfjax.core.errors import ConfigError
from sfjax.vision import vision_steps as pipeline_steps
from sfjax.vision.vision_steps import VISION_STEP_KINDS


def _run(config, workdir):
  report = run_pipeline(config, str(workdir), VISION_STEP_KINDS,
                        finalize=pipeline_steps.vision_report)
  assert report["status"] == "done", report
  with open(os.path.join(workdir, "report.json")) as f:
    assert json.load(f) == report
  return report


def _check_accuracies(report):
  assert 0.5 < report["final_test_accuracy"] <= 1.0  # chance is 0.1
  assert 0.5 < report["baseline_test_accuracy"] <= 1.0


def test_digits_pipeline_smoke(tmp_path):
  config = pipeline_digits.get_config("smoke")
  assert config.application == "vision"
  report = _run(config, tmp_path)
  _check_accuracies(report)
  steps = {s["name"]: s for s in report["steps"]}
  assert steps["fully_train"]["best_metrics"]["model"] == "darts"
  assert report["final_step"] == "fully_train"
  # rerun: every step done before is skipped, same report
  assert _run(config, tmp_path)["final_test_accuracy"] == report["final_test_accuracy"]


def test_compress_pipeline_smoke(tmp_path):
  report = _run(pipeline_compress.get_config("smoke"), tmp_path)
  _check_accuracies(report)
  fronts = report["compression_fronts"]
  assert set(fronts) == {"prune", "quant"}
  for front in fronts.values():
    sizes = [p["size"] for p in front]
    assert sizes == sorted(sizes) and all(0 < p["size_ratio"] <= 1 for p in front)
  compress = report["steps"][1]["best_metrics"]
  assert compress["final_size_ratio"] <= 1.0


def test_augment_pipeline_smoke(tmp_path):
  report = _run(pipeline_augment.get_config("smoke"), tmp_path)
  _check_accuracies(report)
  assert report["steps"][1]["best_metrics"]["augmented"] is True


def test_every_variant_parses():
  for module in (pipeline_digits, pipeline_compress, pipeline_augment):
    for arg in pipeline_digits.VARIANTS:
      assert parse_steps(module.get_config(arg), VISION_STEP_KINDS)
  with pytest.raises(ValueError, match="unknown config variant"):
    pipeline_augment.get_config("huge")


def test_checks_name_the_field():
  config = pipeline_compress.get_config("smoke")
  config.steps.compress.methods = "prune,distill"
  with pytest.raises(ConfigError, match="steps.compress.methods"):
    parse_steps(config, VISION_STEP_KINDS)
  config = pipeline_digits.get_config("smoke")
  config.steps.hpo.algorithm = "annealing"
  with pytest.raises(ConfigError, match="steps.hpo.algorithm"):
    parse_steps(config, VISION_STEP_KINDS)
  del config.steps.darts.alpha_lr
  with pytest.raises(ConfigError, match="steps.darts.alpha_lr"):
    parse_steps(config, VISION_STEP_KINDS)


def test_hpo_interrupted_mid_step_resumes_without_retraining_told_trials(tmp_path, monkeypatch):
  config = pipeline_digits.get_config("smoke")
  config.steps.hpo.num_trials, config.steps.hpo.width = 4, 3  # two rounds of two trials
  real_tell, tells = pipeline_steps.Study.tell, []

  def tell_then_die(study, trial_id, metrics, *args, **kwargs):
    out = real_tell(study, trial_id, metrics, *args, **kwargs)
    tells.append((trial_id, metrics["valid_accuracy"]))
    if len(tells) == 2:
      raise KeyboardInterrupt  # the process dies after the first round is journaled
    return out

  monkeypatch.setattr(pipeline_steps.Study, "tell", tell_then_die)
  with pytest.raises(KeyboardInterrupt):
    run_pipeline(config, str(tmp_path), VISION_STEP_KINDS, finalize=pipeline_steps.vision_report)
  monkeypatch.setattr(pipeline_steps.Study, "tell", real_tell)
  report = _run(config, tmp_path)
  hpo_dir = os.path.join(tmp_path, "steps", "1_hpo")
  with open(os.path.join(hpo_dir, "trials.jsonl")) as f:
    trials = [json.loads(line) for line in f]
  assert sorted(t["trial_id"] for t in trials) == [0, 1, 2, 3]
  # the first round's trials were not trained again: their journaled results stand
  first = {t["trial_id"]: t["metrics"]["valid_accuracy"] for t in trials if t["trial_id"] < 2}
  assert first == dict(tells)
  with open(os.path.join(hpo_dir, "journal.jsonl")) as f:
    events = [json.loads(line)["event"] for line in f]
  assert events.count("tell") == 4  # each trial told once across both runs
  assert report["steps"][1]["best_metrics"]["num_trials"] == 4
