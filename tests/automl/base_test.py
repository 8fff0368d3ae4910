"""Tests for the ask/tell interface and its value types (sfjax/automl/algorithms/base.py)."""

import dataclasses
import json
import math
from typing import ClassVar

import pytest

from sfjax.automl.algorithms import (
    AlgorithmSpec,
    Objective,
    RandomSearch,
    Searcher,
    Suggestion,
    TrialStatus,
)
from sfjax.automl.space import Categorical, Config, Float, Space

AUC = Objective("auc", "maximize")
SPACE = Space({"x": Float(0.0, 1.0), "kind": Categorical(("a", "b"))})


@dataclasses.dataclass(frozen=True)
class Counting(AlgorithmSpec):
  """A minimal algorithm: random configs, and a count of `_propose` calls as extra core."""

  name: ClassVar[str] = "counting"
  seed: int = 0

  def build(self, space, objective):
    return CountingSearcher(self, space, objective)


class CountingSearcher(Searcher):

  def __init__(self, spec, space, objective):
    super().__init__(spec, space, objective)
    self.calls = 0

  def _propose(self, n):
    self.calls += 1
    return [self._new_suggestion(self.space.sample(self._rng), budget=float(self.calls))
            for _ in range(n)]

  def _extra_core(self):
    return {"calls": self.calls}

  def _load_extra_core(self, core):
    self.calls = int(core["calls"])


def test_tell_errors_and_nan(model_space):
  searcher = RandomSearch().build(model_space, AUC)
  a, b, c = searcher.ask(3)
  with pytest.raises(ValueError, match="lack the objective metric 'auc'"):
    searcher.tell(a.trial_id, {"loss": 0.3})
  searcher.tell(a.trial_id, {"auc": 0.7, "loss": 0.3})
  with pytest.raises(KeyError, match="already told"):
    searcher.tell(a.trial_id, {"auc": 0.7})
  with pytest.raises(KeyError, match="never asked"):
    searcher.tell(99, {"auc": 0.7})
  with pytest.raises(ValueError, match="must be final"):
    searcher.tell(b.trial_id, {}, "running")
  assert searcher.tell(b.trial_id, {"auc": float("nan")}).status == TrialStatus.FAILED
  assert searcher.tell(c.trial_id, {}, "failed").loss == float("inf")
  assert searcher.history[0].loss == -0.7  # maximise -> negated


def test_objective_checks_its_direction():
  with pytest.raises(ValueError, match=r"Objective\('auc'\): direction 'up' is not one of"):
    Objective("auc", "up")
  assert Objective("auc").direction == "maximize"
  assert Objective("loss", "minimize").to_dict() == {"metric": "loss", "direction": "minimize"}


def test_objective_value_and_loss():
  maximize, minimize = Objective("auc", "maximize"), Objective("loss", "minimize")
  assert maximize.value({"auc": 1}) == 1.0 and type(maximize.value({"auc": 1})) is float
  with pytest.raises(KeyError, match="lack the objective metric 'auc'"):
    maximize.value({"loss": 0.1})
  assert maximize.loss(0.75) == -0.75 and minimize.loss(0.75) == 0.75
  assert maximize.loss(math.nan) == math.inf and minimize.loss(math.nan) == math.inf
  assert maximize.loss(-math.inf) == math.inf  # the worst AUC is the worst loss


def test_suggestion_round_trips_through_json():
  full = Suggestion(7, Config({"x": 0.25, "kind": "b"}), budget=9, rung=2, bracket=1,
                    parent_trial_id=3, resume_from=3)
  bare = Suggestion(0, Config({"x": 0.5, "kind": "a"}))
  for s in (full, bare):
    data = json.loads(json.dumps(s.to_dict()))
    assert data["config"] == s.config.to_dict()
    back = Suggestion.from_dict(data)
    assert back == s and isinstance(back.config, Config)
  assert bare.to_dict()["budget"] is None and bare.to_dict()["resume_from"] is None


def test_ask_counts_trial_ids_and_checks_n():
  searcher = Counting().build(SPACE, AUC)
  with pytest.raises(ValueError, match="n must be >= 0, got -1"):
    searcher.ask(-1)
  assert searcher.ask(0) == [] and searcher.calls == 0  # nothing proposed, no id used
  first, second = searcher.ask(2), searcher.ask(1)
  assert [s.trial_id for s in first + second] == [0, 1, 2]
  assert searcher.pending == tuple(first + second)
  searcher.tell(1, {"auc": 0.5})
  assert [s.trial_id for s in searcher.pending] == [0, 2]
  assert [r.trial_id for r in searcher.history] == [1]


@pytest.mark.parametrize("status", ["failed", "pruned", "rejected", TrialStatus.PRUNED])
def test_tell_other_final_statuses_need_no_objective(status):
  searcher = Counting().build(SPACE, AUC)
  (s,) = searcher.ask(1)
  result = searcher.tell(s.trial_id, {"params": 5}, status)
  assert result.status == TrialStatus(status) and result.loss == math.inf
  assert result.metrics == {"params": 5.0} and type(result.metrics["params"]) is float
  assert not searcher.pending


def test_done_trial_with_nan_objective_is_failed():
  searcher = Counting().build(SPACE, Objective("loss", "minimize"))
  a, b = searcher.ask(2)
  nan = searcher.tell(a.trial_id, {"loss": math.nan})
  assert nan.status == TrialStatus.FAILED and nan.loss == math.inf
  ok = searcher.tell(b.trial_id, {"loss": 0.25})
  assert ok.status == TrialStatus.DONE and ok.loss == 0.25  # minimise: loss is the value
  assert searcher._done() == [ok]  # pylint: disable=protected-access


def test_tell_running_or_unknown_status_is_rejected():
  searcher = Counting().build(SPACE, AUC)
  (s,) = searcher.ask(1)
  with pytest.raises(ValueError, match="trial 0: status must be final, got 'running'"):
    searcher.tell(s.trial_id, {"auc": 0.5}, TrialStatus.RUNNING)
  with pytest.raises(ValueError, match="'finished'"):
    searcher.tell(s.trial_id, {"auc": 0.5}, "finished")
  assert searcher.pending == (s,) and not searcher.history  # nothing recorded


def test_state_dict_round_trip_restores_everything():
  searcher = Counting(seed=5).build(SPACE, AUC)
  a, b, c = searcher.ask(3)
  searcher.ask(1)
  searcher.tell(a.trial_id, {"auc": 0.9})
  searcher.tell(b.trial_id, {"auc": math.nan})
  searcher.tell(c.trial_id, {}, "pruned")
  state = json.loads(json.dumps(searcher.state_dict()))
  assert state["core"]["next_trial_id"] == 4 and state["core"]["calls"] == 2
  assert [r["status"] for r in state["history"]] == ["done", "failed", "pruned"]

  restored = Counting(seed=0).build(SPACE, AUC)  # another seed: the state's generator wins
  restored.load_state_dict(state)
  assert restored.pending == searcher.pending
  assert [(r.suggestion, r.status, r.loss) for r in restored.history] == \
      [(r.suggestion, r.status, r.loss) for r in searcher.history]
  assert math.isnan(restored.history[1].metrics["auc"])  # NaN kept, not dropped
  assert json.dumps([r.to_dict() for r in restored.history]) == \
      json.dumps([r.to_dict() for r in searcher.history])
  assert restored.calls == 2
  assert restored.core_state() == searcher.core_state()
  assert restored.ask(3) == searcher.ask(3)  # same ids, configs and budgets (calls = 3)
  assert json.dumps(restored.state_dict()) == json.dumps(searcher.state_dict())


def test_spec_to_dict_names_the_algorithm():
  assert Counting(seed=3).to_dict() == {"name": "counting", "seed": 3}
  assert not Counting.multi_fidelity and not Counting.population_based
  assert not Counting().build(SPACE, AUC).finished


class BucketBreaking(CountingSearcher):
  """Ignores `fixed`: the base class must catch it."""

  def _propose(self, n):
    return [self._new_suggestion(Config({"x": 0.5, "kind": "b"})) for _ in range(n)]


def test_ask_with_fixed_samples_the_fixing_and_checks_the_result():
  searcher = Counting().build(SPACE, AUC)
  seen = []

  def propose(n):  # pylint: disable=protected-access
    seen.append((searcher.sampling_space, searcher.ask_fixed))
    space = searcher.sampling_space
    return [searcher._new_suggestion(space.sample(searcher._rng)) for _ in range(n)]

  searcher._propose = propose  # pylint: disable=protected-access
  batch = searcher.ask(3, fixed={"kind": "a"})
  assert [s.config["kind"] for s in batch] == ["a"] * 3
  assert seen == [(SPACE.fixing({"kind": "a"}), {"kind": "a"})]
  assert searcher.sampling_space is SPACE and searcher.ask_fixed == {}  # only during the ask
  searcher.ask(1, fixed={})
  assert seen[-1] == (SPACE, {})
  with pytest.raises(ValueError, match="'kind': value 'c' is outside"):
    searcher.ask(0, fixed={"kind": "c"})
  breaking = BucketBreaking(Counting(), SPACE, AUC)
  assert len(breaking.ask(2, fixed={"kind": "b"})) == 2
  with pytest.raises(RuntimeError, match="breaks the fixed keys"):
    breaking.ask(1, fixed={"kind": "a"})
