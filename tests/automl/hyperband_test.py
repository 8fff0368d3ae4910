"""Tests for successive halving, Hyperband and ASHA (sfjax/automl/algorithms/hyperband.py)."""

import collections

import pytest

from sfjax.automl.algorithms import (
    ASHA,
    Hyperband,
    Objective,
    SuccessiveHalving,
    TrialStatus,
    hyperband_brackets,
    rung_budgets,
)
from sfjax.automl.space import Categorical, Float, Space

SPACE = Space({"x": Float(0.0, 1.0), "kind": Categorical(("a", "b"))})
ACC = Objective("acc", "maximize")


def test_rung_budgets():
  assert rung_budgets(1, 81, 3) == (1, 3, 9, 27, 81)
  assert rung_budgets(2, 8, 2) == (2, 4, 8)
  # min_budget is rounded up onto the ladder that ends at max_budget.
  assert rung_budgets(1, 100, 3) == pytest.approx((100 / 81, 100 / 27, 100 / 9, 100 / 3, 100))
  assert rung_budgets(5, 5, 3) == (5,)
  with pytest.raises(ValueError, match="eta"):
    rung_budgets(1, 9, 1)
  with pytest.raises(ValueError, match="min_budget"):
    rung_budgets(10, 9, 3)


def test_hyperband_brackets_match_the_paper_table():
  # Li et al. (2018), Table 1: R = 81, eta = 3.
  assert hyperband_brackets(1, 81, 3) == [
      [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
      [(34, 3), (11, 9), (3, 27), (1, 81)],
      [(15, 9), (5, 27), (1, 81)],
      [(8, 27), (2, 81)],
      [(5, 81)],
  ]


def test_asha_promotions_by_hand():
  asha = ASHA(min_budget=1, max_budget=9, eta=3).build(SPACE, ACC)
  acc = {0: 0.5, 1: 0.9, 2: 0.1, 3: 0.7, 4: 0.3, 5: 0.8, 6: 0.2, 7: 0.6, 8: 0.4, 9: 0.95,
         10: 0.91, 11: 0.85, 12: 0.05, 13: 0.97, 14: 0.5}
  def tell(*ids):
    return [asha.tell(i, {"acc": acc[i]}) for i in ids]

  def summary(batch):
    return [(s.trial_id, s.rung, s.budget, s.resume_from) for s in batch]

  first = asha.ask(9)
  assert summary(first) == [(i, 0, 1, None) for i in range(9)]
  tell(0, 1)  # 2 results at rung 0: floor(2/3) = 0 promotable
  assert summary(asha.ask(1)) == [(9, 0, 1, None)]
  tell(2)  # 3 results: top 1 = trial 1
  promoted = asha.ask(1)
  assert summary(promoted) == [(10, 1, 3, 1)]
  assert promoted[0].parent_trial_id == 1 and promoted[0].config == first[1].config
  tell(3, 4, 5)  # 6 results: top 2 = trials 1 (done) and 5
  assert summary(asha.ask(2)) == [(11, 1, 3, 5), (12, 0, 1, None)]
  tell(6, 7, 8, 9)  # 10 results: top 3 = 9, 1, 5
  assert summary(asha.ask(2)) == [(13, 1, 3, 9), (14, 0, 1, None)]
  tell(10, 11, 13, 12, 14)  # rung 1: 3 results, top 1 = 13; rung 0: 12 results, top 4 adds 3
  assert summary(asha.ask(3)) == [(15, 2, 9, 13), (16, 1, 3, 3), (17, 0, 1, None)]


def test_asha_fixed_ask_defers_promotions_of_other_buckets():
  """A fixed ask promotes only agreeing trials; a later free ask takes the deferred one."""
  asha = ASHA(min_budget=1, max_budget=9, eta=3).build(SPACE, ACC)
  first = asha.ask(6)
  kinds = {s.trial_id: s.config["kind"] for s in first}
  best = first[0].trial_id  # made the best of rung 0
  for s in first:
    asha.tell(s.trial_id, {"acc": 1.0 if s.trial_id == best else 0.1 * s.trial_id})
  # 6 results: top 2 = `best` and the next. Fix the kind `best` does not have.
  other = "a" if kinds[best] == "b" else "b"
  batch = asha.ask(3, fixed={"kind": other})
  assert all(s.trial_id != best and s.resume_from != best for s in batch)
  assert all(s.config["kind"] == other for s in batch)
  promoted = [s for s in batch if s.resume_from is not None]
  assert all(kinds[s.resume_from] == other for s in promoted)
  # The free ask that follows promotes `best` first (highest rung, best first).
  free = asha.ask(1)
  assert free[0].resume_from == best and free[0].rung == 1


def test_asha_ignores_failed_and_rejected_trials():
  asha = ASHA(min_budget=1, max_budget=9, eta=3).build(SPACE, ACC)
  asha.ask(4)
  asha.tell(0, {}, TrialStatus.REJECTED)  # does not count towards the rung
  asha.tell(1, {}, TrialStatus.FAILED)  # counts, ranks last
  asha.tell(2, {"acc": float("nan")})  # recorded as failed
  assert asha.history[-1].status == TrialStatus.FAILED
  assert [s.rung for s in asha.ask(1)] == [0]  # 2 counted results: nothing to promote
  asha.tell(3, {"acc": 0.1})
  assert [(s.rung, s.resume_from) for s in asha.ask(1)] == [(1, 3)]


def test_successive_halving_is_synchronous():
  sh = SuccessiveHalving(min_budget=1, max_budget=9, eta=3, num_configs=9).build(SPACE, ACC)
  batch = sh.ask(20)
  assert [(s.rung, s.budget) for s in batch] == [(0, 1)] * 9
  for s in batch[:8]:
    sh.tell(s.trial_id, {"acc": s.trial_id / 10})
  assert sh.ask(5) == []  # rung 0 not finished: wait
  sh.tell(8, {"acc": 0.05})
  promoted = sh.ask(5)
  assert [(s.rung, s.budget, s.resume_from) for s in promoted] == [(1, 3, 7), (1, 3, 6), (1, 3, 5)]
  for s in promoted:
    sh.tell(s.trial_id, {"acc": 1.0 - s.resume_from / 10})  # trial 5's child is now best
  last = sh.ask(5)
  assert [(s.rung, s.budget, s.parent_trial_id) for s in last] == [(2, 9, promoted[2].trial_id)]
  assert not sh.finished
  sh.tell(last[0].trial_id, {"acc": 0.5})
  assert sh.finished and sh.ask(3) == []
  with pytest.raises(ValueError, match="no config for the last rung"):
    SuccessiveHalving(min_budget=1, max_budget=9, eta=3, num_configs=8).build(SPACE, ACC)


def test_hyperband_runs_every_bracket_of_the_table():
  hb = Hyperband(min_budget=1, max_budget=81, eta=3).build(SPACE, ACC)
  runs = collections.Counter()
  suggestions = {}
  while not hb.finished:
    batch = hb.ask(64)
    assert batch, "Hyperband must not wait when nothing is pending"
    for s in batch:
      suggestions[s.trial_id] = s
      runs[(s.bracket, s.budget)] += 1
      if s.resume_from is not None:
        parent = suggestions[s.resume_from]
        assert (parent.bracket, parent.rung + 1) == (s.bracket, s.rung)
        assert parent.config == s.config and parent.budget < s.budget
      else:
        assert s.rung == s.bracket  # bracket s = 4 - b starts at rung 4 - s = b
    for s in batch:
      hb.tell(s.trial_id, {"acc": s.config["x"] + 0.01 * s.budget})
  expected = {(b, budget): n for b, schedule in enumerate(hyperband_brackets(1, 81, 3))
              for n, budget in schedule}
  assert dict(runs) == expected
  assert sum(expected.values()) == 206


def test_hyperband_promotes_the_top_configs():
  hb = Hyperband(min_budget=1, max_budget=9, eta=3).build(SPACE, ACC)
  batch = [s for s in hb.ask(100) if s.bracket == 0]
  assert len(batch) == 9
  for s in hb.pending:
    hb.tell(s.trial_id, {"acc": s.config["x"]})
  promoted = [s for s in hb.ask(100) if s.bracket == 0]
  best = sorted(batch, key=lambda s: -s.config["x"])[:3]
  assert [s.resume_from for s in promoted] == [s.trial_id for s in best]
