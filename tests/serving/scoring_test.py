"""`score_files` (`experiments.predict`): a tiny Criteo file scored in order, the AUC the
trainer evaluated."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sfjax.core import metrics as metrics_lib
from sfjax.serving import Predictor, score_files, write_bundle
from tests.serving import tiny_runs


@pytest.fixture(scope="module")
def criteo_bundle(tmp_path_factory):
  """(run, bundle, eval.tsv, trainer eval (logits, ids, dense, labels)) of a Criteo run."""
  root = tmp_path_factory.mktemp("predict")
  c = tiny_runs.tiny_config()
  c.data.hash_rows = 300
  run = tiny_runs.train_run(root, c, criteo=True)
  write_bundle(run.workdir, str(root / "bundle"))
  return run, str(root / "bundle"), str(root / "eval.tsv"), tiny_runs.trainer_logits(run)


def test_scores_come_back_in_input_order_with_the_trainers_auc(criteo_bundle, tmp_path):
  run, bundle, eval_tsv, (logits, _, _, labels) = criteo_bundle
  lines = []
  summary = score_files(bundle, eval_tsv, str(tmp_path / "s.npy"), chunk=64, log=lines.append)
  scores = np.load(tmp_path / "s.npy")
  assert scores.dtype == np.float32 and scores.shape == (300,) and summary["examples"] == 300
  np.testing.assert_allclose(scores, metrics_lib.sigmoid(logits), rtol=1e-5, atol=1e-7)
  assert summary["auc"] == pytest.approx(run.metrics["auc"], abs=1e-6)
  assert summary["logloss"] == pytest.approx(run.metrics["logloss"], abs=1e-5)
  assert summary["examples_per_sec"] > 0 and lines  # a progress line
  with open(eval_tsv) as f:
    raw = [line.rstrip("\n") for line in f]
  p = Predictor.load(bundle, batch_sizes=(64,))
  np.testing.assert_array_equal(scores[::-1][:10], p.predict(raw[::-1][:10]))  # order kept


def test_two_files_are_scored_in_glob_order(criteo_bundle, tmp_path):
  _, bundle, eval_tsv, _ = criteo_bundle
  with open(eval_tsv) as f:
    raw = f.readlines()
  (tmp_path / "b.tsv").write_text("".join(raw[:100]))
  (tmp_path / "a.tsv").write_text("".join(raw[100:]))
  summary = score_files(bundle, f"{tmp_path}/*.tsv", str(tmp_path / "s.npy"), fmt="criteo")
  whole = score_files(bundle, eval_tsv, str(tmp_path / "w.npy"))
  scores, want = np.load(tmp_path / "s.npy"), np.load(tmp_path / "w.npy")
  np.testing.assert_array_equal(scores, np.concatenate([want[100:], want[:100]]))
  assert summary["examples"] == whole["examples"] == 300
  with pytest.raises(ValueError, match="--format: must be one of"):
    score_files(bundle, eval_tsv, str(tmp_path / "x.npy"), fmt="parquet")


def test_the_command_line_prints_one_json_line_and_one_line_errors(criteo_bundle, tmp_path):
  _, bundle, eval_tsv, _ = criteo_bundle
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, "-m", "experiments.predict", f"--bundle={bundle}"]
  r = subprocess.run([*cmd, f"--input={eval_tsv}", f"--out={tmp_path / 's.npy'}"], cwd=root,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  summary = json.loads(r.stdout.strip().splitlines()[-1])
  assert summary["examples"] == 300 and summary["examples_per_sec"] > 0 and "auc" in summary
  score_files(bundle, eval_tsv, str(tmp_path / "w.npy"))
  np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), np.load(tmp_path / "w.npy"))
  r = subprocess.run([*cmd, f"--input={tmp_path}/none*.tsv", f"--out={tmp_path / 'x.npy'}"],
                     cwd=root, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert r.stderr.strip().splitlines()[-1].startswith("error: ") and "none" in r.stderr
  assert not (tmp_path / "x.npy").exists()


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_json_lines_of_a_layout_model_score_with_the_trainers_auc(layout_deepfm, tmp_path):
  served = layout_deepfm
  layout = Predictor.load(served.bundle, batch_sizes=(8,)).layout
  records = tiny_runs.layout_records(served.ids, served.dense, served.weights, layout)
  lines = [json.dumps({**r, "label": int(y)})
           for r, y in zip(records, served.labels, strict=True)]
  (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
  summary = score_files(served.bundle, str(tmp_path / "in.jsonl"), str(tmp_path / "s.npy"),
                        chunk=300, batch_sizes=(512,))  # records of ids: JSON lines
  np.testing.assert_allclose(np.load(tmp_path / "s.npy"), metrics_lib.sigmoid(served.logits),
                             rtol=1e-5, atol=1e-7)
  assert summary["examples"] == len(records)
  assert summary["auc"] == pytest.approx(metrics_lib.auc(served.labels, metrics_lib.sigmoid(
      served.logits)), abs=1e-6)
  bad = json.dumps(dict(records[400], history=["x"]))
  (tmp_path / "bad.jsonl").write_text("\n".join([*lines[:400], bad]) + "\n")
  with pytest.raises(ValueError, match=r"--input records 300\.\.400: record 100: feature 'history'"):
    score_files(served.bundle, str(tmp_path / "bad.jsonl"), str(tmp_path / "x.npy"), chunk=300,
                batch_sizes=(512,))
