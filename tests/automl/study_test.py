"""Tests for the durable study store (sfjax/automl/study/study.py); the journal and quota
filters on their own are in journal_test and quota_test.

Run as a script (`python study_test.py PATH N_TRIALS [HANG_AT]`), this file is the
toy study that `test_sigkill_and_resume` kills and resumes.
"""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from typing import ClassVar

import pytest

from sfjax.automl.algorithms import (
    ASHA,
    AlgorithmSpec,
    Objective,
    RandomSearch,
    RegularizedEvolution,
    Searcher,
    TrialStatus,
)
from sfjax.automl.space import Categorical, Config, Float, Int, Space
from sfjax.automl.study import JournalError, JournalLockedError, Quota, Study, StudyError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPACE = Space({"x": Float(-3.0, 3.0), "width": Int(16, 256, log=True),
               "act": Categorical(("relu", "gelu"))})
LOSS = Objective("loss", "minimize")
ALGORITHM = RegularizedEvolution(population_size=6, sample_size=2, seed=3)
DIRECTIONS = {"loss": "minimize", "params": "minimize"}
WIDTH_QUOTA = Quota("width <= 64")


def toy_metrics(suggestion, sleep=0.0, hang_at=None):
  """A cheap objective; sleeps `sleep` s, or hangs on trial `hang_at` (to be killed)."""
  if suggestion.trial_id == hang_at:
    print(f"hanging on trial {hang_at}", flush=True)
    time.sleep(60)
  time.sleep(sleep)
  c = suggestion.config
  return {"loss": (c["x"] - 1) ** 2 + (0.1 if c["act"] == "relu" else 0.0),
          "params": float(c["width"] * 100)}


def run_toy_study(path, n_trials, sleep=0.0, hang_at=None):
  with Study.open(path, SPACE, ALGORITHM, LOSS, DIRECTIONS, quotas=[WIDTH_QUOTA]) as study:
    study.optimize(lambda s: toy_metrics(s, sleep, hang_at), n_trials)
    study.export()
    return study


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def comparable(line):
  return {k: line[k] for k in ("trial_id", "config", "metrics", "status", "reason",
                               "parent_trial_id")}


def count_tells(journal):
  if not os.path.exists(journal):
    return 0
  with open(journal, "rb") as f:
    return f.read().count(b'"event": "tell"')


def test_sigkill_and_resume(tmp_path):
  reference = run_toy_study(str(tmp_path / "reference"), 24)
  path = str(tmp_path / "killed")
  journal = os.path.join(path, "journal.jsonl")
  env = {**os.environ, "PYTHONPATH": ROOT}
  # Kill 1: while trial 5 is training. Kill 2: whenever 14 trials have been told.
  hang = subprocess.Popen([sys.executable, __file__, path, "24", "5"], env=env,
                          stdout=subprocess.PIPE, text=True)
  assert hang.stdout.readline().strip() == "hanging on trial 5"
  hang.send_signal(signal.SIGKILL)
  hang.wait()
  hang.stdout.close()
  run = subprocess.Popen([sys.executable, __file__, path, "24"], env=env)
  deadline = time.time() + 30
  while count_tells(journal) < 14 and time.time() < deadline and run.poll() is None:
    time.sleep(0.002)
  run.send_signal(signal.SIGKILL)
  assert run.wait() == -signal.SIGKILL
  assert count_tells(journal) >= 14

  resumed = run_toy_study(path, 24)
  lines = read_jsonl(os.path.join(path, "trials.jsonl"))
  expected = read_jsonl(str(tmp_path / "reference" / "trials.jsonl"))
  assert [comparable(x) for x in lines] == [comparable(x) for x in expected]
  ids = [x["trial_id"] for x in lines]
  assert ids == sorted(set(ids))
  assert sum(x["status"] == "done" for x in lines) == 24
  assert sum(x["status"] == "rejected" for x in lines) > 0
  assert resumed.trial(5).attempts == 2
  assert resumed.best().trial_id == reference.best().trial_id


def test_torn_last_line_is_ignored_with_a_warning(tmp_path):
  path = str(tmp_path)
  run_toy_study(path, 6)
  journal = os.path.join(path, "journal.jsonl")
  with open(journal, "ab") as f:
    f.write(b'{"event": "tell", "trial_id": 7, "metr')
  with pytest.warns(RuntimeWarning, match=r"journal.jsonl:\d+: ignoring a torn last line"):
    study = Study.open(path, SPACE, ALGORITHM, LOSS, DIRECTIONS)
  assert sum(t.status == TrialStatus.DONE for t in study.trials()) == 6
  study.optimize(toy_metrics, 8)
  study.close()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    study = Study.open(path, SPACE, ALGORITHM, LOSS, DIRECTIONS)
  assert sum(t.status == TrialStatus.DONE for t in study.trials()) == 8
  study.close()


def test_corruption_names_file_and_line(tmp_path):
  path = str(tmp_path)
  run_toy_study(path, 4)
  journal = os.path.join(path, "journal.jsonl")
  with open(journal) as f:
    lines = f.readlines()
  with open(journal, "w") as f:
    f.writelines(lines[:2] + ["this is not json\n"] + lines[3:])
  with pytest.raises(JournalError, match=f"{journal}:3: corrupt journal line"):
    Study.open(path, SPACE, ALGORITHM, LOSS, DIRECTIONS)
  tell = next(i for i, line in enumerate(lines) if '"event": "tell"' in line)
  with open(journal, "w") as f:
    f.writelines(lines[:tell + 1] + [lines[tell]] + lines[tell + 1:])
  with pytest.raises(JournalError, match=f"{journal}:{tell + 2}: .*already finished"):
    Study.open(path, SPACE, ALGORITHM, LOSS, DIRECTIONS)


@pytest.mark.parametrize("change, field", [
    (dict(space=SPACE.with_forbidden({"act": "gelu"})), "space"),
    (dict(algorithm=RandomSearch(seed=3)), "algorithm"),
    (dict(objective=Objective("loss", "maximize")), "objective"),
    (dict(directions={"loss": "minimize"}), "directions"),
])
def test_reopening_with_other_settings_fails(tmp_path, change, field):
  run_toy_study(str(tmp_path), 2)
  args = dict(space=SPACE, algorithm=ALGORITHM, objective=LOSS, directions=DIRECTIONS)
  with pytest.raises(StudyError, match=f"created with a different {field}"):
    Study.open(str(tmp_path), **{**args, **change})


def test_running_trials_are_requeued_once(tmp_path):
  study = Study.open(str(tmp_path), SPACE, ALGORITHM, LOSS)
  first = study.ask(3)
  study.tell(first[0].trial_id, toy_metrics(first[0]))
  with pytest.raises(JournalLockedError):
    Study.open(str(tmp_path), SPACE, ALGORITHM, LOSS)
  study.close()  # as if the process died with trials 1 and 2 running
  study = Study.open(str(tmp_path), SPACE, ALGORITHM, LOSS)
  assert study.running() == [1, 2]
  with pytest.raises(StudyError, match="re-queued"):
    study.tell(1, {"loss": 0.0})
  again = study.ask(4)
  assert [s.trial_id for s in again] == [1, 2, 3, 4]
  assert again[:2] == first[1:]
  for s in again:
    study.tell(s.trial_id, toy_metrics(s))
  with pytest.raises(StudyError, match="already finished"):
    study.tell(1, {"loss": 0.0})
  assert [t.attempts for t in study.trials()] == [1, 2, 2, 1, 1]
  study.close()


def test_quotas_reject_before_training(tmp_path):
  def params(config):
    return config["width"] * 1e4
  quotas = [Quota("params < 1.3e6", {"params": params}),
            lambda config: "no gelu" if config["act"] == "gelu" else None]
  with Study.open(str(tmp_path), SPACE, RandomSearch(seed=0), LOSS, quotas=quotas) as study:
    study.optimize(toy_metrics, 5, batch_size=2)
    trials = study.trials()
  done = [t for t in trials if t.status == TrialStatus.DONE]
  rejected = [t for t in trials if t.status == TrialStatus.REJECTED]
  assert len(done) == 5 and rejected
  assert all(t.config["width"] * 1e4 < 1.3e6 and t.config["act"] == "relu" for t in done)
  for t in rejected:
    if t.config["width"] * 1e4 >= 1.3e6:
      assert t.reason.startswith("quota 'params < 1.3e6' failed: params = ")
      assert t.metrics == {"params": t.config["width"] * 1e4}
    else:
      assert t.reason == "no gelu"
  impossible = [Quota("width < 0")]
  with Study.open(str(tmp_path / "x"), SPACE, RandomSearch(), LOSS, quotas=impossible,
                  max_rejections=20) as study:
    with pytest.raises(StudyError, match="rejected 21 suggestions"):
      study.ask(1)


def test_failures_exports_and_pareto_front(tmp_path):
  def metrics(s):
    if s.trial_id == 1:
      raise RuntimeError("out of memory")
    if s.trial_id == 2:
      return {"loss": math.nan, "params": 1.0}
    return toy_metrics(s)

  with Study.open(str(tmp_path), SPACE, RandomSearch(seed=0), LOSS, DIRECTIONS) as study:
    study.optimize(metrics, 12, batch_size=4)
    assert study.trial(1).status == TrialStatus.FAILED
    assert study.trial(1).reason == "RuntimeError: out of memory"
    assert study.trial(2).status == TrialStatus.FAILED and "NaN" in study.trial(2).reason
    front = study.pareto_front()
    done = [t for t in study.trials() if t.status == TrialStatus.DONE]
    for t in done:  # every trial off the front is dominated by one on it
      if t not in front:
        assert any(f.metrics["loss"] <= t.metrics["loss"] and
                   f.metrics["params"] <= t.metrics["params"] for f in front)
    study.export()
    best = study.best()
  lines = read_jsonl(os.path.join(str(tmp_path), "trials.jsonl"))
  assert [x["trial_id"] for x in lines] == list(range(12))
  assert {"trial_id", "config", "metrics", "status"} <= set(lines[0])
  assert lines[2]["metrics"]["loss"] is None  # NaN exported as null
  with open(os.path.join(str(tmp_path), "best.json")) as f:
    summary = json.load(f)
  assert summary["best"]["trial_id"] == best.trial_id
  assert best.metrics["loss"] == min(t.metrics["loss"] for t in done)
  assert summary["pareto_front"] == [t.trial_id for t in front]


def test_multi_fidelity_study_resumes_and_picks_best_at_full_budget(tmp_path):
  def metrics(s):
    return {"loss": (s.config["x"] - 1) ** 2 + 1.0 / s.budget}

  algorithm = ASHA(min_budget=1, max_budget=9, eta=3, seed=0)
  with Study.open(str(tmp_path), SPACE, algorithm, LOSS) as study:
    study.optimize(metrics, 20, batch_size=4)
  with Study.open(str(tmp_path), SPACE, algorithm, LOSS) as study:
    study.optimize(metrics, 40, batch_size=4)
    trials = study.trials()
    top = max(t.suggestion.budget for t in trials)
    assert top == 9 and study.best().suggestion.budget == 9
    for t in trials:
      if t.suggestion.resume_from is not None:
        parent = study.trial(t.suggestion.resume_from)
        assert parent.config == t.config and parent.suggestion.rung + 1 == t.suggestion.rung


if __name__ == "__main__":
  run_toy_study(sys.argv[1], int(sys.argv[2]), sleep=0.01,
                hang_at=int(sys.argv[3]) if len(sys.argv) > 3 else None)


@dataclasses.dataclass(frozen=True)
class _Scripted(AlgorithmSpec):
  """Hands out `budgets` in order, one config each (x = its index)."""

  name: ClassVar[str] = "scripted"
  budgets: tuple = ()

  def build(self, space, objective):
    return _ScriptedSearcher(self, space, objective)


class _ScriptedSearcher(Searcher):

  def _propose(self, n):
    out = []
    while len(out) < n and self._next_trial_id < len(self.spec.budgets):
      i = self._next_trial_id
      out.append(self._new_suggestion(Config({"x": i / 10, "width": 16, "act": "relu"}),
                                      budget=self.spec.budgets[i]))
    return out


def test_pareto_front_per_budget_in_best_json(tmp_path):
  auc_params = {"auc": "maximize", "params": "minimize"}
  metrics = [(0.70, 100), (0.72, 300), (0.69, 50), (0.71, 300),  # budget 1: front 0, 1, 2
             (0.74, 300), (0.73, 100), None]  # budget 2: front 4, 5 (6 fails)
  spec = _Scripted(budgets=(1.0,) * 4 + (2.0,) * 3)
  with Study.open(str(tmp_path), SPACE, spec, Objective("auc", "maximize"), auc_params) as study:
    for s in study.ask(7):
      m = metrics[s.trial_id]
      if m is None:
        study.tell(s.trial_id, {}, TrialStatus.FAILED)
      else:
        study.tell(s.trial_id, {"auc": m[0], "params": float(m[1])})
    assert [t.trial_id for t in study.pareto_front(budget="all")] == [2, 4, 5]  # mixed budgets
    study.export()
  with open(tmp_path / "best.json") as f:
    best = json.load(f)
  assert best["pareto_fronts"] == [{"budget": 1.0, "trial_ids": [0, 1, 2]},
                                   {"budget": 2.0, "trial_ids": [4, 5]}]
  assert best["pareto_front"] == [4, 5] and best["best"]["trial_id"] == 4
  assert best["directions"] == auc_params


def test_record_retry_is_journaled_and_replayed(tmp_path):
  with Study.open(str(tmp_path), SPACE, RandomSearch(seed=0), LOSS) as study:
    a, b = study.ask(2)
    study.record_retry([a.trial_id])
    assert study.trial(a.trial_id).attempts == 2 and study.trial(b.trial_id).attempts == 1
    study.tell(b.trial_id, toy_metrics(b))
    with pytest.raises(StudyError, match="already finished"):
      study.record_retry([b.trial_id])
    study.tell(a.trial_id, toy_metrics(a))
  with Study.open(str(tmp_path), SPACE, RandomSearch(seed=0), LOSS) as study:
    assert study.trial(a.trial_id).attempts == 2 and study.trial(a.trial_id).status == "done"
