"""Tests for the Optuna mirror of a study (sfjax/automl/study/optuna_mirror.py).

Toy studies (no training) mirrored to a journal file and to SQLite; `optuna.load_study`
reads them back and every trial is checked against ours. The mirror of a real search is
tested in tests/ctr_search/search_events_test.py.
"""

import json
import threading
import urllib.request
import wsgiref.simple_server

import optuna
import optuna_dashboard
import pytest

from sfjax.automl.algorithms import (
  ASHA,
  NSGA2,
  Objective,
  Objectives,
  RandomSearch,
  TrialStatus,
)
from sfjax.automl.space import Categorical, Float, Int, Space
from sfjax.automl.study import Quota, Study
from sfjax.automl.study import optuna_mirror as om

SPACE = Space({"x": Float(-3.0, 3.0), "width": Int(16, 256, log=True),
               "act": Categorical(("relu", "gelu"))})
LOSS = Objective("loss", "minimize")
TWO = Objectives.of([Objective("loss", "minimize"), Objective("params", "minimize")])


def toy_metrics(s):
  """A loss that falls with the budget, and a size."""
  c = s.config
  budget = s.budget or 1.0
  return {"loss": (c["x"] - 1) ** 2 + 1.0 / budget + (0.1 if c["act"] == "relu" else 0.0),
          "params": float(c["width"] * 100)}


def storage_spec(tmp_path, kind):
  return str(tmp_path / "mirror.log") if kind == "journal" else f"sqlite:///{tmp_path}/m.db"


def open_mirror(storage, study, objective=LOSS, owner="toy", steps=None, name="toy"):
  return om.OptunaMirror.open(storage, name, SPACE, objective, owner=owner,
                              step_of_budget=steps)


def check_trials(storage, study, objective, name="toy"):
  """Every trial of `study` appears once in the Optuna study, equal to ours."""
  loaded = optuna.load_study(study_name=name, storage=om.open_storage(storage))
  by_id = {t.user_attrs[om.TRIAL_ID_ATTR]: t for t in loaded.trials}
  ours = study.trials()
  assert len(loaded.trials) == len(ours) and set(by_id) == {t.trial_id for t in ours}
  states = {TrialStatus.DONE: "COMPLETE", TrialStatus.FAILED: "FAIL",
            TrialStatus.PRUNED: "PRUNED", TrialStatus.REJECTED: "FAIL",
            TrialStatus.RUNNING: "RUNNING"}
  metrics = [o.metric for o in (objective.all if isinstance(objective, Objectives)
                                else (objective,))]
  for t in ours:
    o = by_id[t.trial_id]
    assert o.params == SPACE.optuna_params(t.config)
    assert o.distributions == SPACE.optuna_distributions(t.config)
    assert o.state.name == states[t.status] and o.user_attrs[om.STATUS_ATTR] == t.status.value
    if t.status == TrialStatus.DONE:
      assert o.values == [t.metrics[m] for m in metrics]
      assert o.user_attrs["params"] == t.metrics["params"]
    else:
      assert o.values is None
    assert o.user_attrs.get("budget") == t.suggestion.budget
    assert o.user_attrs.get("reason") == t.reason
  return loaded, by_id


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_multi_fidelity_study_round_trips_with_its_promotion_curves(tmp_path, kind):
  storage = storage_spec(tmp_path, kind)
  algorithm = ASHA(min_budget=1, max_budget=9, eta=3, seed=1)
  with Study.open(str(tmp_path / "s"), SPACE, algorithm, LOSS,
                  quotas=[Quota("width <= 128")]) as study:
    study.optimize(toy_metrics, 14)
    mirror = open_mirror(storage, study, steps=lambda b: int(round(10 * b)))
    assert mirror.update(study.trials()) == len(study.trials())
    mirror.close()
    loaded, by_id = check_trials(storage, study, LOSS)
    assert [d.name for d in loaded.directions] == ["MINIMIZE"]
    assert loaded.metric_names == ["loss"]
    promoted = [t for t in study.trials() if t.suggestion.parent_trial_id is not None]
    assert promoted, "ASHA promoted no trial: the chain is untested"
    for t in study.trials():
      chain, node = {}, t
      while node is not None and node.status == TrialStatus.DONE:
        chain[int(round(10 * node.suggestion.budget))] = node.metrics["loss"]
        parent = node.suggestion.parent_trial_id
        node = study.trial(parent) if parent is not None else None
      assert by_id[t.trial_id].intermediate_values == chain
    assert any(len(by_id[t.trial_id].intermediate_values) >= 2 for t in promoted)
    rejected = [t for t in study.trials() if t.status == TrialStatus.REJECTED]
    assert rejected and all(by_id[t.trial_id].state.name == "FAIL" for t in rejected)


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_running_trials_are_finished_in_place_and_a_resume_adds_nothing_twice(tmp_path, kind):
  storage = storage_spec(tmp_path, kind)
  path = str(tmp_path / "s")
  with Study.open(path, SPACE, RandomSearch(seed=2), LOSS) as study:
    mirror = open_mirror(storage, study)
    batch = study.ask(3)
    assert mirror.update(study.trials()) == 3  # asked: RUNNING
    loaded = optuna.load_study(study_name="toy", storage=om.open_storage(storage))
    assert [t.state.name for t in loaded.trials] == ["RUNNING"] * 3
    study.tell(batch[0].trial_id, toy_metrics(batch[0]))
    study.tell(batch[1].trial_id, {}, TrialStatus.FAILED, reason="boom")
    assert mirror.update(study.trials()) == 2 and mirror.update(study.trials()) == 0
    check_trials(storage, study, LOSS)  # trial 2 still RUNNING
    mirror.close()
  with Study.open(path, SPACE, RandomSearch(seed=2), LOSS) as study:  # resumed
    mirror = open_mirror(storage, study)
    assert mirror.update(study.trials()) == 0  # nothing new: no duplicate
    study.optimize(toy_metrics, 5)  # re-runs the in-flight trial 2, adds two more
    assert mirror.update(study.trials()) == 3
    mirror.close()
    check_trials(storage, study, LOSS)
  reopened = open_mirror(storage, study)  # a third open finds every trial mirrored
  assert reopened.update(study.trials()) == 0
  assert len(optuna.load_study(study_name="toy", storage=om.open_storage(storage)).trials) == 5


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_multi_objective_study_has_our_directions_and_pareto_front(tmp_path, kind):
  storage = storage_spec(tmp_path, kind)
  directions = {"loss": "minimize", "params": "minimize"}
  with Study.open(str(tmp_path / "s"), SPACE, NSGA2(population_size=4, seed=3), TWO,
                  directions) as study:
    study.optimize(toy_metrics, 12)
    mirror = open_mirror(storage, study, objective=TWO)
    mirror.update(study.trials())
    mirror.close()
    loaded, _ = check_trials(storage, study, TWO)
    assert [d.name for d in loaded.directions] == ["MINIMIZE", "MINIMIZE"]
    assert loaded.metric_names == ["loss", "params"]
    ours = {t.trial_id for t in study.pareto_front()}
    assert 1 <= len(ours) < 12
    assert {t.user_attrs[om.TRIAL_ID_ATTR] for t in loaded.best_trials} == ours
    # multi-objective trials report no intermediate values (Optuna's semantics)
    assert all(not t.intermediate_values for t in loaded.trials)


def test_bad_storage_other_directions_and_other_owner_are_named(tmp_path):
  for bad in ("study.db", "postgresql://x/y", "sqlite:///", "", None):
    with pytest.raises(ValueError, match="study.optuna_storage"):
      om.storage_kind(bad)
  assert om.storage_kind("a/b.jsonl") == "journal"
  assert om.storage_kind("sqlite:////tmp/x.db") == "sqlite"
  storage = storage_spec(tmp_path, "journal")
  with Study.open(str(tmp_path / "s"), SPACE, RandomSearch(seed=0), LOSS) as study:
    open_mirror(storage, study, owner="/runs/a")
    with pytest.raises(ValueError, match="study.optuna_study_name.*mirrors /runs/a"):
      open_mirror(storage, study, owner="/runs/b")
    with pytest.raises(ValueError, match="study.optuna_study_name.*directions"):
      open_mirror(storage, study, objective=Objective("loss", "maximize"), owner="/runs/a")
    with pytest.raises(ValueError, match="study.optuna_study_name"):
      open_mirror(storage, study, name="")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_optuna_dashboard_serves_the_mirrored_study_over_loopback(tmp_path, kind):
  storage = storage_spec(tmp_path, kind)
  directions = {"loss": "minimize", "params": "minimize"}
  with Study.open(str(tmp_path / "s"), SPACE, NSGA2(population_size=4, seed=3), TWO,
                  directions) as study:
    study.optimize(toy_metrics, 8)
    mirror = open_mirror(storage, study, objective=TWO)
    mirror.update(study.trials())
    mirror.close()
    front = {t.trial_id for t in study.pareto_front()}
  app = optuna_dashboard.wsgi(om.open_storage(storage))
  server = wsgiref.simple_server.make_server("127.0.0.1", 0, app, handler_class=_QuietHandler)
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                            daemon=True)
  thread.start()
  try:
    base = f"http://127.0.0.1:{server.server_port}"

    def get(path):
      with urllib.request.urlopen(base + path, timeout=20) as r:
        return json.loads(r.read())

    (summary,) = get("/api/studies")["study_summaries"]
    assert summary["study_name"] == "toy" and summary["directions"] == ["minimize", "minimize"]
    detail = get(f"/api/studies/{summary['study_id']}")
    assert len(detail["trials"]) == 8 and detail["objective_names"] == ["loss", "params"]
    shown = {int(_attr(t, om.TRIAL_ID_ATTR)) for t in detail["best_trials"]}
    assert shown == front
    params = {p["name"] for t in detail["trials"] for p in t["params"]}
    assert params == {"x", "width", "act"}
  finally:
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
  def log_message(self, *args):  # no access log on stderr
    pass


def _attr(trial, key):
  """A user attr of a dashboard trial record (serialized as [{key, value}])."""
  return next(a["value"] for a in trial["user_attrs"] if a["key"] == key)


def test_reports_inside_a_run_round_trip_and_a_pruned_trial_is_marked_pruned(tmp_path):
  reports = {4: 0.9, 8: 0.7}
  metrics = om.reported_metrics("loss", reports)
  assert metrics == {"loss/4": 0.9, "loss/8": 0.7}
  assert om.reported_values({**metrics, "loss": 0.7, "loss/x": 1.0, "loss/": 2.0}, "loss") == reports
  storage = storage_spec(tmp_path, "journal")
  with Study.open(str(tmp_path / "s"), SPACE, RandomSearch(seed=0), LOSS) as study:
    done, pruned = study.ask(2)
    study.tell(done.trial_id, {"loss": 0.5, "params": 10.0,
                               **om.reported_metrics("loss", {4: 0.8, 8: 0.5})})
    study.tell(pruned.trial_id, {"loss": 0.9, "params": 10.0, **metrics}, TrialStatus.PRUNED,
               reason="pruned at step 8")
    mirror = open_mirror(storage, study)
    mirror.update(study.trials())
    _, by_id = check_trials(storage, study, LOSS)
  assert by_id[pruned.trial_id].state.name == "PRUNED"
  assert by_id[pruned.trial_id].intermediate_values == reports
  assert by_id[done.trial_id].intermediate_values == {4: 0.8, 8: 0.5}
