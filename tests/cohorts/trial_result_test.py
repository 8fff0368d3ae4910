"""A chunk's trial results cut from its call's stacked output (hand-made outputs)."""

import chex
import numpy as np

from sfjax.automl.algorithms import TrialStatus
from sfjax.cohorts.chunk_plan import Chunk
from sfjax.cohorts.cohort_call import CohortOutput
from sfjax.cohorts.trial_result import chunk_results, failed_chunk_results

# Three real trials of a ragged chunk padded to four lanes (lane 3 repeats trial 5).
CHUNK = Chunk((5, 7, 9), 4, 4, "bucket", False, (0, 0, 2), (3, 2, 5), (False, False, True))


def _output():
  nan = np.nan
  return CohortOutput(
      states={"w": np.arange(4.0)[:, None] * np.ones((4, 2)), "step": np.array([3, 1, 5, 3])},
      alive=np.array([True, False, True, True]), steps=np.array([3, 1, 5, 3]),
      losses=np.array([[1.0, 2.0, 3.0], [4.0, nan, nan], [5.0, 7.0, 9.0], [1.0, 2.0, 3.0]]),
      applied=np.array([[True, True, True], [True, False, False], [True, True, True],
                        [True, True, True]]),
      auc=np.array([0.7, nan, 0.6, 0.7]), logloss=np.array([0.5, nan, 0.6, 0.5]),
      test_auc=np.array([0.71, nan, 0.61, 0.71]), test_logloss=np.array([0.4, nan, 0.45, 0.4]),
      seconds=6.0)


def test_chunk_results_drop_padding_and_fail_only_the_non_finite_trial():
  archs = ["lr", "fm", "deepfm", "lr"]  # per lane
  results = chunk_results(_output(), CHUNK, archs, lambda a: {"params": float(len(a))})
  assert len(results) == 3 and all(r.chunk == CHUNK for r in results)
  first, bad, third = results
  assert first.status == TrialStatus.DONE and first.error is None
  assert first.metrics == {"auc": 0.7, "logloss": 0.5, "test_auc": 0.71, "test_logloss": 0.4,
                           "train_loss": 2.0, "steps": 3, "params": 2.0, "seconds": 2.0}
  chex.assert_trees_all_equal(first.state, {"w": np.zeros(2), "step": np.array(3)})
  chex.assert_trees_all_equal(third.state, {"w": np.full(2, 2.0), "step": np.array(5)})
  assert third.metrics["train_loss"] == 7.0 and third.metrics["params"] == 6.0
  assert bad.status == TrialStatus.FAILED and bad.state is None
  assert bad.error == "loss or parameters became non-finite at step 2"
  assert bad.metrics["train_loss"] == 4.0 and np.isnan(bad.metrics["auc"])  # applied steps only
  # Each result keeps the losses of its applied steps (a pruned cohort joins its calls').
  np.testing.assert_array_equal(first.losses, [1.0, 2.0, 3.0])
  np.testing.assert_array_equal(bad.losses, [4.0])


def test_chunk_results_copy_the_states_out_of_the_stacked_output():
  out = _output()
  result = chunk_results(out, CHUNK, ["lr"] * 4, lambda a: {})[0]
  out.states["w"][0] = 99.0
  assert result.state["w"].tolist() == [0.0, 0.0]


def test_failed_chunk_results_name_the_error_and_each_trials_start():
  results = failed_chunk_results(RuntimeError("out of memory"), CHUNK, ["lr", "fm", "deepfm"],
                                 lambda a: len(a), lambda a: 10.0 * len(a))
  assert [r.metrics["steps"] for r in results] == [0, 0, 2]
  assert [(r.metrics["params"], r.metrics["flops"]) for r in results] == [
      (2, 20.0), (2, 20.0), (6, 60.0)]
  assert all(r.status == TrialStatus.FAILED and r.state is None and r.chunk == CHUNK
             and r.error == "RuntimeError: out of memory" and np.isnan(r.metrics["auc"])
             for r in results)
