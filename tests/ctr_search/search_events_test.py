"""TensorBoard curves of a search: each DONE trial once, the best so far, rebuilt on resume;
and the search mirrored to an Optuna storage (journal file, SQLite)."""

import json
import os

import optuna
import pytest

from search_spaces.ctr import SEARCH_SPACE as SPACE
from sfjax.automl.algorithms import TrialStatus
from sfjax.automl.study import optuna_mirror
from sfjax.automl.study.tradeoff import select_within_auc
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.latency import LatencySettings
from sfjax.core import tensorboard
from sfjax.ctr_search import search_config, search_loop
from sfjax.ctr_search.search_config import SearchConfigError
from sfjax.ctr_search.search_events import SearchEvents
from sfjax.viz import plots
from tests.ctr_search.search_loop_test import tiny_config


class _Trial:
  def __init__(self, trial_id, status, metrics):
    self.trial_id, self.status, self.metrics = trial_id, status, metrics


def test_done_trials_once_and_the_best_so_far(tmp_path):
  events = SearchEvents(str(tmp_path), "auc", "maximize")
  trials = [_Trial(0, TrialStatus.DONE, {"auc": 0.70, "params": 10.0}),
            _Trial(1, TrialStatus.FAILED, {"auc": float("nan")}),
            _Trial(2, TrialStatus.DONE, {"auc": 0.65, "params": 5.0})]
  assert events.update(trials) == 2
  assert events.update(trials) == 0  # already written
  trials.append(_Trial(3, TrialStatus.DONE, {"auc": 0.75}))
  assert events.update(trials) == 1
  events.close()
  scalars = tensorboard.read_scalars(str(tmp_path))
  assert [s for s, _ in scalars["trial/auc"]] == [0, 2, 3]
  assert scalars["trial/params"] == [(0, 10.0), (2, 5.0)]
  best = scalars["search/best_auc"]
  assert [s for s, _ in best] == [1, 2, 3] and [round(v, 2) for _, v in best] == [0.7, 0.7, 0.75]
  resumed = SearchEvents(str(tmp_path), "logloss", "minimize")  # old files are replaced
  resumed.update([_Trial(0, TrialStatus.DONE, {"logloss": 0.5})])
  resumed.close()
  assert tensorboard.read_scalars(str(tmp_path)) == {"trial/logloss": [(0, 0.5)],
                                                     "search/best_logloss": [(1, 0.5)]}


# ---- the Optuna mirror of a real search (study.optuna_storage, issue #26) ----------------


@pytest.fixture(scope="module")
def runner():
  return CohortRunner(search_config.make_task(tiny_config()), cohort_width=1)


def _storage(tmp_path, kind):
  return str(tmp_path / "optuna.jsonl") if kind == "journal" else f"sqlite:///{tmp_path}/o.db"


def _mirrored(storage, name="s"):
  loaded = optuna.load_study(study_name=name, storage=optuna_mirror.open_storage(storage))
  return loaded, {t.user_attrs[optuna_mirror.TRIAL_ID_ATTR]: t for t in loaded.trials}


def _read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_search_is_mirrored_and_its_resume_adds_no_trial_twice(tmp_path, runner, kind):
  storage, workdir = _storage(tmp_path, kind), str(tmp_path / "search")
  config = tiny_config("asha", num_trials=6, optuna_storage=storage, optuna_study_name="s")
  space = search_config.make_space(config, SPACE)
  search_loop.run_search(config, workdir, SPACE, runner=runner)
  config.study.num_trials = 8  # resumed: the same study, extended
  search_loop.run_search(config, workdir, SPACE, runner=runner)
  trials = {t["trial_id"]: t for t in _read_jsonl(os.path.join(workdir, "trials.jsonl"))}
  loaded, by_id = _mirrored(storage)
  assert len(loaded.trials) == len(by_id) == len(trials) >= 8  # no duplicate
  assert loaded.metric_names == ["auc"] and loaded.user_attrs["sfjax_owner"] == workdir
  for trial_id, t in trials.items():
    o = by_id[trial_id]
    assert o.params == space.optuna_params(t["config"]) and o.params
    assert o.state.name == {"done": "COMPLETE", "failed": "FAIL"}[t["status"]]
    assert o.values == [t["metrics"]["auc"]]
    assert o.user_attrs["flops"] == t["metrics"]["flops"] and o.user_attrs["budget"] == t["budget"]
    steps = round(4 * t["budget"])  # tiny_config: 4 steps per budget unit
    assert o.intermediate_values[steps] == t["metrics"]["auc"]
    if t["parent_trial_id"] is not None:  # a promotion: its parent's value at its budget
      parent = trials[t["parent_trial_id"]]
      assert o.intermediate_values[round(4 * parent["budget"])] == parent["metrics"]["auc"]
  assert any(t["parent_trial_id"] is not None for t in trials.values())


@pytest.mark.slow
def test_a_measured_latency_front_is_mirrored_selected_and_plotted(tmp_path, runner):
  storage = _storage(tmp_path, "journal")
  config = tiny_config("nsga2", num_trials=6, objectives="auc:max,latency_ms:min",
                       latency_batch_size=256, latency_repeats=3, optuna_storage=storage)
  config.space.families = "lr,fm,deepfm"
  summary = search_loop.run_search(config, str(tmp_path / "w"), SPACE, runner=runner)
  assert runner.costs.latency == LatencySettings("measured", 256, 3)
  trials = _read_jsonl(tmp_path / "w" / "trials.jsonl")
  done = [t for t in trials if t["status"] == "done"]
  # measured once per architecture: trials of one architecture report the same latency
  split = search_config.make_space(config, SPACE)
  by_arch = {}
  for t in done:
    arch = split_config(SPACE.runner_config(split.validate(t["config"])))[0]
    by_arch.setdefault(arch, set()).add(t["metrics"]["latency_ms"])
    assert t["metrics"]["latency_ms"] == runner.costs.latency_ms(arch) > 0
  assert all(len(v) == 1 for v in by_arch.values())
  loaded, by_id = _mirrored(storage, name="w")  # '' names the study after the workdir
  assert [d.name for d in loaded.directions] == ["MAXIMIZE", "MINIMIZE"]
  assert loaded.metric_names == ["auc", "latency_ms"]
  assert sorted(by_id) == [t["trial_id"] for t in trials]
  front = {t.user_attrs[optuna_mirror.TRIAL_ID_ATTR] for t in loaded.best_trials}
  assert front == set(summary["pareto_front"])
  ours = [t for t in done if t["trial_id"] in front]
  chosen = select_within_auc(ours, 0.01)
  best_auc = max(t["metrics"]["auc"] for t in ours)
  assert chosen["metrics"]["auc"] >= best_auc - 0.01 and chosen["metrics"]["latency_ms"] == min(
      t["metrics"]["latency_ms"] for t in done if t["metrics"]["auc"] >= best_auc - 0.01)
  fig = plots.plot_latency_front(trials, chosen=chosen["trial_id"], delta=0.01)
  assert f"{len(front)} on the front of {len(done)}" in fig.axes[0].get_title()
  plots.save_figure(fig, str(tmp_path / "front.png"))


def test_a_bad_storage_is_named_before_any_training(tmp_path, runner):
  config = tiny_config("random", optuna_storage="study.db")
  with pytest.raises(SearchConfigError, match="study.optuna_storage"):
    search_loop.run_search(config, str(tmp_path), SPACE, runner=runner)
  config = tiny_config("random", latency_source="guess")
  with pytest.raises(SearchConfigError, match="study.latency_source"):
    search_loop.run_search(config, str(tmp_path), SPACE, runner=runner)
