"""A study's journal events (sfjax/automl/study/events.py): header checks and replay."""

import pytest

from sfjax.automl.algorithms import Suggestion, TrialStatus
from sfjax.automl.space import Config
from sfjax.automl.study import JournalError, StudyError, events

SETTINGS = {"space": {"x": [0, 1]}, "algorithm": {"name": "random", "params": {"seed": 0}},
            "objective": {"metric": "auc"}, "directions": None}


def _ask(time, *trial_ids, core="c"):
  return {"event": "ask", "time": time, "core": core,
          "suggestions": [Suggestion(i, Config({"x": 0.5})).to_dict() for i in trial_ids]}


def test_check_header_names_the_field_and_how_it_differs():
  header = events.header(SETTINGS)
  events.check_header("j.jsonl", (1, header), header)
  other = events.header({**SETTINGS, "algorithm": {"name": "random", "params": {"seed": 1}}})
  with pytest.raises(StudyError, match=r"different algorithm: params seed: stored 0, given 1"):
    events.check_header("j.jsonl", (1, header), other)
  with pytest.raises(JournalError, match="j.jsonl:1: expected a 'sfjax.study/1' header"):
    events.check_header("j.jsonl", (1, {"event": "ask"}), header)


def test_difference_of_plain_values_and_of_dicts():
  assert events._difference(1, 2) == "stored 1, given 2"
  assert events._difference({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == (
      "b: stored 2, given 3; c: stored None, given 4")


def test_replay_rebuilds_records_the_searchers_history_and_the_pending_trials():
  records = list(enumerate([
      _ask(1.0, 0, 1, core="after-ask"),
      {"event": "requeue", "time": 2.0, "trial_ids": [1]},
      {"event": "tell", "time": 3.0, "trial_id": 0, "status": "done", "metrics": {"auc": 0.6},
       "reason": None, "elapsed_s": 2.0, "core": "after-tell"},
      _ask(4.0, 2, core="last"),
  ], start=2))
  replayed = events.replay("j.jsonl", records)
  assert replayed.pending == [1, 2]
  trials = replayed.trials
  assert (trials[0].status, dict(trials[0].metrics), trials[0].finished_at) == (
      TrialStatus.DONE, {"auc": 0.6}, 3.0)
  assert (trials[1].status, trials[1].attempts, trials[1].started_at) == (
      TrialStatus.RUNNING, 2, 2.0)
  state = replayed.searcher_state
  assert state["core"] == "last"
  assert [h["suggestion"]["trial_id"] for h in state["history"]] == [0]
  assert [p["trial_id"] for p in state["pending"]] == [1, 2]
  assert events.replay("j.jsonl", []) == ({}, None, [])


@pytest.mark.parametrize("bad,message", [
    ({"event": "stop", "time": 1.0}, "bad stop event: unknown event 'stop'"),
    ({"event": "tell", "time": 1.0, "trial_id": 7, "status": "done", "metrics": {},
      "core": "c"}, "bad tell event: trial 7 was never asked"),
    (_ask(1.0, 0), "bad ask event: trial 0 asked twice"),
    ({"event": "requeue", "time": 1.0}, "bad requeue event: 'trial_ids'"),
])
def test_a_bad_event_names_the_file_and_its_line(bad, message):
  with pytest.raises(JournalError, match=f"j.jsonl:3: {message}"):
    events.replay("j.jsonl", [(2, _ask(0.5, 0)), (3, bad)])
