"""`run.ctr_finalizer` / `ctr_pipeline_parts`: the CTR report's wiring, once in the library."""

import ml_collections
import numpy as np
import pytest

import search_spaces
from sfjax.automl.pipeline import StepResult, paired_auc_bootstrap
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
