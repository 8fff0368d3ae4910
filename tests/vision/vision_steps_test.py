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


@pytest.mark.slow  # ~24 s; the fast tier stays under 5 minutes (make test-all runs it)
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


def _hpo_trials(workdir):
  """{trial_id: (config, metrics)} of the hpo step's exported trials."""
  with open(os.path.join(workdir, "steps", "0_hpo", "trials.jsonl")) as f:
    return {t["trial_id"]: (t["config"], t["metrics"]) for t in map(json.loads, f)}


def test_hpo_interrupted_mid_step_resumes_only_the_remaining_trials(tmp_path, monkeypatch):
  """The resumed process trains (asks and tells) only trials 2 and 3, and ends where the
  uninterrupted run ends; a fresh rerun of the step would ask and tell all four."""
  config = pipeline_digits.get_config("smoke")
  config.pipeline.order = "hpo"  # on the baseline CNN: the step alone
  config.steps.hpo.num_trials, config.steps.hpo.width = 4, 3  # two rounds of two trials
  once = _run(config, tmp_path / "once")
  real_ask, real_tell = pipeline_steps.Study.ask, pipeline_steps.Study.tell
  asked, told, die_after = [], [], [2]

  def counting_ask(study, n, *args, **kwargs):
    out = real_ask(study, n, *args, **kwargs)
    asked.extend(s.trial_id for s in out)
    return out

  def counting_tell(study, trial_id, metrics, *args, **kwargs):
    out = real_tell(study, trial_id, metrics, *args, **kwargs)
    told.append(trial_id)
    if len(told) == die_after[0]:
      raise KeyboardInterrupt  # the process dies after the first round is journaled
    return out

  monkeypatch.setattr(pipeline_steps.Study, "ask", counting_ask)
  monkeypatch.setattr(pipeline_steps.Study, "tell", counting_tell)
  workdir = tmp_path / "resumed"
  with pytest.raises(KeyboardInterrupt):
    run_pipeline(config, str(workdir), VISION_STEP_KINDS, finalize=pipeline_steps.vision_report)
  assert (asked, told) == ([0, 1], [0, 1])
  asked.clear(), told.clear()
  die_after[0] = None
  resumed = _run(config, workdir)
  assert (asked, told) == ([2, 3], [2, 3])  # only the remaining trials were trained
  assert _hpo_trials(workdir) == _hpo_trials(tmp_path / "once")  # same configs and results
  assert resumed["steps"][0]["best_metrics"] == once["steps"][0]["best_metrics"]
  assert resumed["steps"][0]["best_metrics"]["num_trials"] == 4
  with open(os.path.join(workdir, "steps", "0_hpo", "journal.jsonl")) as f:
    events = [json.loads(line)["event"] for line in f]
  assert events.count("tell") == 4  # each trial told once across both processes
