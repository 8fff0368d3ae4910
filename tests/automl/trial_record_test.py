"""A study's trial records (sfjax/automl/study/trial_record.py), by hand."""

import math

import pytest

from sfjax.automl.algorithms import Suggestion, TrialStatus
from sfjax.automl.space import Config
from sfjax.automl.study.trial_record import (
  StudyError,
  asked,
  finished,
  handed_out_again,
  running,
)

SUGGESTION = Suggestion(3, Config({"x": 1.0}), budget=2.0, rung=1, resume_from=1)


def test_a_record_is_asked_handed_out_again_and_finished():
  t = asked(SUGGESTION, 10.0)
  assert (t.trial_id, t.status, t.asked_at, t.started_at, t.attempts) == (
      3, TrialStatus.RUNNING, 10.0, 10.0, 1)
  again = handed_out_again(t, 15.0)
  assert (again.asked_at, again.started_at, again.attempts) == (10.0, 15.0, 2)
  done = finished(again, {"status": "done", "metrics": {"auc": 0.7}, "time": 20.0,
                          "elapsed_s": 5.0})
  assert (done.status, dict(done.metrics), done.reason, done.finished_at, done.elapsed_s) == (
      TrialStatus.DONE, {"auc": 0.7}, None, 20.0, 5.0)
  assert t.attempts == 1 and t.status == TrialStatus.RUNNING  # records are immutable


def test_to_dict_writes_non_finite_metrics_as_null():
  t = finished(asked(SUGGESTION, 1.0), {"status": "failed", "time": 2.0, "reason": "nan loss",
                                        "metrics": {"auc": math.nan, "steps": 4.0}})
  d = t.to_dict()
  assert d["metrics"] == {"auc": None, "steps": 4.0}
  assert (d["trial_id"], d["config"], d["status"], d["budget"], d["resume_from"], d["reason"]) == (
      3, {"x": 1.0}, "failed", 2.0, 1, "nan loss")


def test_running_names_unknown_and_finished_trials():
  t = asked(SUGGESTION, 1.0)
  trials = {3: t}
  assert running(trials, 3) is t
  with pytest.raises(StudyError, match="trial 4 was never asked"):
    running(trials, 4)
  trials[3] = finished(t, {"status": "pruned", "metrics": {}, "time": 2.0})
  with pytest.raises(StudyError, match="trial 3 already finished with status 'pruned'"):
    running(trials, 3)
