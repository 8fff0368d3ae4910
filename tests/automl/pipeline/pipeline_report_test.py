"""Tests of the pipeline report and its summary table."""

import json
import math

import numpy as np
import pytest

from sfjax.automl.pipeline import pipeline_report
from sfjax.automl.pipeline.step_specs import StepResult


def _results():
  return [StepResult("nas", "nas", "done", {"auc": 0.75, "test_auc": math.nan}, {"x": 1}, 12.345),
          StepResult("train", "fully_train", "failed", {}, {}, 3.0, "ValueError: bad"),
          StepResult("base", "baseline", "skipped", {}, {}, None)]


def test_report_format_is_strict_json():
  report = pipeline_report.build_report(_results(), {"final_test_auc": np.float32(0.5),
                                                     "interval": (0.1, math.inf)})
  assert report["status"] == "failed"
  assert report["steps"][0] == {"name": "nas", "type": "nas", "status": "done",
                                "best_metrics": {"auc": 0.75, "test_auc": None}, "wall_s": 12.345}
  assert report["steps"][1]["error"] == "ValueError: bad" and "error" not in report["steps"][2]
  assert report["final_test_auc"] == 0.5 and report["interval"] == [0.1, None]
  assert json.loads(json.dumps(report, allow_nan=False)) == report
  done = pipeline_report.build_report(_results()[:1], {})
  assert done["status"] == "done"


def test_report_refuses_reserved_fields_and_unknown_status():
  with pytest.raises(ValueError, match="reserved"):
    pipeline_report.build_report(_results(), {"steps": 1})
  with pytest.raises(ValueError, match="'running'"):
    pipeline_report.build_report([StepResult("a", "a", "running", {}, {}, 1.0)], {})


def test_summary_table_lists_every_step_and_field():
  report = pipeline_report.build_report(_results(), {"final_test_auc": 0.78125,
                                                     "test_auc_interval": {"low": 0.01, "high": 0.02}})
  table = pipeline_report.summary_table(report)
  lines = table.splitlines()
  assert lines[0].split() == ["#", "step", "type", "status", "wall_s", "best_metrics"]
  assert lines[2].split()[:5] == ["0", "nas", "nas", "done", "12.3"]
  assert "auc=0.7500 test_auc=-" in lines[2]
  assert "ValueError: bad" in lines[3] and lines[4].split()[3:5] == ["skipped", "-"]
  assert "pipeline: failed" in table and "final_test_auc: 0.7812" in table
  assert "test_auc_interval: low=0.0100 high=0.0200" in table
