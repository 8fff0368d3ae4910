"""Pruned cohorts: a planted bad lane is pruned at its first eligible eval point and its
lane refilled; the lanes never pruned equal an unpruned run bit for bit."""

import chex
import numpy as np
import pytest

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts import pruned_cohort
from sfjax.cohorts.pruned_cohort import LaneTrial
from sfjax.cohorts.pruning import PrunerSpec
from sfjax.cohorts.shape_buckets import buckets

STEPS = 12  # the shared `data` fixture's steps per budget unit (conftest.py)
GOOD = [{"embedding.learning_rate": 0.05, "optimizer.learning_rate": 3e-2},
        {"embedding.learning_rate": 0.04, "optimizer.learning_rate": 3e-2},
        {"embedding.learning_rate": 0.05, "optimizer.learning_rate": 2e-2}]
# Planted: it barely moves from a wide random init, so it scores near chance.
BAD = {"embedding.learning_rate": 1e-6, "optimizer.learning_rate": 1e-7,
       "embedding.init_stddev": 1.0}
HPARAMS = GOOD[:2] + [BAD] + GOOD[2:]  # the bad trial in lane 2
SEEDS = [4, 5, 0, 7]
REFILL = {"embedding.learning_rate": 0.05, "optimizer.learning_rate": 3e-2}


@pytest.fixture(scope="module")
def arch():
  return arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4, "model.mlp.depth": 1,
                                "model.mlp.width": 16})[0]


@pytest.fixture(scope="module")
def runner(data):
  return cohort.CohortRunner(data.task, cohort_width=4, data=data)


def _lanes(arch, ends):
  return [LaneTrial(i, arch, h, s, 0, e) for i, (h, s, e) in enumerate(zip(HPARAMS, SEEDS, ends, strict=True))]


def _run(runner, arch, history, refills, spec, ends=(3 * STEPS,) * 4, period=3 * STEPS):
  """run_cohort with a fixed history and a refill queue; (results by handle, chunks, asks)."""
  ended, asks = {}, []

  def refill(key):
    asks.append(key)
    return refills.pop(0) if refills else None

  chunks = pruned_cohort.run_cohort(
      runner, buckets.bucket_key(arch), _lanes(arch, ends), spec, period=period,
      history=lambda: history, refill=refill,
      on_end=lambda trial, result: ended.setdefault(trial.handle, result))
  return ended, chunks, asks


@pytest.mark.slow  # ~10 s on 2 cores: four cohort programs compile
def test_planted_bad_lane_is_pruned_refilled_and_mates_are_untouched(arch, runner):
  unpruned = runner.run(arch, HPARAMS, SEEDS, [0] * 4, 3 * STEPS, [None] * 4)
  first = runner.run(arch, HPARAMS, SEEDS, [0] * 4, STEPS, [None] * 4)
  aucs = [r.metrics["auc"] for r in first]
  assert aucs[2] < min(aucs[:2] + aucs[3:])  # the planted lane is the worst at step 12
  # Completed trials reported the good lanes' values at step 12: with p = 100 the bar is
  # their minimum, so only a lane below every completed trial is pruned.
  history = [{STEPS: a} for i, a in enumerate(aucs) if i != 2]
  spec = PrunerSpec(percentile=100.0, n_startup_trials=3, eval_every=STEPS)
  refill = LaneTrial("refill", arch, REFILL, 7, 0, 2 * STEPS)
  ended, chunks, asks = _run(runner, arch, history, [refill], spec)

  pruned = ended[2]
  assert pruned.status == "pruned" and pruned.state is None and "pruned at step 12" in pruned.error
  assert pruned.metrics["steps"] == STEPS and pruned.metrics["auc/12"] == aucs[2]
  assert not any(k.startswith("auc/") and k != "auc/12" for k in pruned.metrics)
  # The refill joined lane 2 at the next call and ran its own 24 steps to its end.
  new = ended["refill"]
  assert new.status == "done" and new.metrics["steps"] == 2 * STEPS
  assert set(k for k in new.metrics if k.startswith("auc/")) == {"auc/12", "auc/24"}
  assert new.metrics["auc/24"] == new.metrics["auc"] and new.losses.shape == (2 * STEPS,)
  assert [(c.starts[0], c.ends[0], len(c.trials), c.lanes, c.resumes) for c in chunks] == [
      (0, 12, 4, 4, (False,) * 4), (12, 24, 4, 4, (True, True, False, True)),
      (24, 36, 4, 4, (True,) * 4)]
  # Every trained step counted: 3 mates x 36 + the pruned lane's 12 + the refill's 24.
  assert sum(c.trial_steps for c in chunks) == 3 * 36 + 12 + 24
  assert len(asks) == 1  # one freed lane, one refill
  # The mates equal the unpruned run bit for bit (metrics, losses and states).
  for i in (0, 1, 3):
    got, want = ended[i], unpruned[i]
    assert got.status == "done"
    for key in ("auc", "logloss", "test_auc", "test_logloss", "train_loss", "steps"):
      assert got.metrics[key] == want.metrics[key], key
    np.testing.assert_array_equal(got.losses, want.losses)
    chex.assert_trees_all_equal(got.state, want.state)
    assert [got.metrics[f"auc/{s}"] for s in (12, 36)][1] == want.metrics["auc"]


@pytest.mark.slow  # ~8 s on 2 cores
def test_no_pruning_without_startup_trials_and_no_refill_once_every_lane_ended(arch, runner):
  spec = PrunerSpec(percentile=100.0, n_startup_trials=1, eval_every=STEPS)
  ended, chunks, asks = _run(runner, arch, [], [], spec, ends=(2 * STEPS,) * 4)
  assert all(r.status == "done" and r.metrics["steps"] == 24 for r in ended.values())
  assert not asks and len(chunks) == 2  # no history: nothing pruned; all ended together
  history = [{STEPS: 1.0}]  # every lane is below it at step 12: all pruned, none refilled
  ended, chunks, asks = _run(runner, arch, history, [LaneTrial("x", arch, REFILL, 7, 0, 12)],
                             spec, ends=(2 * STEPS,) * 4)
  assert all(r.status == "pruned" for r in ended.values()) and not asks and len(chunks) == 1


@pytest.mark.slow  # ~8 s on 2 cores
def test_refill_of_a_shorter_lane_counts_its_own_steps_and_wraps_the_clock(arch, runner):
  spec = PrunerSpec(percentile=100.0, n_startup_trials=1, eval_every=STEPS)
  refill = LaneTrial("refill", arch, REFILL, 7, 0, 2 * STEPS)
  ended, chunks, asks = _run(runner, arch, [], [refill], spec,
                             ends=(STEPS,) + (2 * STEPS,) * 3, period=2 * STEPS)
  # Lane 0 ends at 12 while its mates run on: the refill takes it, its own steps 0-12 on
  # batches 12-24, then alone on batches 0-12 (the clock wraps at the period).
  # One ask when lane 0 ended, three when its mates ended at 24 while the refill ran on.
  assert len(asks) == 4 and ended[0].metrics["steps"] == STEPS
  assert [(c.starts[0], c.ends[0], len(c.trials), c.resumes) for c in chunks] == [
      (0, 12, 4, (False,) * 4), (12, 24, 4, (False, True, True, True)), (0, 12, 1, (True,))]
  new = ended["refill"]
  assert new.status == "done" and new.metrics["steps"] == 2 * STEPS
  assert sorted(k for k in new.metrics if k.startswith("auc/")) == ["auc/12", "auc/24"]
  assert all(ended[i].metrics["steps"] == 2 * STEPS for i in (1, 2, 3))
