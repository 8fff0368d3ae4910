"""The live leaderboard: ranking by held-out AUC, failed last, and the text it prints."""

import math

from sfjax.automl.algorithms import Suggestion, TrialStatus
from sfjax.automl.space import Config
from sfjax.automl.study import TrialRecord
from sfjax.ctr_search import search_report


def _record(trial_id, auc, status=TrialStatus.DONE, name="fm", **config):
  s = Suggestion(trial_id, Config({"model.name": name, "model.embed_dim": 8,
                                   "embedding.learning_rate": 0.01, **config}), budget=2, rung=1)
  metrics = {} if auc is None else {"auc": auc, "steps": 8.0}
  return TrialRecord(s, status, metrics, None, 0.0, 0.0, 1.0, 1.0, 1)


def _ids(trials):
  return [t.trial_id for t in trials]


def test_ranked_best_auc_first_failed_and_pruned_last_by_id():
  trials = [_record(0, 0.61), _record(1, None, TrialStatus.FAILED), _record(2, 0.72),
            _record(3, 0.65), _record(4, None, TrialStatus.RUNNING),
            _record(5, 0.9, TrialStatus.PRUNED), _record(6, None, TrialStatus.REJECTED),
            _record(7, 0.65)]
  # Ties by id; pruned (even with an AUC) and failed trials after every done one, by id;
  # running and rejected trials are not finished and not ranked.
  assert _ids(search_report.ranked(trials)) == [2, 3, 7, 0, 1, 5]


def test_done_trial_without_finite_auc_ranks_last():
  trials = [_record(0, math.nan), _record(1, None), _record(2, 0.5),
            _record(3, None, TrialStatus.FAILED)]
  assert _ids(search_report.ranked(trials)) == [2, 0, 1, 3]
  assert search_report.ranked([]) == []


def test_leaderboard_header_count_and_best():
  trials = [_record(0, 0.61), _record(1, None, TrialStatus.FAILED), _record(2, 0.72),
            _record(3, None, TrialStatus.REJECTED), _record(4, None, TrialStatus.RUNNING)]
  text = search_report.leaderboard(trials, 5, 0.7, 10, 75.0)
  assert text.endswith("\n")
  head, header, *rows = text.splitlines()
  assert head == ("[search] 3/10 trials (1 failed, 1 rejected) in 1m15s | best auc 0.72000 "
                  "(trial 2) | default auc 0.70000")
  assert header.split() == ["rank", "trial", "rung", "steps", "model", "dim", "mlp", "emb_opt",
                            "emb_lr", "dense_lr", "auc", "status"]
  assert [r.split()[:2] for r in rows] == [["1", "2"], ["2", "0"], ["3", "1"]]
  assert rows[0].split()[-2:] == ["0.72000", "done"] and rows[2].split()[-2:] == ["-", "failed"]


def test_leaderboard_top_k_and_progress_only():
  trials = [_record(i, 0.5 + i / 100) for i in range(4)]
  assert len(search_report.leaderboard(trials, 2, None, 4, 5.0).splitlines()) == 4
  only = search_report.leaderboard(trials, 0, None, 4, 5.0)
  assert only == "[search] 4/4 trials (0 failed, 0 rejected) in 5s | best auc 0.53000 (trial 3)\n"


def test_leaderboard_without_a_done_trial_has_no_best():
  text = search_report.leaderboard([_record(0, None, TrialStatus.FAILED)], 3, None, 2, 1.0)
  assert "best auc" not in text and text.splitlines()[0].startswith("[search] 1/2 trials (1 failed")


def test_leaderboard_shows_mlp_and_pbt_final_learning_rates():
  member = _record(0, 0.8, name="deepfm", **{"model.mlp.depth": 2, "model.mlp.width": 64,
                                             "optimizer.learning_rate": 0.001})
  member.metrics["final.embedding.learning_rate"] = 0.0123
  row = search_report.leaderboard([member], 1, None, 1, 1.0).splitlines()[2].split()
  assert row[4:7] == ["deepfm", "8", "2x64"]
  assert row[8:10] == ["0.0123", "0.001"]  # final embedding lr; the config's dense lr


def test_leaderboard_with_only_done_trials_lacking_a_finite_auc_has_no_best():
  # `ranked` puts such trials last; the header must not read an AUC they do not have.
  for trials in ([_record(0, None)], [_record(0, math.nan)]):
    text = search_report.leaderboard(trials, 3, None, 2, 1.0)
    assert "best auc" not in text.splitlines()[0]


def test_pareto_report_one_block_per_budget():
  a, b, c = _record(3, 0.71), _record(4, 0.69), _record(7, 0.74)
  a.metrics["params"], b.metrics["params"], c.metrics["params"] = 1200.0, 300.0, 5e4
  text = search_report.pareto_report([(1.0, [a, b]), (3.0, [c])],
                                     {"auc": "maximize", "params": "minimize"})
  lines = text.splitlines()
  assert lines[0] == "[pareto] budget 1: 2 trials on the front (auc max, params min)"
  assert lines[1].split() == ["trial", "4", "auc", "0.69000", "params", "300"]
  assert lines[2].split() == ["trial", "3", "auc", "0.71000", "params", "1.2e+03"]
  assert lines[3].startswith("[pareto] budget 3: 1 trials") and "5e+04" in lines[4]
  assert search_report.pareto_report([], {"auc": "maximize"}) == ""
  no_budget = search_report.pareto_report([(None, [a])], {"auc": "maximize"})
  assert no_budget.startswith("[pareto] 1 trials on the front (auc max)")


def test_leaderboard_names_a_generated_models_blocks():
  # A trial of the default (block) space has no model.name: its row names the blocks on.
  s = Suggestion(7, Config({"model.combine": "parallel", "model.fm.use": True,
                            "model.first_order.use": True, "model.cross.use": False,
                            "model.embed_dim": 8}), budget=2, rung=1)
  generated = TrialRecord(s, TrialStatus.DONE, {"auc": 0.7, "steps": 8.0}, None, 0.0, 0.0,
                          1.0, 1.0, 1)
  rows = search_report.leaderboard([generated, _record(1, 0.6)], 2, None, 2, 1.0).splitlines()
  assert rows[2].split()[4] == "first_order+fm" and rows[3].split()[4] == "fm"
