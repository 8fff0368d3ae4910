"""Composed trials of different row layouts in one padded program (issue #26, 0a).

Field-group counts: with the data's field count F known (`bucket_key(..., num_fields=F)`),
a composed spec's group count leaves its bucket key: the superset's embedding dims are
per field, field f's the largest of the trials' dims of f (`field_layout.field_dims`),
and each trial's columns past its own dims are gated to 0 (`bucket_blocks.ColumnLayout`,
`column_gate_row`).

Row-wise row optimizers: rowwise_adagrad trials of different row widths share a program
too; each lane divides its rows' squared-gradient sums by its own width
(`lane_optimizers.ROW_WIDTH_KEY`), so its accumulator is the one of its own run.
"""

import chex
import numpy as np
import pytest

from sfjax.cohorts import cohort_call, lane_optimizers
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts.shape_buckets import bucket_blocks as padded_blocks
from sfjax.cohorts.shape_buckets import buckets as padded
from sfjax.models import field_layout
from tests.cohorts.conftest import assert_same_trial
from tests.cohorts.shape_buckets.bucket_blocks_test import (
  _WIDE,
  FM,
  FO,
  GP,
  IP,
  STEPS,
  _arch,
  _assert_padded_is_exact,
  _cross,
  _spec,
)

F = 26  # the `data` fixture's fields (synthetic Criteo): 3 groups split them 9 / 9 / 8


def _text(arch):
  return dict(arch.model_hparams)["blocks"]


def test_with_the_field_count_group_counts_share_a_bucket():
  base = _arch([FO, FM], dims=(4, 8))
  others = [_arch([FO, FM], dims=(4,)), _arch([FO, IP], dims=(16, 4, 8)),
            _arch([FM, _cross(1)], dims=(2, 2, 2), bias=True)]
  for arch in others:
    assert padded.bucket_key(arch, True, None, F) == padded.bucket_key(base, True, None, F)
    assert padded.bucket_key(arch, True) != padded.bucket_key(base, True)  # F unknown: kept
  # what still splits: the combination (and a row-wise row optimizer's row layout)
  assert padded.bucket_key(_arch([FO, FM], dims=(4,), combine="stacked"), True, None, F) != (
      padded.bucket_key(base, True, None, F))


def test_superset_of_different_group_counts_takes_per_field_dims():
  archs = [_arch([FO, FM], dims=(4, 8)), _arch([IP], dims=(16, 2, 8)), _arch([FM], dims=(2,))]
  sup = padded.superset(archs, None, F)
  per_field = np.max([field_layout.field_dims(_spec(a)["embedding"]["dims"], F) for a in archs],
                     axis=0)
  assert _spec(sup)["embedding"]["dims"] == per_field.tolist() and len(per_field) == F
  assert per_field[0] == 16 and per_field[9] == 4 and per_field[13] == 8 and per_field[25] == 8
  assert _spec(sup)["gated_columns"] is True and sup.embed_dim == 17
  # each trial's gates: 1 on its own first d_f columns of field f (and the first-order one)
  for arch in archs:
    gates = padded_blocks.column_gate_row(_text(arch), _text(sup), F)
    dims = field_layout.field_dims(_spec(arch)["embedding"]["dims"], F)
    has_fo = FO in _spec(arch)["interactions"]
    np.testing.assert_array_equal(gates[:, :-1].sum(axis=1), dims)
    assert gates[:, -1].all() == has_fo and (not gates[:, -1].any()) == (not has_fo)
  # one group count: today's per-group superset, with or without F
  same = [_arch([FO, FM], dims=(4, 8)), _arch([IP], dims=(16, 2))]
  assert _spec(padded.superset(same, None, F)) == _spec(padded.superset(same))
  assert _spec(padded.superset(same))["embedding"]["dims"] == [16, 8]
  with pytest.raises(ValueError, match="different buckets"):
    padded_blocks.superset_blocks([_text(a) for a in archs])  # without F: not one bucket


GROUP_CASES = {  # trials of two group counts: each is exact inside their superset
    "one_in_three": (dict(interactions=[FO, FM], dims=(4,)),
                     dict(interactions=_WIDE, dims=(2, 8, 4))),
    "three_in_two": (dict(interactions=[FO, _cross(1), GP], dims=(2, 8, 4)),
                     dict(interactions=[FM, IP], dims=(8, 2))),
    "two_in_one_stacked": (dict(interactions=[FO, FM], dims=(2, 4), combine="stacked",
                                inputs=["embeddings", "blocks"]),
                           dict(interactions=[IP, _cross(1)], dims=(8,), combine="stacked",
                                inputs=["blocks"])),
}


@pytest.mark.parametrize("case", sorted(GROUP_CASES))
def test_a_trial_in_a_superset_of_other_group_counts_gives_its_exact_logits(data, case):
  assert data.spec.num_fields == F
  small, other = (_arch(**kw) for kw in GROUP_CASES[case])
  sup = padded.superset([small, other], data.spec.num_dense, F)
  assert len(_spec(sup)["embedding"]["dims"]) == F
  for trial in (small, other):
    _assert_padded_is_exact(data, trial, sup)


@pytest.mark.slow  # a padded program and three solo ones
def test_a_padded_cohort_of_one_two_and_three_groups_equals_each_trial_alone(data):
  archs = [_arch([FO, FM], tower=(16,), dims=(4,)),
           _arch([FO, _cross(1)], tower=(8, 8), dims=(2, 8), **{"embedding.optimizer": "adam"}),
           _arch([IP, GP], tower=None, dims=(8, 2, 4))]
  assert len({padded.bucket_key(a, True, data.spec.num_dense, F) for a in archs}) == 1
  hparams = [{"embedding.learning_rate": 0.02, "optimizer.learning_rate": 3e-3}] * 3
  runner = cohort.CohortRunner(data.task, cohort_width=4, data=data)
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  traces = cohort_call._num_traces()
  got = runner.run(archs, hparams, [0, 1, 2], [0] * 3, STEPS, [None] * 3, merge_optimizers=True)
  assert cohort_call._num_traces() - traces == 1  # one per-field padded program for all three
  for i, arch in enumerate(archs):
    want = alone.run(arch, [hparams[i]], [i], [0], STEPS, [None])[0]
    assert_same_trial(got[i], want)
    chex.assert_trees_all_equal_shapes(got[i].state, want.state)


def _rowwise(interactions, **kw):
  return _arch(interactions, **kw, **{"embedding.optimizer": "rowwise_adagrad"})


# rowwise lanes of widths 5 (4 + first order), 8 (no first order, groups 8/2) and 17, an
# adagrad lane of width 3, all in one program of width 17 (16 + the first-order column).
def _rowwise_archs():
  return [_rowwise([FO, FM], tower=(16,), dims=(4,)),
          _rowwise([IP, _cross(1)], tower=(8,), dims=(8, 2)),
          _rowwise([FO, GP], tower=None, dims=(16, 4, 8)),
          _arch([FM], tower=(8,), dims=(2, 3))]


def _run_rowwise(data, break_widths=False):
  archs = _rowwise_archs()
  assert len({padded.bucket_key(a, True, data.spec.num_dense, F) for a in archs}) == 1
  hparams = [{"embedding.learning_rate": 0.05, "optimizer.learning_rate": 3e-3}] * len(archs)
  runner = cohort.CohortRunner(data.task, cohort_width=4, data=data)
  if break_widths:  # every lane averaging over the program's width, as before issue #26's fix
    runner._run_chunk = _without_row_widths(runner._run_chunk)
  traces = cohort_call._num_traces()
  got = runner.run(archs, hparams, list(range(len(archs))), [0] * len(archs), STEPS,
                   [None] * len(archs), merge_optimizers=True)
  assert cohort_call._num_traces() - traces == 1  # one program for the four row layouts
  return archs, hparams, got


def _without_row_widths(run_chunk):
  def run(chunk, sup, hparams, *args, **kwargs):
    assert lane_optimizers.ROW_WIDTH_KEY in hparams  # the runner passes each lane's width
    hparams = {k: v for k, v in hparams.items() if k != lane_optimizers.ROW_WIDTH_KEY}
    return run_chunk(chunk, sup, hparams, *args, **kwargs)
  return run


@pytest.mark.slow  # a padded program and four solo ones
def test_a_padded_cohort_of_rowwise_trials_of_other_widths_equals_each_trial_alone(data):
  archs, hparams, got = _run_rowwise(data)
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  for i, arch in enumerate(archs):
    assert_same_trial(got[i], alone.run(arch, [hparams[i]], [i], [0], STEPS, [None])[0])


@pytest.mark.slow  # the padded program once more, each lane averaging over the program's width
def test_without_the_lane_row_widths_the_rowwise_lanes_drift(data):
  archs, hparams, got = _run_rowwise(data, break_widths=True)
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  drifted = []
  for i, arch in enumerate(archs[:2]):  # the narrower rowwise lanes (the third is 17 wide)
    want = alone.run(arch, [hparams[i]], [i], [0], STEPS, [None])[0]
    drifted.append(abs(got[i].metrics["train_loss"] - want.metrics["train_loss"]) > 1e-4)
  assert all(drifted)
