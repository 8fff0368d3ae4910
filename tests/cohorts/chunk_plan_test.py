"""The chunk plan of a cohort run, checked against plans worked out by hand."""

import pytest

from sfjax.cohorts import chunk_plan
from sfjax.cohorts.chunk_plan import Chunk


def _fresh(n, end=6):
  return [0] * n, [end] * n, [False] * n


def test_group_trials_splits_by_range_unless_ragged_and_orders_longest_first():
  keys = ["a", "a", "b", "a"]
  starts, ends, resumes = [0, 6, 0, 0], [6, 18, 6, 6], [False, True, False, False]
  assert chunk_plan._group_trials(keys, starts, ends, resumes, ragged=False) == [[0, 3], [1], [2]]
  assert chunk_plan._group_trials(keys, starts, ends, resumes, ragged=True) == [[1, 0, 3], [2]]


@pytest.mark.parametrize("size,width,lanes", [
    (1, 8, 1), (2, 8, 2), (3, 8, 4), (4, 8, 4), (5, 8, 8), (8, 8, 8), (3, 2, 2), (5, 6, 6)])
def test_padded_width_is_the_next_power_of_two_capped_at_the_width(size, width, lanes):
  assert chunk_plan._padded_width(size, width) == lanes


def test_fixed_width_cuts_a_group_in_order_and_pads_the_last_chunk():
  plan = chunk_plan.plan_chunks(["a"] * 7, *_fresh(7), ragged=False, width=4)
  assert plan == (
      Chunk((0, 1, 2, 3), 4, 4, "a", False, (0,) * 4, (6,) * 4, (False,) * 4),
      Chunk((4, 5, 6), 4, 4, "a", False, (0,) * 3, (6,) * 3, (False,) * 3))
  assert plan[1].lane_trials == (4, 5, 6, 4)  # the padding lane repeats the first trial
  assert [c.lane_steps for c in plan] == [24, 24] and [c.trial_steps for c in plan] == [24, 18]
  assert not any(c.from_states or c.ragged for c in plan)
  two = chunk_plan.plan_chunks(["a"] * 5, *_fresh(5), ragged=False, width=2)
  assert [(c.trials, c.lanes) for c in two] == [((0, 1), 2), ((2, 3), 2), ((4,), 1)]


def test_auto_width_is_asked_once_per_group_with_its_trials():
  asked = []

  def width(members):  # what the runner's 'auto' measures, per group
    asked.append(list(members))
    return 2 if len(members) > 2 else 8

  keys = ["a", "b", "a", "a", "b"]
  plan = chunk_plan.plan_chunks(keys, *_fresh(5), ragged=False, width=width)
  assert asked == [[0, 2, 3], [1, 4]]
  assert [(c.trials, c.width, c.lanes, c.key) for c in plan] == [
      ((0, 2), 2, 2, "a"), ((3,), 2, 1, "a"), ((1, 4), 8, 2, "b")]


def test_ragged_ranges_share_chunks_longest_first():
  keys = ["a"] * 4
  starts, ends, resumes = [0, 6, 0, 0], [6, 18, 6, 12], [False, True, False, False]
  ragged = chunk_plan.plan_chunks(keys, starts, ends, resumes, ragged=True, width=2)
  # lengths 6, 12, 6, 12 -> longest first, ties in input order: 1, 3, 0, 2
  assert ragged == (Chunk((1, 3), 2, 2, "a", False, (6, 0), (18, 12), (True, False)),
                    Chunk((0, 2), 2, 2, "a", False, (0, 0), (6, 6), (False, False)))
  assert ragged[0].ragged and ragged[0].from_states and ragged[0].num_steps == 12
  # A chunk of one range runs the shared-range program from the seeds.
  assert not ragged[1].ragged and not ragged[1].from_states and ragged[1].num_steps == 6
  exact = chunk_plan.plan_chunks(keys, starts, ends, resumes, ragged=False, width=2)
  assert [(c.trials, c.from_states) for c in exact] == [((0, 2), False), ((1,), True),
                                                       ((3,), False)]
  whole = chunk_plan.plan_chunks(keys[:3], starts[:3], ends[:3], resumes[:3], ragged=True,
                                 width=8)
  assert whole == (Chunk((1, 0, 2), 8, 4, "a", False, (6, 0, 0), (18, 6, 6),
                         (True, False, False)),)
  assert whole[0].lane_trials == (1, 0, 2, 1) and whole[0].lane_steps == 4 * 12


def test_several_buckets_run_apart_and_mixed_architectures_are_masked():
  keys = ["a", "b", "a", "b", "a"]
  archs = ["a1", "b1", "a2", "b1", "a1"]
  plan = chunk_plan.plan_chunks(keys, *_fresh(5), ragged=True, width=4, archs=archs)
  assert [(c.trials, c.lanes, c.key, c.masked) for c in plan] == [
      ((0, 2, 4), 4, "a", True), ((1, 3), 2, "b", False)]
  assert plan[0].from_states and not plan[0].ragged  # the padded program starts from states


def test_program_summary_counts_padding_and_idle_lanes():
  padded = chunk_plan.plan_chunks(["a"] * 3, *_fresh(3), ragged=False, width=4)
  assert chunk_plan.program_summary(padded) == {"mean_cohort_width": 3.0,
                                                "lane_utilization": 18 / 24}
  ragged = chunk_plan.plan_chunks(["a"] * 3, [0, 6, 0], [6, 18, 6], [False, True, False],
                                  ragged=True, width=2)
  assert [(c.trial_steps, c.lane_steps) for c in ragged] == [(18, 24), (6, 6)]
  assert chunk_plan.program_summary(ragged) == {"mean_cohort_width": 1.5,
                                                "lane_utilization": 24 / 30}
  full = chunk_plan.plan_chunks(["a"] * 4, *_fresh(4), ragged=False, width=4)
  assert chunk_plan.program_summary(full)["lane_utilization"] == 1.0
  empty = chunk_plan.plan_chunks(["a"], [3], [3], [True], ragged=False, width=1)
  assert chunk_plan.program_summary(empty) == {"mean_cohort_width": 1.0, "lane_utilization": 1.0}
  assert chunk_plan.program_summary([]) == {"mean_cohort_width": None, "lane_utilization": None}


def test_whole_cohort_is_one_unpadded_call():
  chunk = chunk_plan.whole_cohort("a", 3, 10, 20, resume=True)
  assert chunk == Chunk((0, 1, 2), 3, 3, "a", False, (10,) * 3, (20,) * 3, (True,) * 3)
  assert chunk.lane_steps == chunk.trial_steps == 30 and chunk.from_states


def test_lockstep_chunk_shares_one_range_and_pads_like_a_partial_chunk():
  chunk = chunk_plan.lockstep_chunk("a", 3, 4, 12, 24, [True, False, True], masked=False)
  assert chunk == Chunk((0, 1, 2), 4, 4, "a", False, (12,) * 3, (24,) * 3, (True, False, True))
  assert chunk.trial_steps == 36 and chunk.lane_steps == 48 and chunk.from_states
  assert chunk_plan.lockstep_chunk("a", 2, 8, 0, 5, [False] * 2, masked=True).lanes == 2
  with pytest.raises(ValueError, match="5 trials do not fit a cohort of width 4"):
    chunk_plan.lockstep_chunk("a", 5, 4, 0, 5, [False] * 5, masked=False)


def test_bad_plans_are_named():
  with pytest.raises(ValueError, match="width must be a positive integer, got 0"):
    chunk_plan.plan_chunks(["a"], *_fresh(1), ragged=False, width=0)
  with pytest.raises(ValueError, match="got 'auto'"):
    chunk_plan.plan_chunks(["a"], *_fresh(1), ragged=False, width=lambda members: "auto")
  with pytest.raises(ValueError, match="end_steps has 1 entries but keys has 2"):
    chunk_plan.plan_chunks(["a", "a"], [0, 0], [6], [False, False], ragged=False, width=1)
  with pytest.raises(ValueError, match=r"trial 1: step range \[6, 3\) is invalid"):
    chunk_plan.plan_chunks(["a", "a"], [0, 6], [6, 3], [False, True], ragged=False, width=1)
