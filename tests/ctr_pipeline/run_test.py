"""`run.ctr_finalizer` / `ctr_pipeline_parts`: the CTR report's wiring, once in the library."""

import json
import os

import ml_collections
import numpy as np
import pytest

import search_spaces
from experiments.configs import pipeline_ctr
from sfjax.automl.pipeline import StepResult, paired_auc_bootstrap
from sfjax.core import WorkdirLockedError, workdir_lock
from sfjax.ctr_pipeline import run, steps


def _config(resamples=200, seed=3):
  return ml_collections.ConfigDict({"report": {"bootstrap_resamples": resamples,
                                               "bootstrap_seed": seed}})


def _trained(tmp_path, kind, labels, scores, auc):
  np.save(tmp_path / f"{kind}_labels.npy", labels)
  np.save(tmp_path / f"{kind}_scores.npy", scores)
  return StepResult(kind, kind, "done", {"test_auc": auc},
                    {"test_labels": f"{kind}_labels.npy", "test_scores": f"{kind}_scores.npy"}, 1.0)


def test_the_finalizer_compares_final_to_baseline_and_reports_the_compression(tmp_path):
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, 400)
  good = labels + rng.normal(0, 0.5, 400)  # informative scores beat noise
  noise = rng.normal(0, 1, 400)
  compress = StepResult("compress", "compress", "done",
                        {"size_ratio": 0.25, "bits_ratio": 0.5, "unrelated": 1}, {}, 1.0)
  results = [_trained(tmp_path, "fully_train", labels, good, 0.9),
             _trained(tmp_path, "baseline", labels, noise, 0.5), compress]
  report = run.ctr_finalizer(_config())(results, str(tmp_path))
  want = paired_auc_bootstrap(labels, good, noise, num_resamples=200, seed=3)
  assert report["final_test_auc"] == 0.9 and report["baseline_test_auc"] == 0.5
  assert report["final_test_auc_interval"]["num_resamples"] == 200
  assert report["test_auc_interval"]["low"] == pytest.approx(want["low"])
  assert report["test_auc_interval"]["num_resamples"] == 200
  assert report["beats_baseline"] is True
  assert report["compression"] == {"size_ratio": 0.25, "bits_ratio": 0.5}


def test_the_finalizer_without_a_compress_step_reports_none(tmp_path):
  report = run.ctr_finalizer(_config())([], str(tmp_path))
  assert report["compression"] is None and report["beats_baseline"] is None


def test_the_parts_are_the_ctr_steps_over_the_given_spaces():
  kinds, finalize = run.ctr_pipeline_parts(_config(), search_spaces.SPACES)
  assert set(kinds) == set(steps.ctr_step_kinds(search_spaces.SPACES))
  assert callable(finalize)


def _baseline_only():
  """The smoke pipeline cut to a 12-step baseline (the smallest pipeline that trains)."""
  c = pipeline_ctr.get_config("smoke")
  c.pipeline.order = "baseline"
  c.steps.fully_train.trainer = {"train": {"steps": 12, "batch_size": 128, "eval_every": 12,
                                           "num_devices": 1},
                                 "checkpoint": {"every_steps": 6}}
  return c


def test_run_ctr_pipeline_owns_its_workdir(tmp_path):
  workdir = str(tmp_path / "pipe")
  with workdir_lock.hold_workdir(workdir, "the test"):  # e.g. the pipeline CLI or another run
    with pytest.raises(WorkdirLockedError, match=f"^{workdir} is in use by pid {os.getpid()} on "):
      run.run_ctr_pipeline(_baseline_only(), workdir, search_spaces.SPACES)
  assert os.listdir(workdir) == [workdir_lock.LOCK_FILE]  # no step ran, nothing was written
  report = run.run_ctr_pipeline(_baseline_only(), workdir, search_spaces.SPACES)
  assert report["status"] == "done" and report["baseline_test_auc"] is not None
  with open(os.path.join(workdir, workdir_lock.LOCK_FILE), encoding="utf-8") as f:
    assert json.load(f)["what"] == "run_ctr_pipeline"  # the run held it
  workdir_lock.acquire(workdir, "after the run").release()  # released at the end
