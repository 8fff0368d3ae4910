"""A search with `study.pruner`: pruned trials in the journal, trials.jsonl, the summary and
the Optuna mirror (marked PRUNED, with their intermediate values)."""

import pytest

from search_spaces.ctr import SEARCH_SPACE as SPACE
from sfjax.automl.algorithms import Objective
from sfjax.automl.algorithms.random_search import RandomSearch
from sfjax.cohorts import CohortRunner
from sfjax.ctr_search import search_config, search_loop, search_pruning
from sfjax.ctr_search.search_config import SearchConfigError
from tests.ctr_search.search_loop_test import SUMMARY_KEYS, read_jsonl, tiny_config

STEPS = 4  # tiny_config's steps per budget unit; a full trial is 4 units


def _config(num_trials=8, **pruner):
  c = tiny_config("random", num_trials=num_trials)
  c.study.cohort_width = "4"
  c.study.pruner.kind = "median"
  c.study.pruner.n_startup_trials = 2
  for key, value in pruner.items():
    setattr(c.study.pruner, key, value)
  return c


@pytest.fixture(scope="module")
def runner():
  return CohortRunner(search_config.make_task(tiny_config()), cohort_width=4)


@pytest.mark.slow  # ~60 s on 2 cores: a real 8-trial search
def test_pruned_trials_are_recorded_mirrored_and_summarised(tmp_path, runner):
  optuna = pytest.importorskip("optuna")
  config = _config()
  config.study.optuna_storage = str(tmp_path / "optuna.log")
  summary = search_loop.run_search(config, str(tmp_path / "w"), SPACE, runner=runner)
  assert set(summary) == SUMMARY_KEYS | {"num_pruned", "trial_steps_saved"}
  trials = read_jsonl(tmp_path / "w" / "trials.jsonl")
  assert len(trials) == summary["num_trials_done"] == 8
  pruned = [t for t in trials if t["status"] == "pruned"]
  assert summary["num_pruned"] == len(pruned) >= 1
  assert summary["trial_steps_saved"] == sum(16 - int(t["metrics"]["steps"]) for t in pruned) > 0

  def reports(t):
    return {int(k.split("/")[1]): v for k, v in t["metrics"].items() if k.startswith("auc/")}

  for t in trials:
    steps = int(t["metrics"]["steps"])
    assert sorted(reports(t)) == list(range(STEPS, steps + 1, STEPS))  # every eval point
    if t["status"] == "done":
      assert steps == 16 and reports(t)[16] == t["metrics"]["auc"]
    else:
      assert t["status"] == "pruned" and steps < 16
      assert t["reason"].startswith(f"pruned at step {steps}: best auc")
  # The journal told them pruned, each once.
  told = [e for e in read_jsonl(tmp_path / "w" / "journal.jsonl") if e.get("event") == "tell"]
  assert sorted(e["trial_id"] for e in told if e["status"] == "pruned") == sorted(
      t["trial_id"] for t in pruned)
  # The Optuna mirror: PRUNED, with the intermediate values the trial reported.
  storage = optuna.storages.JournalStorage(
      optuna.storages.journal.JournalFileBackend(str(tmp_path / "optuna.log")))
  study = optuna.load_study(study_name="w", storage=storage)
  by_id = {t.user_attrs["sfjax_trial_id"]: t for t in study.trials}
  for t in trials:
    mirrored = by_id[t["trial_id"]]
    assert mirrored.state.name == ("PRUNED" if t["status"] == "pruned" else "COMPLETE")
    assert mirrored.intermediate_values == pytest.approx(reports(t))


def test_pruner_settings_are_checked_before_any_trial_runs(tmp_path, runner):
  task_steps = search_config.make_task(tiny_config()).steps_for_budget
  algorithm = RandomSearch(seed=0)
  objective = Objective("auc", "maximize")
  assert search_pruning.pruner_of(tiny_config(), objective, task_steps, algorithm,
                                  "rounds") is None  # kind 'none' by default
  spec = search_pruning.pruner_of(_config(eval_every=2.0), objective, task_steps, algorithm,
                                  "rounds")
  assert (spec.percentile, spec.n_startup_trials, spec.eval_every) == (50.0, 2, 2 * STEPS)
  bad = _config(kind="mean")
  with pytest.raises(SearchConfigError, match=r"study\.pruner\.kind"):
    search_pruning.pruner_of(bad, objective, task_steps, algorithm, "rounds")
  dask = _config()
  dask.study.executor = "dask"
  with pytest.raises(SearchConfigError, match=r"study\.executor"):
    search_pruning.pruner_of(dask, objective, task_steps, algorithm, "rounds")
  with pytest.raises(SearchConfigError, match=r"study\.pruner"):
    search_loop.run_search(bad, str(tmp_path), SPACE, runner=runner)
  assert not (tmp_path / "journal.jsonl").exists()
