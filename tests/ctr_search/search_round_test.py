"""One round of a cohort search (`sfjax/ctr_search/search_round.py`): cohorts formed from
the round's own suggestions, jobs with their resume points, results told (and states kept
for promotions) in order."""

import logging
import math
import os

import numpy as np
import pytest

from sfjax.automl.algorithms import Suggestion, TrialStatus
from sfjax.automl.space import Config
from sfjax.cohorts import trial_states
from sfjax.cohorts.arch import split_config
from sfjax.cohorts.cohort_runner import CohortRunner
from sfjax.cohorts.trial_result import CohortTrialResult
from sfjax.ctr_search import search_config, search_loop, search_round
from tests.ctr_search.search_loop_test import tiny_config


@pytest.fixture(scope="module")
def runner():
  return CohortRunner(search_config.make_task(tiny_config()), cohort_width=1)


class _TellRecorder:
  """Records `study.tell` calls (the searcher would refuse a DONE trial without 'auc')."""

  objective = search_loop.OBJECTIVE

  def __init__(self):
    self.told = []

  def tell(self, trial_id, metrics, status, **kwargs):
    assert status != TrialStatus.DONE or "auc" in metrics
    self.told.append((trial_id, dict(metrics), status, kwargs.get("reason")))


def _split(config):
  return split_config(dict(config))


def test_trial_seeds_differ_per_trial_and_study_and_fit_int32():
  seeds = {search_round.trial_seed(base, t) for base in (0, 1, 7) for t in range(-1, 50)}
  assert len(seeds) == 3 * 51 and all(0 <= s < 2**31 - 1 for s in seeds)
  assert search_round.trial_seed(0, 4) == 5  # (0 * 1_000_003 + 4 + 1): stable across versions


def test_cohorts_group_a_rounds_own_trials_by_bucket_in_first_seen_order():
  archs = [split_config({"model.name": name, "model.embed_dim": 8, "model.mlp.width": width,
                         "embedding.optimizer": opt})[0]
           for name, width, opt in [("deepfm", 16, "adagrad"), ("fm", 16, "adagrad"),
                                    ("deepfm", 32, "adagrad"), ("deepfm", 16, "adam"),
                                    ("fm", 16, "adam")]]
  # widths share a bucket; a row optimizer is part of the key unless merged
  assert search_round.form_cohorts(archs, merge_optimizers=False) == [[0, 2], [1], [3], [4]]
  assert search_round.form_cohorts(archs, merge_optimizers=True) == [[0, 2, 3], [1, 4]]
  assert search_round.form_cohorts([], merge_optimizers=True) == []


def test_jobs_fail_unbuildable_configs_and_resume_promotions(tmp_path, runner):
  study = _TellRecorder()
  arch_config = {"model.name": "fm", "model.embed_dim": 4}
  batch = [Suggestion(1, Config(arch_config), budget=1.0),
           Suggestion(2, Config({"model.name": "no_such_model"})),
           Suggestion(3, Config(arch_config), budget=None)]
  pairs = search_round.batch_jobs(study, runner, batch, str(tmp_path), 0, 12, _split, False)
  assert [(t, s) for t, _, s, _ in study.told] == [(2, TrialStatus.FAILED)]
  assert study.told[0][3].startswith("bad config: ")
  ((job, members),) = pairs  # trials 1 and 3: one architecture, one job
  assert job.trial_ids == [1, 3] and [m[0].trial_id for m in members] == [1, 3]
  assert job.seeds == [search_round.trial_seed(0, 1), search_round.trial_seed(0, 3)]
  assert job.start_steps == [0, 0] and job.init_states == [None, None]
  # budget 1 -> the task's steps for it; no budget -> the full max_steps
  assert job.end_steps == [runner.task.steps_for_budget(1.0), 12]
  # a promotion starts from its parent's saved state, at the step it reached
  arch, _ = split_config(arch_config)
  state = runner.run(arch, [{}], [7], [0], [2], [None])[0].state
  trial_states.save_state(trial_states.state_path(search_round.states_dir_of(str(tmp_path)), 1),
                          state)
  promoted = Suggestion(9, Config(arch_config), budget=2.0, rung=1, parent_trial_id=1,
                        resume_from=1)
  ((job, _),) = search_round.batch_jobs(study, runner, [promoted], str(tmp_path), 0, 12, _split,
                                        False)
  assert job.start_steps == [2] and int(job.init_states[0].step) == 2
  assert job.end_steps == [runner.task.steps_for_budget(2.0)]


def test_missing_parent_state_trains_from_scratch_and_logs(tmp_path, runner, caplog):
  arch, _ = split_config({"model.name": "fm", "model.embed_dim": 4})
  s = Suggestion(5, Config({"model.name": "fm"}), budget=2, rung=1, parent_trial_id=3,
                 resume_from=3)
  with caplog.at_level(logging.WARNING):
    start, state = search_round.resume_point(runner, arch, s, str(tmp_path))
  assert (start, state) == (0, None)
  assert "from scratch" in caplog.text and "trial 3" in caplog.text


def test_trial_without_finite_auc_is_told_failed_and_keeps_no_state(tmp_path):
  # e.g. the valid half of the eval rows holds one class only: AUC is NaN for a live trial.
  study = _TellRecorder()
  s = Suggestion(5, Config({"model.name": "fm"}))
  result = CohortTrialResult({"auc": math.nan, "steps": 3.0}, TrialStatus.DONE,
                             {"leaf": np.zeros(2)}, None)
  search_round.record_result(study, s, result, str(tmp_path), keep_state=True)
  assert study.told == [(5, {"steps": 3.0}, TrialStatus.FAILED, "held-out AUC is not finite")]
  assert not os.listdir(tmp_path)


def test_a_promoted_trial_keeps_its_state_and_drops_its_parents(tmp_path):
  study = _TellRecorder()
  parent = trial_states.state_path(str(tmp_path), 3)
  trial_states.save_state(parent, {"leaf": np.ones(2)})
  s = Suggestion(5, Config({"model.name": "fm"}), budget=2, rung=1, parent_trial_id=3,
                 resume_from=3)
  result = CohortTrialResult({"auc": 0.7, "seconds": 1.5, "bad": math.inf}, TrialStatus.DONE,
                             {"leaf": np.arange(2.0)}, None)
  search_round.record_result(study, s, result, str(tmp_path), keep_state=True)
  assert study.told == [(5, {"auc": 0.7, "seconds": 1.5}, TrialStatus.DONE, None)]
  assert not os.path.exists(parent)  # each trial is promoted at most once
  kept = trial_states.load_state(trial_states.state_path(str(tmp_path), 5),
                                 {"leaf": np.zeros(2)})
  np.testing.assert_array_equal(kept["leaf"], [0.0, 1.0])
  search_round.record_result(study, Suggestion(6, Config({})), result, str(tmp_path),
                             keep_state=False)
  assert not os.path.exists(trial_states.state_path(str(tmp_path), 6))
