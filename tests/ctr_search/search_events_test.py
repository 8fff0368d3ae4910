"""TensorBoard curves of a search: each DONE trial once, the best so far, rebuilt on resume."""

from sfjax.automl.algorithms import TrialStatus
from sfjax.core import tensorboard
from sfjax.ctr_search.search_events import SearchEvents


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
