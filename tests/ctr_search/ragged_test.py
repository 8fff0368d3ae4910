"""Ragged cohorts: trials with different step ranges in one program equal their own runs."""

import chex
import numpy as np
import pytest

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_call
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts.shape_buckets import buckets

HALF = 6  # steps; the `data` fixture has 12 steps per budget unit (conftest.py)
HPARAMS = [
    {"embedding.learning_rate": 0.01, "optimizer.learning_rate": 1e-3, "optimizer.weight_decay": 1e-3},
    {"embedding.learning_rate": 0.03, "optimizer.learning_rate": 3e-3},
    {"embedding.learning_rate": 0.005, "optimizer.learning_rate": 1e-2, "optimizer.weight_decay": 1e-2},
]


def _arch(**overrides):
  config = {"model.name": "dcnv2", "model.embed_dim": 4, "model.mlp.depth": 1,
            "model.mlp.width": 16, "model.cross_layers": 1, "optimizer.name": "adamw"}
  return arch_lib.split_config({**config, **overrides})[0]


def _assert_same(got, want):
  assert got.status == want.status == "done"
  for key in ("auc", "logloss", "train_loss", "test_auc", "steps"):
    assert abs(got.metrics[key] - want.metrics[key]) <= 1e-5 * max(1.0, abs(want.metrics[key])), key
  chex.assert_trees_all_close(got.state, want.state, atol=5e-5, rtol=1e-4)


def _check_ragged(data, archs, num_bucket_programs):
  """Trial 0: fresh [0, 12); trial 1: fresh [0, 6); trial 2: resumed [6, 18) -- one
  ragged program; each equals its own run (one trial per program, its own shapes)."""
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  seeds = [0, 1, 2]
  start2 = alone.run(archs[2], [HPARAMS[2]], [seeds[2]], [0], HALF, [None])[0]
  starts, ends = [0, 0, HALF], [2 * HALF, HALF, 3 * HALF]
  inits = [None, None, start2.state]
  runner = cohort.CohortRunner(data.task, cohort_width=4, data=data, ragged=True)
  traces = cohort_call._num_traces()
  got = runner.run(archs, HPARAMS, seeds, starts, ends, inits)
  assert cohort_call._num_traces() - traces == num_bucket_programs
  # One ragged call, longest range first, padded to 4 lanes: 30 of its 48 trial-steps train.
  chunk = got[0].chunk
  assert all(r.chunk == chunk for r in got) and chunk.ragged and chunk.from_states
  assert (chunk.trials, chunk.lanes, chunk.num_steps) == ((0, 2, 1), 4, 2 * HALF)
  assert (chunk.trial_steps, chunk.lane_steps) == (5 * HALF, 4 * 2 * HALF)
  for i, arch in enumerate(archs):
    want = alone.run(arch, [HPARAMS[i]], [seeds[i]], [starts[i]], ends[i], [inits[i]])[0]
    _assert_same(got[i], want)
    assert got[i].metrics["steps"] == ends[i]
  # The caller's resume state is not consumed (the program donates its own copy).
  chex.assert_trees_all_equal(inits[2], start2.state)


def test_ragged_cohort_of_one_architecture_equals_each_trial_alone(data):
  _check_ragged(data, [_arch()] * 3, 1)


def test_ragged_padded_cohort_equals_each_trial_alone(data):
  archs = [_arch(**a) for a in (
      {"model.mlp.depth": 1, "model.mlp.width": 16, "model.cross_layers": 1},
      {"model.mlp.depth": 2, "model.mlp.width": 32, "model.cross_layers": 0, "model.embed_dim": 8},
      {"model.mlp.depth": 3, "model.mlp.width": 8, "model.cross_layers": 2})]
  assert len({buckets.bucket_key(a) for a in archs}) == 1
  _check_ragged(data, archs, 1)


def test_run_stacked_refuses_ragged_ranges_without_states(data):
  runner = cohort.CohortRunner(data.task, cohort_width=2, data=data)
  with pytest.raises(ValueError, match="need init_states"):
    runner.run_stacked(_arch(), {}, np.arange(2), np.array([0, 0]), np.array([6, 12]))
  with pytest.raises(ValueError, match="invalid step ranges"):
    runner.run_stacked(_arch(), {}, np.arange(2), np.array([0, 6]), np.array([6, 3]))
