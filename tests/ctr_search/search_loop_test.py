"""Tests for the search driver (sfjax/ctr_search/search_loop.py), its report and state files.

The driver runs the real `CohortRunner` on a tiny synthetic task; one runner is
shared by the module so compiled trial programs are reused across studies.
"""

import json
import math
import os

import jax
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from experiments.configs import search_ctr
from search_spaces.ctr import SEARCH_SPACE as SPACE
from sfjax.automl.algorithms import Suggestion, TrialStatus
from sfjax.automl.pareto import pareto_front
from sfjax.automl.space import Config
from sfjax.automl.study import TrialRecord
from sfjax.cohorts import trial_states
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.core import WorkdirLockedError, tensorboard, workdir_lock
from sfjax.ctr_pipeline import train_steps
from sfjax.ctr_search import search_config, search_loop, search_report, search_round
from sfjax.data import parse_table_settings
from tests.cohorts.conftest import CallRecorder

SUMMARY_KEYS = {"best_trial_id", "best_config", "best_metrics", "num_trials_done", "num_failed",
                "default_metrics", "beats_default", "pareto_front", "mean_cohort_width",
                "lane_utilization"}


def tiny_config(algorithm="random", num_trials=3, **study):
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale = 8192, 2048, 0.0001
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 1024, 1024
  c.task.steps_per_budget_unit = 4
  c.space.families = "lr,fm"
  c.study.algorithm, c.study.num_trials = algorithm, num_trials
  c.study.cohort_width = "1"
  c.study.min_budget, c.study.max_budget = 1.0, 4.0  # the smoke variant's eta is 2
  st = c.study
  st.tpe.n_startup_trials = st.gp.n_startup_trials = 2
  st.bohb.n_startup_trials = st.motpe.n_startup_trials = 2
  st.evolution.population_size = st.evolution.sample_size = 2
  st.pbt.population_size = st.nsga2.population_size = 2
  c.study.leaderboard_size = 3
  for key, value in study.items():  # an algorithm's own setting goes to its block
    block = st[algorithm] if algorithm in st and key in st[algorithm] else st
    setattr(block, key, value)
  return c


class RecordingRunner(CohortRunner):
  """The real runner, recording each call's arguments; fails archs in `fail_models`."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = []
    self.fail_models = ()
    self.on_run = None  # called at the start of each run (a test's probe)

  def run(self, arch, hparams, seeds, start_steps, end_steps, init_states, ragged=None,
          merge_optimizers=False):
    if self.on_run is not None:
      self.on_run()
    self.calls.append(dict(arch=arch, seeds=list(seeds), start_steps=list(start_steps),
                           end_steps=end_steps, init_steps=[
                               None if s is None else int(s.step) for s in init_states]))
    if arch.model_name in self.fail_models:
      raise RuntimeError(f"injected failure for {arch.model_name}")
    return super().run(arch, hparams, seeds, start_steps, end_steps, init_states, ragged,
                       merge_optimizers)


@pytest.fixture(scope="module")
def runner():
  return RecordingRunner(search_config.make_task(tiny_config()), cohort_width=1)


@pytest.fixture(autouse=True)
def _reset(runner):
  runner.calls.clear()
  runner.fail_models = ()
  runner.on_run = None


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("algorithm", ["random", "grid", "qmc", "evolution", "tpe", "gp", "asha",
                                       "hyperband", "bohb"])
def test_each_algorithm_exports_trials_and_best(tmp_path, runner, algorithm):
  summary = search_loop.run_search(tiny_config(algorithm), str(tmp_path), SPACE, runner=runner)
  assert set(summary) == SUMMARY_KEYS
  assert summary["num_trials_done"] == 3 and summary["num_failed"] == 0
  # trials of one architecture share one runner call (calls[0] trains the default config)
  widths = [len(c["seeds"]) for c in runner.calls[1:]]
  assert summary["mean_cohort_width"] == pytest.approx(sum(widths) / len(widths))
  trials = read_jsonl(tmp_path / "trials.jsonl")
  assert [t["trial_id"] for t in trials] == list(range(3))
  for t in trials:
    assert {"trial_id", "config", "metrics", "status"} <= set(t)
    assert t["status"] == "done" and t["config"]["model.name"] in ("lr", "fm")
    assert 0.0 < t["metrics"]["auc"] < 1.0 and t["metrics"]["steps"] > 0
  best = json.load(open(tmp_path / "best.json"))
  assert best["best"]["trial_id"] == summary["best_trial_id"]
  top_budget = max((t["budget"] for t in trials if t["budget"] is not None), default=None)
  assert summary["best_metrics"]["auc"] == max(
      t["metrics"]["auc"] for t in trials if t["budget"] == top_budget)
  # One selection split (issue #26): selection and the comparison with the default on 'auc'.
  best_auc, default_auc = summary["best_metrics"]["auc"], summary["default_metrics"]["auc"]
  assert math.isfinite(best_auc) and math.isfinite(default_auc)
  assert summary["beats_default"] == (best_auc > default_auc)
  cached = json.load(open(tmp_path / "default.json"))
  assert cached["config"]["model.name"] == "deepfm" and cached["metrics"]["steps"] == 16


def test_asha_promotions_resume_from_the_parents_saved_state(tmp_path, runner):
  summary = search_loop.run_search(tiny_config("asha", num_trials=8), str(tmp_path), SPACE,
                                   runner=runner)
  assert summary["num_trials_done"] == 8
  trials = {t["trial_id"]: t for t in read_jsonl(tmp_path / "trials.jsonl")}
  promoted = [t for t in trials.values() if t["resume_from"] is not None]
  assert promoted, "ASHA promoted nothing in 8 trials"
  calls = [c for c in runner.calls if c["arch"].model_name != "deepfm"]  # drop the default run
  for t in promoted:
    parent = trials[t["resume_from"]]
    call = next(c for c in calls if search_round.trial_seed(0, t["trial_id"]) in c["seeds"])
    i = call["seeds"].index(search_round.trial_seed(0, t["trial_id"]))
    assert call["start_steps"][i] == parent["metrics"]["steps"] > 0
    assert call["init_steps"][i] == parent["metrics"]["steps"]
    assert t["metrics"]["steps"] == 4 * t["budget"] > parent["metrics"]["steps"]
    assert not os.path.exists(tmp_path / "states" / f"{parent['trial_id']}.npz")
  promoted_ids = {p["resume_from"] for p in promoted}
  for t in trials.values():  # kept: may still be promoted (below the full budget of 4)
    kept = os.path.exists(tmp_path / "states" / f"{t['trial_id']}.npz")
    assert kept == (t["budget"] < 4 and t["trial_id"] not in promoted_ids), t


def test_pbt_population_explores_one_architecture(tmp_path, runner):
  config = tiny_config("pbt", num_trials=4, population_size=4, pbt_interval=1.0, pbt_model="fm")
  summary = search_loop.run_search(config, str(tmp_path), SPACE, runner=runner)
  assert summary["num_trials_done"] == 4
  trials = read_jsonl(tmp_path / "trials.jsonl")
  assert {t["config"]["model.name"] for t in trials} == {"fm"}
  assert {t["config"]["model.embed_dim"] for t in trials} == {16}  # the default config's
  explored = 0
  for t in trials:
    assert t["status"] == "done" and t["metrics"]["steps"] == 16  # 4 rounds of 4 steps
    initial, final = t["config"]["optimizer.learning_rate"], t["metrics"]["final.optimizer.learning_rate"]
    explored += not np.isclose(initial, final, rtol=1e-5)
  assert explored >= 1  # 3 exploit/explore steps, one member each
  for t in trials:  # the held-out half of a member's last round
    assert math.isfinite(t["metrics"]["test_auc"]) and 0.0 < t["metrics"]["test_auc"] < 1.0
  best = max(trials, key=lambda t: t["metrics"]["auc"])  # selected on the valid half
  assert summary["best_trial_id"] == best["trial_id"]
  assert summary["best_metrics"]["test_auc"] == best["metrics"]["test_auc"]
  assert summary["beats_default"] == (best["metrics"]["auc"] > summary["default_metrics"]["auc"])


def test_resume_runs_only_new_trials(tmp_path, runner):
  search_loop.run_search(tiny_config("evolution", num_trials=2), str(tmp_path), SPACE, runner=runner)
  runner.calls.clear()
  summary = search_loop.run_search(tiny_config("evolution", num_trials=4), str(tmp_path), SPACE,
                                   runner=runner)
  assert summary["num_trials_done"] == 4
  seeds = [seed for c in runner.calls for seed in c["seeds"]]
  assert sorted(seeds) == [search_round.trial_seed(0, i) for i in (2, 3)]  # no default rerun either
  assert [t["trial_id"] for t in read_jsonl(tmp_path / "trials.jsonl")] == [0, 1, 2, 3]
  # TensorBoard: rebuilt from the journal on resume, every done trial once
  done = [t["trial_id"] for t in read_jsonl(tmp_path / "trials.jsonl") if t["status"] == "done"]
  assert [s for s, _ in tensorboard.read_scalars(str(tmp_path))["trial/auc"]] == done


def test_rerun_with_different_settings_is_an_error(tmp_path, runner):
  search_loop.run_search(tiny_config(num_trials=1), str(tmp_path), SPACE, runner=runner)
  changed = tiny_config(num_trials=1)
  changed.task.batch_size = 32
  with pytest.raises(search_loop.SearchConfigError, match="task.batch_size: stored 64, given 32"):
    search_loop.run_search(changed, str(tmp_path), SPACE, runner=runner)
  with pytest.raises(search_loop.SearchConfigError,
                     match="study.algorithm: stored 'random', given 'tpe'"):
    search_loop.run_search(tiny_config("tpe", num_trials=1), str(tmp_path), SPACE, runner=runner)


def test_the_search_owns_its_workdir_while_it_runs(tmp_path, runner):
  workdir = str(tmp_path)
  with workdir_lock.hold_workdir(workdir, "the test"):  # e.g. another search on the workdir
    with pytest.raises(WorkdirLockedError,
                       match=f"^{workdir} is in use by pid {os.getpid()} on "):
      search_loop.run_search(tiny_config(num_trials=1), workdir, SPACE, runner=runner)
  assert os.listdir(workdir) == [workdir_lock.LOCK_FILE]  # nothing of a study was written
  refused = []

  def second_owner():  # while the search trains, nobody else may take the workdir
    with pytest.raises(WorkdirLockedError, match=f"in use by pid {os.getpid()} on "):
      workdir_lock.acquire(workdir, "a second owner")
    refused.append(True)

  runner.on_run = second_owner
  summary = search_loop.run_search(tiny_config(num_trials=1), workdir, SPACE, runner=runner)
  assert summary["num_trials_done"] == 1 and refused
  workdir_lock.acquire(workdir, "after the search").release()  # released at the end


def test_failed_cohort_is_told_failed_and_the_search_goes_on(tmp_path, runner):
  runner.fail_models = ("lr",)
  summary = search_loop.run_search(tiny_config("random", num_trials=6), str(tmp_path), SPACE,
                                   runner=runner)
  trials = read_jsonl(tmp_path / "trials.jsonl")
  failed = [t for t in trials if t["status"] == "failed"]
  assert failed and all(t["config"]["model.name"] == "lr" for t in failed)
  assert all("injected failure" in t["reason"] for t in failed)
  assert summary["num_failed"] == len(failed) and summary["num_trials_done"] == 6
  assert summary["best_config"]["model.name"] == "fm"


def test_params_quota_rejects_before_training(tmp_path, runner):
  rows = runner.spec.total_rows
  summary = search_loop.run_search(tiny_config("random", num_trials=3, max_params=3 * rows),
                                   str(tmp_path), SPACE, runner=runner)
  trials = read_jsonl(tmp_path / "trials.jsonl")
  rejected = [t for t in trials if t["status"] == "rejected"]
  done = [t for t in trials if t["status"] == "done"]
  assert rejected and all(t["config"]["model.name"] == "fm" for t in rejected)
  assert all("quota" in t["reason"] for t in rejected)
  assert len(done) == 3 and all(t["config"]["model.name"] == "lr" for t in done)
  assert summary["num_trials_done"] == 3
  # deepfm: the default config, a baseline outside the search and its quota.
  assert {c["arch"].model_name for c in runner.calls} == {"lr", "deepfm"}


def test_config_errors_name_the_field():
  assert search_config.parse_cohort_width("auto") == "auto"
  assert search_config.parse_cohort_width("4") == 4
  for bad in ("x", "0", "-2", "2.5"):
    with pytest.raises(search_loop.SearchConfigError, match="study.cohort_width"):
      search_config.parse_cohort_width(bad)
  with pytest.raises(search_loop.SearchConfigError, match="study.algorithm"):
    search_config.make_algorithm(tiny_config("bayes"))
  c = tiny_config()
  c.space.mlp_widths = "32,abc"
  with pytest.raises(search_loop.SearchConfigError, match="space.mlp_widths"):
    search_config.make_space(c, SPACE)
  with pytest.raises(search_loop.SearchConfigError, match=r"study\.pbt\.pbt_interval"):
    search_config.check_study_settings(tiny_config("pbt", pbt_interval=3.0))
  with pytest.raises(search_loop.SearchConfigError, match="study.pbt_model"):
    search_config.make_space(tiny_config("pbt", pbt_model="transformer"), SPACE)


def _record(trial_id, auc, status=TrialStatus.DONE, name="fm", test_auc=None):
  s = Suggestion(trial_id, Config({"model.name": name, "model.embed_dim": 8,
                                   "embedding.learning_rate": 0.01}), budget=2, rung=1)
  metrics = {} if auc is None else {"auc": auc, "steps": 8.0}
  if test_auc is not None:
    metrics["test_auc"] = test_auc
  return TrialRecord(s, status, metrics, None, 0.0, 0.0, 1.0, 1.0, 1)


class _FakeStudy:
  """What `summarize` reads of a Study: `trials()`, `best()` and `directions`."""

  directions = None

  def __init__(self, records, best):
    self._records, self._best = records, best

  def trials(self):
    return list(self._records)

  def best(self):
    return self._best


def _summarize(best_auc, best_test_auc, default):
  best = _record(1, best_auc, test_auc=best_test_auc)
  records = [_record(0, 0.5, test_auc=0.5), best, _record(2, None, TrialStatus.FAILED)]
  return search_loop._summarize(_FakeStudy(records, best), default)


def test_summary_compares_with_the_default_on_the_selection_split():
  summary = _summarize(0.70, 0.66, {"auc": 0.65, "test_auc": 0.64})
  assert summary["beats_default"] is True
  assert summary["best_trial_id"] == 1 and summary["best_metrics"]["test_auc"] == 0.66
  assert summary["num_trials_done"] == 3 and summary["num_failed"] == 1
  # One selection split (issue #26): the valid half ('auc') decides, the test half does not.
  assert _summarize(0.70, 0.63, {"auc": 0.65, "test_auc": 0.64})["beats_default"] is True
  assert _summarize(0.60, 0.66, {"auc": 0.65, "test_auc": 0.64})["beats_default"] is False
  assert _summarize(0.65, 0.70, {"auc": 0.65, "test_auc": 0.64})["beats_default"] is False  # a tie


@pytest.mark.parametrize("default", [
    {},  # never measured
    {"test_auc": 0.5},  # no valid half
    {"auc": float("nan"), "test_auc": float("nan")},  # the default failed
    {"auc": float("inf"), "test_auc": 0.5},
])
def test_a_default_without_a_finite_valid_auc_is_never_beaten(default):
  summary = _summarize(0.9, 0.9, default)
  assert summary["beats_default"] is False
  assert summary["default_metrics"].keys() == default.keys()


def test_a_best_without_auc_or_no_best_never_beats_the_default():
  assert _summarize(None, 0.9, {"auc": 0.5, "test_auc": 0.5})["beats_default"] is False
  failed = _record(0, None, TrialStatus.FAILED)
  summary = search_loop._summarize(_FakeStudy([failed], None), {"auc": 0.5, "test_auc": 0.5})
  assert summary["beats_default"] is False and summary["best_trial_id"] is None
  assert summary["best_config"] is None and summary["best_metrics"] is None


def test_leaderboard_ranks_by_auc_failed_last():
  trials = [_record(0, 0.61), _record(1, None, TrialStatus.FAILED), _record(2, 0.72),
            _record(3, 0.65), _record(4, None, TrialStatus.RUNNING)]
  assert [t.trial_id for t in search_report.ranked(trials)] == [2, 3, 0, 1]
  text = search_report.leaderboard(trials, 2, 0.7, 10, 75.0)
  lines = text.splitlines()
  assert lines[0].startswith("[search] 4/10 trials (1 failed, 0 rejected) in 1m15s")
  assert "best auc 0.72000 (trial 2)" in lines[0] and "default auc 0.70000" in lines[0]
  assert len(lines) == 4 and lines[1].split()[:2] == ["rank", "trial"]
  assert lines[2].split()[:2] == ["1", "2"] and lines[3].split()[:2] == ["2", "3"]
  assert search_report.leaderboard(trials, 0, None, 10, 1.0).count("\n") == 1
  pbt_member = _record(5, 0.8)
  pbt_member.metrics["final.embedding.learning_rate"] = 0.0123
  assert "0.0123" in search_report.leaderboard([pbt_member], 1, None, 1, 1.0).splitlines()[2]


def test_state_files_round_trip_and_reject_other_archs(tmp_path, runner):
  arch, hparams = split_config({"model.name": "fm", "model.embed_dim": 4})
  result = runner.run(arch, [hparams], [1], [0], [4], [None])[0]
  path = trial_states.state_path(str(tmp_path), 7)
  trial_states.save_state(path, result.state)
  assert os.listdir(tmp_path) == ["7.npz"]  # no temporary file left behind
  loaded = trial_states.load_state(path, runner.state_template(arch))
  assert jax.tree.structure(loaded) == jax.tree.structure(result.state)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(result.state), strict=True):
    np.testing.assert_array_equal(a, b)
  other, _ = split_config({"model.name": "fm", "model.embed_dim": 8})
  with pytest.raises(trial_states.StateFileError, match="7.npz"):
    trial_states.load_state(path, runner.state_template(other))
  with open(path, "wb") as f:
    f.write(b"torn")
  with pytest.raises(trial_states.StateFileError, match="unreadable"):
    trial_states.load_state(path, runner.state_template(arch))
  assert math.isfinite(result.metrics["auc"])


def test_multi_objective_search_with_a_flops_quota(tmp_path, runner, capsys):
  # lr costs ~400 FLOPs per example of this task's eval forward, fm ~900: the quota keeps lr.
  config = tiny_config("nsga2", num_trials=3, objectives="auc:max,flops:min,latency_ms:min",
                       max_flops=600.0)
  summary = search_loop.run_search(config, str(tmp_path), SPACE, runner=runner)
  trials = read_jsonl(tmp_path / "trials.jsonl")
  done = [t for t in trials if t["status"] == "done"]
  rejected = [t for t in trials if t["status"] == "rejected"]
  assert len(done) == 3 and all(t["config"]["model.name"] == "lr" for t in done)
  assert all(t["metrics"]["flops"] <= 600 and t["metrics"]["latency_ms"] > 0 for t in done)
  assert rejected and all("flops <= 600.0" in t["reason"] and t["metrics"]["flops"] > 600
                          for t in rejected)
  best = json.load(open(tmp_path / "best.json"))
  directions = {"auc": "maximize", "flops": "minimize", "latency_ms": "minimize"}
  assert best["directions"] == directions
  points = [[t["metrics"][m] for m in directions] for t in done]
  front = [done[i]["trial_id"] for i in pareto_front(points, list(directions.values()))]
  assert best["pareto_fronts"] == [{"budget": None, "trial_ids": front}]
  assert summary["pareto_front"] == best["pareto_front"] == front
  assert summary["best_metrics"]["auc"] == max(t["metrics"]["auc"] for t in done)
  assert "[pareto]" in capsys.readouterr().err


def test_architecture_aware_rounds_fill_cohorts_on_the_joint_space(tmp_path):
  # The named families' joint space: a round of 8 is the algorithm's own 8 proposals,
  # fill on or off (issue #26: never resampled inside the first trial's bucket); fill on
  # merges them into fewer programs (row optimizers share one), each trial as trained alone.
  summaries, trials = {}, {}
  for fill in (True, False):
    c = tiny_config("random", num_trials=8, cohort_width="8", fill_cohorts=fill)
    c.space.families = "lr,fm,deepfm,wide_deep,dcnv2,dlrm"  # the default before issue #26
    c.space.mlp_widths = "8,16"
    c.study.max_budget = 1.0
    wide = CohortRunner(search_config.make_task(c), cohort_width=8)
    workdir = tmp_path / str(fill)
    summaries[fill] = search_loop.run_search(c, str(workdir), SPACE, runner=wide)
    trials[fill] = read_jsonl(os.path.join(workdir, "trials.jsonl"))
  assert summaries[True]["num_trials_done"] == 8 and summaries[True]["num_failed"] == 0
  assert [t["config"] for t in trials[True]] == [t["config"] for t in trials[False]]
  for on, off in zip(trials[True], trials[False], strict=True):
    # Float tolerance (another padded superset sums in another order): logloss is smooth;
    # AUC moves in steps of one pair flip (~6e-6 here).
    assert on["metrics"]["logloss"] == pytest.approx(off["metrics"]["logloss"], rel=1e-4)
    assert on["metrics"]["auc"] == pytest.approx(off["metrics"]["auc"], abs=5e-5)
  archs = [split_config(SPACE.runner_config(Config(t["config"])))[0] for t in trials[True]]
  merged = len(search_round.form_cohorts(archs, merge_optimizers=True))
  assert summaries[True]["mean_cohort_width"] == 8 / merged
  assert summaries[True]["mean_cohort_width"] >= summaries[False]["mean_cohort_width"]


def test_auto_width_reports_the_programs_that_ran(tmp_path):
  # A round of 7 free lr proposals forms a merged cohort of 6 (row optimizers per lane) and
  # a lone rowwise_adagrad trial (its embed_dim stays in its bucket); 'auto' with one
  # candidate measures 4 and runs the 6 as a chunk of 4 and one of 2, each over the full
  # budget's 16 steps; the lone trial runs on the width-1 runner. (Treating 'auto' as
  # unbounded once reported one program of 7 at full utilisation.)
  c = tiny_config("random", num_trials=7, cohort_width="auto", ask_batch=7)
  c.space.families = "lr"
  runner = CallRecorder(search_config.make_task(c), cohort_width="auto", width_candidates=(4,))
  summary = search_loop.run_search(c, str(tmp_path), SPACE, runner=runner)
  assert summary["num_trials_done"] == 7 and summary["num_failed"] == 0
  trials = read_jsonl(tmp_path / "trials.jsonl")
  assert sum(t["config"]["embedding.optimizer"] == "rowwise_adagrad" for t in trials) == 1
  calls = [(lanes, num_steps) for lanes, num_steps, _ in runner.calls]
  assert calls == [(4, 16), (2, 16)]  # the default config and the lone trial ran on width 1
  assert summary["mean_cohort_width"] == len(trials) / (len(calls) + 1) == 7 / 3
  assert summary["lane_utilization"] == 1.0  # chunks padded to powers of two: none here


@pytest.mark.slow  # ~30 s
def test_search_on_bags_and_sequences_runs_cohorts(tmp_path):
  """A search on the planted multi-hot smoke data (issue #22: bags, a long sqrtn bag and a
  history sharing the item table), the poolings of two bags searched, trains cohorts of two
  trials end to end."""
  c = tiny_config("random", num_trials=4)
  c.task.data = ctr_config.get_config("multihot_smoke").data
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 128, 1024, 1024
  c.space.families, c.space.mlp_widths = "fm,deepfm", "16,400"
  c.space.poolings = "bag1:mean,long0:sqrtn"  # each bag's pooling searched (traced per trial)
  c.study.cohort_width, c.study.max_budget = "2", 2.0
  summary = search_loop.run_search(c, str(tmp_path), SPACE)
  assert summary["num_trials_done"] == 4 and summary["num_failed"] == 0
  assert summary["mean_cohort_width"] > 1
  assert math.isfinite(summary["best_metrics"]["auc"])
  assert summary["best_config"]["features.long0.pooling"] in ("sum", "mean", "sqrtn")
  assert 0.5 < summary["default_metrics"]["test_auc"] < 1  # the default deepfm learns the bags


@pytest.mark.parametrize("key, text, match", [
    ("table_dims", "nope:4", r"space: tables\.nope\.dim: 'nope' is not a table of the data set "
                             r"\(its tables: user, item, ctx0, ctx1, bag0, bag1, long0\)"),
    ("poolings", "item:sum", r"space: features\.item\.pooling: 'item' is not a multi_hot "
                             r"feature of the data set \(its bags: bag0, bag1, long0\)")])
def test_a_space_key_the_data_lacks_fails_before_the_study_starts(tmp_path, key, text, match):
  """A searched table or bag the data set does not have is one error naming it, raised
  before the workdir records the study (a corrected rerun on the same workdir starts)."""
  c = tiny_config("random", num_trials=2)
  c.task.data = ctr_config.get_config("multihot_smoke").data
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 128, 1024, 1024
  c.space.families, c.space.mlp_widths = "deepfm", "16"
  c.space[key] = text
  with pytest.raises(search_config.SearchConfigError, match=match):
    search_loop.run_search(c, str(tmp_path), SPACE)
  assert not (tmp_path / "search.json").exists() and not (tmp_path / "trials.jsonl").exists()


@pytest.mark.slow  # ~15 s
def test_a_search_over_tables_with_their_own_settings_trains_every_trial(tmp_path):
  """Issue #22: `data.tables` row optimizers, rates and init stddevs reach every trial
  program of a joint search (shape buckets of several embed_dims, cohorts of mixed row
  optimizers), and the best trial's trainer config keeps them."""
  c = tiny_config("random", num_trials=8, ask_batch=8)
  c.task.data = ctr_config.get_config("multihot_smoke").data
  c.task.data.tables = ("item:learning_rate=0.3; user:init_stddev=0.2,learning_rate=0.01,"
                        "optimizer=rowwise_adagrad; bag0:optimizer=adam")
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 128, 1024, 1024
  c.space.families, c.space.mlp_widths = "fm,deepfm", "16"
  c.study.cohort_width, c.study.max_budget = "8", 2.0
  runner = CallRecorder(search_config.make_task(c), cohort_width=8)
  summary = search_loop.run_search(c, str(tmp_path), SPACE, runner=runner)
  assert summary["num_trials_done"] == 8 and summary["num_failed"] == 0
  trials = read_jsonl(tmp_path / "trials.jsonl")
  assert all(math.isfinite(t["metrics"]["auc"]) for t in trials)
  assert len({t["config"]["embedding.optimizer"] for t in trials}) > 1
  assert max(lanes for lanes, _, _ in runner.calls) > 1  # trials shared programs
  recipe = ctr_config.get_config("multihot_smoke")
  recipe.data.tables = c.task.data.tables
  arch, hparams = split_config(SPACE.runner_config(summary["best_config"]))
  trainer = train_steps.trainer_config(recipe, arch, hparams)
  assert parse_table_settings(trainer.data.tables) == {
      "item": {"learning_rate": 0.3}, "bag0": {"optimizer": "adam"},
      "user": {"init_stddev": 0.2, "learning_rate": 0.01, "optimizer": "rowwise_adagrad"}}


class DimsRecorder(CohortRunner):
  """The real runner, recording each program call's per-lane `tables.item.dim`."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.item_dims = []

  def run_stacked(self, arch, hparams, seeds, start, end, init_states=None, dense_masks=None):
    if "tables.item.dim" in hparams:
      self.item_dims.append(sorted(np.asarray(hparams["tables.item.dim"]).tolist()))
    return super().run_stacked(arch, hparams, seeds, start, end, init_states, dense_masks)


@pytest.mark.slow  # ~60 s
def test_a_search_over_table_dims_shares_cohorts_and_trains_the_winner(tmp_path):
  """Issue #22, Deliver 7: the embedding dims of the item and user tables searched beside
  the model (`space.table_dims`): trials whose dims differ share a program (the dims are
  traced per lane), every trial trains, and the best trial's trainer config reads its
  tables through those dims (`data.tables`), the way the fully-train step reproduces it."""
  c = tiny_config("random", num_trials=8, ask_batch=8)
  c.task.data = ctr_config.get_config("multihot_smoke").data
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 128, 1024, 1024
  c.space.families, c.space.mlp_widths = "deepfm", "16"
  c.space.table_dims = "item:2|4,user:2"
  c.study.cohort_width, c.study.max_budget = "8", 2.0
  runner = DimsRecorder(search_config.make_task(c), cohort_width=8)
  summary = search_loop.run_search(c, str(tmp_path), SPACE, runner=runner)
  assert summary["num_trials_done"] == 8 and summary["num_failed"] == 0
  trials = read_jsonl(tmp_path / "trials.jsonl")
  assert {t["config"]["tables.item.dim"] for t in trials} <= {0, 2, 4}
  assert all(t["config"]["model.embed_dim"] >= 4 for t in trials)  # wide enough for item's 4
  assert any(len(set(dims)) > 1 for dims in runner.item_dims), runner.item_dims
  assert all(math.isfinite(t["metrics"]["auc"]) for t in trials)
  best = summary["best_config"]
  arch, hparams = split_config(SPACE.runner_config(best))
  trainer = train_steps.trainer_config(ctr_config.get_config("multihot_smoke"), arch, hparams)
  want = {"item": {"dim": best["tables.item.dim"]}, "user": {"dim": best["tables.user.dim"]}}
  assert parse_table_settings(trainer.data.tables) == want


@pytest.mark.slow  # ~40 s
def test_a_search_with_the_din_family_trains_din_cohorts(tmp_path):
  """DIN as a searchable family (issue #22), named beside deepfm: its trials attend over
  the history sequence of the multi-hot smoke data, in cohorts, end to end."""
  c = tiny_config("random", num_trials=6)
  c.task.data = ctr_config.get_config("multihot_smoke").data
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 128, 1024, 1024
  c.space.families, c.space.mlp_widths = "deepfm,din", "16"
  c.study.cohort_width, c.study.max_budget = "2", 2.0
  summary = search_loop.run_search(c, str(tmp_path), SPACE)
  assert summary["num_trials_done"] == 6 and summary["num_failed"] == 0
  trials = read_jsonl(tmp_path / "trials.jsonl")
  din = [t for t in trials if t["config"]["model.name"] == "din"]
  assert din and all({"model.din_attention.width", "model.din_pooling"} <= set(t["config"])
                    for t in din)
  # 8 steps at a random learning rate: a trial may still score near chance (one did at
  # 0.48 once the space searched din_pooling), so every trial must end finite and one must learn.
  assert all(0 < t["metrics"]["auc"] < 1 for t in din)
  assert max(t["metrics"]["auc"] for t in din) > 0.55
