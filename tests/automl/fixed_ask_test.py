"""Tests of architecture-aware asking across the AutoML engine: `Searcher.ask(n, fixed)`
(sfjax/automl/algorithms/*) for every registered algorithm, through `Study.ask(n, fixed)`
(sfjax/automl/study/study.py: journal, quotas, resume). `Space.fixing` on its own is in
space_test, per-algorithm details (grid, qmc, evolution's `project`) in their sibling tests.

The search loop asks one trial freely, then fills its cohort with trials of the same
shape bucket: the first trial's values of the bucket keys are fixed.
"""

import json
import os

import numpy as np
import pytest

from sfjax.automl.algorithms import (
    ALGORITHMS,
    ASHA,
    BOHB,
    GP,
    MOTPE,
    NSGA2,
    PBT,
    TPE,
    GridSearch,
    Hyperband,
    Objective,
    Objectives,
    QuasiRandomSearch,
    RandomSearch,
    RegularizedEvolution,
    SuccessiveHalving,
)
from sfjax.automl.space import Categorical, Condition, Float, Int, Space
from sfjax.automl.study import Quota, Study

# A small conditional space: `family` activates its own sub-keys.
SPACE = Space(
    {"family": Categorical(("fm", "mlp", "cross")), "mlp.depth": Int(1, 3),
     "mlp.width": Int(16, 128, log=True), "cross.layers": Int(1, 4),
     "lr": Float(1e-4, 1e-1, log=True), "dropout": Float(0.0, 0.5)},
    [Condition("mlp.depth", "family", "eq", "mlp"), Condition("mlp.width", "family", "eq", "mlp"),
     Condition("cross.layers", "family", "eq", "cross")])
BUCKET_KEYS = ("family", "mlp.depth", "cross.layers")  # what shapes the compiled program
AUC = Objective("auc", "maximize")
AUC_AND_PARAMS = Objectives.of([AUC, Objective("params", "minimize")])

SPECS = {
    "random": RandomSearch(seed=1),
    "grid": GridSearch(num_points_per_float=3, num_points_per_int=2, seed=1),
    "qmc": QuasiRandomSearch(seed=1),
    "evolution": RegularizedEvolution(population_size=6, sample_size=3, seed=1),
    "tpe": TPE(seed=1, n_startup_trials=4),
    "gp": GP(seed=1, n_startup_trials=12),  # ~1 s per fitted ask here: see the test below
    "successive_halving": SuccessiveHalving(min_budget=1, max_budget=9, eta=3, seed=1),
    "hyperband": Hyperband(min_budget=1, max_budget=9, eta=3, seed=1),
    "asha": ASHA(min_budget=1, max_budget=9, eta=3, seed=1),
    "bohb": BOHB(min_budget=1, max_budget=9, eta=3, n_startup_trials=3, seed=1),
    "pbt": PBT(population_size=4, seed=1),
    "nsga2": NSGA2(population_size=4, seed=1),
    "motpe": MOTPE(n_startup_trials=4, seed=1),
}


def objective_for(spec):
  return AUC_AND_PARAMS if getattr(spec, "multi_objective", False) else AUC


def metrics(suggestion):
  """A toy objective: best lr near 1e-2, deeper / wider a little better, a cost."""
  c = suggestion.config
  auc = 0.7 - (np.log10(c["lr"]) + 2) ** 2 / 20 - c["dropout"] / 10
  auc += 0.01 * c.get("mlp.depth", 0) + 0.005 * c.get("cross.layers", 0)
  auc += 0.01 * np.log(suggestion.budget or 1)
  return {"auc": float(auc), "params": float(c.get("mlp.width", 8) * c.get("mlp.depth", 1))}


def bucket_of(config):
  return {k: config[k] for k in BUCKET_KEYS if k in config}


def cohort_rounds(study, rounds, size=8):
  """`rounds` cohorts of 1 free + `size - 1` fixed trials, all told; returns the cohorts."""
  cohorts = []
  for _ in range(rounds):
    first = study.ask(1)
    if not first:
      break
    rest = study.ask(size - 1, fixed=bucket_of(first[0].config))
    for s in first + rest:
      study.tell(s.trial_id, metrics(s))
    cohorts.append((first[0], rest))
  return cohorts


def test_specs_cover_every_registered_algorithm():
  assert set(SPECS) == set(ALGORITHMS)
  assert all(SPECS[name].name == name for name in SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_fixed_asks_fill_a_cohort_of_one_bucket(name, tmp_path):
  spec = SPECS[name]
  with Study.open(str(tmp_path), SPACE, spec, objective_for(spec)) as study:
    cohorts = cohort_rounds(study, rounds=2 if name == "gp" else 3)
  assert len(cohorts[0][1]) == 7  # the first cohort is full for every algorithm
  families = set()
  for first, rest in cohorts:
    fixed = bucket_of(first.config)
    families.add(first.config["family"])
    for s in rest:
      SPACE.validate(s.config)
      if s.resume_from is None:  # promotions keep their (already trained) configs
        assert bucket_of(s.config) == fixed, (name, s)
        assert set(s.config) == set(first.config)  # the same active keys: one program
  assert sum(len(rest) for _, rest in cohorts) >= 7


@pytest.mark.parametrize("name", ["random", "grid", "qmc", "evolution", "tpe", "asha", "nsga2"])
def test_free_asks_are_unchanged_by_an_empty_fixed(name):
  spec = SPECS[name]
  searchers = [spec.build(SPACE, objective_for(spec)) for _ in range(3)]
  for _ in range(4):
    batches = [searchers[0].ask(3), searchers[1].ask(3, fixed=None), searchers[2].ask(3, fixed={})]
    assert batches[0] == batches[1] == batches[2]
    for searcher, batch in zip(searchers, batches, strict=True):
      for s in batch:
        searcher.tell(s.trial_id, metrics(s))
  assert [x.core_state() for x in searchers[1:]] == [searchers[0].core_state()] * 2


@pytest.mark.parametrize("spec", [TPE(seed=0, n_startup_trials=10),
                                  MOTPE(seed=0, n_startup_trials=10)], ids=lambda s: s.name)
def test_optuna_searchers_learn_across_buckets(spec):
  """A history only of family 'b'; cohorts fixed to family 'a' still find the good x."""
  space = Space({"family": Categorical(("a", "b")), "a.k": Int(1, 4), "x": Float(0.0, 1.0)},
                [Condition("a.k", "family", "eq", "a")])
  searcher = spec.build(space, objective_for(spec))

  def cohort(fixed, size):
    batch = searcher.ask(size, fixed=fixed)
    for s in batch:
      assert s.config.agrees(fixed) and s.config["family"] == fixed["family"]
      searcher.tell(s.trial_id, {"auc": -(s.config["x"] - 0.8) ** 2, "params": 1.0})
    return [s.config["x"] for s in batch]

  for _ in range(5):
    cohort({"family": "b"}, 6)
  xs = cohort({"family": "a"}, 8) + cohort({"family": "a"}, 8)
  # Uniform x: median |x - 0.8| = 0.3. Over seeds 0..11 TPE gave <= 0.12, MOTPE <= 0.16.
  assert np.median(np.abs(np.asarray(xs) - 0.8)) < 0.2, xs


def test_gp_fixed_asks_through_the_fitted_model():
  space = Space({"family": Categorical(("a", "b")), "a.k": Int(1, 4), "x": Float(0.0, 1.0)},
                [Condition("a.k", "family", "eq", "a")])
  searcher = GP(seed=0, n_startup_trials=4).build(space, AUC)
  for s in searcher.ask(5, fixed={"family": "b"}):
    searcher.tell(s.trial_id, {"auc": -(s.config["x"] - 0.8) ** 2})
  (s,) = searcher.ask(1, fixed={"family": "a", "a.k": 3})  # the GP is fitted for it (~1 s)
  assert s.config["family"] == "a" and s.config["a.k"] == 3
  space.validate(s.config)


@pytest.mark.parametrize("fixed, key, fragment", [
    ({"family.depth": 2}, "family.depth", "not a parameter"),
    ({"family": "gbdt"}, "family", "outside"),
    ({"family": "mlp", "mlp.depth": 7}, "mlp.depth", "outside"),
    ({"lr": 1.0}, "lr", "outside"),
    ({"mlp.width": 32.5}, "mlp.width", "outside"),
])
def test_bad_fixed_keys_and_values_raise_naming_the_key(fixed, key, fragment, tmp_path):
  searcher = RandomSearch(seed=0).build(SPACE, AUC)
  for n in (0, 3):
    with pytest.raises(ValueError, match=f"'{key}'.*{fragment}"):
      searcher.ask(n, fixed=fixed)
  assert searcher.core_state()["next_trial_id"] == 0
  with Study.open(str(tmp_path), SPACE, TPE(seed=0), AUC) as study:
    with pytest.raises(ValueError, match=f"'{key}'"):
      study.ask(2, fixed=fixed)
    assert not study.trials()
  with open(os.path.join(str(tmp_path), "journal.jsonl")) as f:
    assert len(f.readlines()) == 1  # the header only: nothing was asked


def test_the_journal_records_fixed_and_quotas_judge_fixed_asks(tmp_path):
  fixed = {"family": "mlp", "mlp.depth": np.int64(2)}
  with Study.open(str(tmp_path), SPACE, RandomSearch(seed=2), AUC,
                  quotas=[Quota("mlp.width <= 40")]) as study:
    batch = study.ask(6, fixed=fixed)
    assert len(batch) == 6
    assert all(s.config["mlp.width"] <= 40 and s.config["mlp.depth"] == 2 for s in batch)
    rejected = [t for t in study.trials() if t.status.value == "rejected"]
    assert rejected and all(t.config["mlp.depth"] == 2 for t in rejected)
  with open(os.path.join(str(tmp_path), "journal.jsonl")) as f:
    asks = [e for e in map(json.loads, f) if e["event"] == "ask"]
  assert asks and all(e["fixed"] == {"family": "mlp", "mlp.depth": 2} for e in asks)


@pytest.mark.parametrize("name", ["grid", "qmc", "evolution", "tpe", "bohb", "nsga2"])
def test_a_resumed_study_asks_what_an_uninterrupted_one_would(name, tmp_path):
  spec = SPECS[name]

  def trials(path, reopen_every_round):
    study = Study.open(path, SPACE, spec, objective_for(spec))
    for _ in range(4):
      cohort_rounds(study, rounds=1, size=4)
      if reopen_every_round:
        study.close()
        study = Study.open(path, SPACE, spec, objective_for(spec))
    study.close()
    return [(t.trial_id, t.config, t.status, t.suggestion.budget) for t in study.trials()]

  assert trials(str(tmp_path / "a"), False) == trials(str(tmp_path / "b"), True)


def test_requeued_trials_go_only_to_asks_they_agree_with(tmp_path):
  path = str(tmp_path)
  with Study.open(path, SPACE, RandomSearch(seed=0), AUC) as study:
    fm = study.ask(2, fixed={"family": "fm"})
    mlp = study.ask(2, fixed={"family": "mlp", "mlp.depth": 1})
  with Study.open(path, SPACE, RandomSearch(seed=0), AUC) as study:  # both re-queued
    again = study.ask(3, fixed={"family": "mlp", "mlp.depth": 1})
    assert [s.trial_id for s in again[:2]] == [s.trial_id for s in mlp]
    assert again[2].trial_id == 4 and again[2].config["mlp.depth"] == 1
    assert [s.trial_id for s in study.ask(5)][:2] == [s.trial_id for s in fm]  # then the rest
    assert study.trial(fm[0].trial_id).attempts == 2
