"""Tests for random, grid and quasi-random search (sfjax/automl/algorithms/random_search.py)."""

import json

import pytest

from sfjax.automl.algorithms import (
    GridSearch,
    Objective,
    QuasiRandomSearch,
    RandomSearch,
    algorithm_from_dict,
)
from sfjax.automl.space import Bool, Categorical, Config, Fixed, Float, Int, Space, SpaceError

AUC = Objective("auc", "maximize")


def configs(batch):
  return [s.config for s in batch]


def test_random_search_is_seeded_and_batch_independent(model_space):
  a = RandomSearch(seed=3).build(model_space, AUC)
  b = RandomSearch(seed=3).build(model_space, AUC)
  other = RandomSearch(seed=4).build(model_space, AUC)
  first = configs(a.ask(5))
  assert first == configs(b.ask(2)) + configs(b.ask(3))
  assert first != configs(other.ask(5))
  assert len(set(first)) == 5
  for config in first:
    model_space.validate(config)


def test_grid_search_enumerates_then_finishes():
  space = Space({"a": Categorical(("x", "y")), "b": Int(1, 3)})
  searcher = GridSearch().build(space, AUC)
  seen = []
  while not searcher.finished:
    batch = searcher.ask(4)
    seen += [s.config for s in batch]
    for s in batch:
      searcher.tell(s.trial_id, {"auc": 0.5})
  assert len(seen) == 6 and set(seen) == set(space.grid())
  assert searcher.ask(4) == []


def test_grid_search_order_and_shuffle():
  space = Space({"a": Categorical(("x", "y", "z")), "b": Int(1, 4), "c": Float(0.0, 1.0)})
  grid = space.grid(num_points_per_float=2)
  plain = GridSearch(num_points_per_float=2).build(space, AUC)
  assert plain.size == len(grid) == 24
  assert configs(plain.ask(100)) == grid  # in grid order
  assert plain.finished
  shuffled = [configs(GridSearch(num_points_per_float=2, shuffle=True, seed=s).build(space, AUC)
                      .ask(100)) for s in (0, 0, 1)]
  assert shuffled[0] == shuffled[1]  # seeded
  assert shuffled[0] != grid and shuffled[0] != shuffled[2]
  for order in shuffled:
    assert sorted(order, key=Config.to_json) == sorted(grid, key=Config.to_json)


def test_grid_search_thins_int_axes():
  space = Space({"n": Int(0, 100)})
  searcher = GridSearch(num_points_per_int=3).build(space, AUC)
  assert [c["n"] for c in configs(searcher.ask(10))] == [0, 50, 100]


def test_sobol_points_are_stratified():
  space = Space({"x": Float(0.0, 1.0)})
  searcher = QuasiRandomSearch(seed=3).build(space, AUC)
  xs = [s.config["x"] for s in searcher.ask(8)]
  # The first 2^3 points of a (scrambled) Sobol sequence hit each eighth once.
  assert sorted(int(x * 8) for x in xs) == list(range(8))


def test_qmc_name_and_sequence_check():
  assert QuasiRandomSearch.name == "qmc"
  assert algorithm_from_dict({"name": "qmc", "sequence": "halton", "seed": 2}) == \
      QuasiRandomSearch(sequence="halton", seed=2)
  with pytest.raises(ValueError, match="QuasiRandomSearch.sequence: 'lhs' is not"):
    QuasiRandomSearch(sequence="lhs")


@pytest.mark.parametrize("sequence", ["sobol", "halton"])
def test_qmc_points_do_not_depend_on_batch_sizes(sequence, model_space):
  one_by_one = QuasiRandomSearch(sequence=sequence, seed=1).build(model_space, AUC)
  batched = QuasiRandomSearch(sequence=sequence, seed=1).build(model_space, AUC)
  singles = [c for _ in range(6) for c in configs(one_by_one.ask(1))]
  assert singles == configs(batched.ask(4)) + configs(batched.ask(2))
  # Restoring mid-sequence fast-forwards the engine to the same point.
  restored = QuasiRandomSearch(sequence=sequence, seed=1).build(model_space, AUC)
  restored.load_state_dict(json.loads(json.dumps(batched.state_dict())))
  assert configs(restored.ask(3)) == configs(batched.ask(3))


def test_qmc_skips_forbidden_points_then_gives_up():
  space = Space({"a": Categorical((0, 1, 2, 3)), "x": Float(0.0, 1.0)}, forbidden=[{"a": 0}])
  batch = QuasiRandomSearch(seed=0).build(space, AUC).ask(16)
  assert [s.trial_id for s in batch] == list(range(16))  # skipped points use no trial id
  assert {s.config["a"] for s in batch} == {1, 2, 3}
  everything = Space({"flag": Bool()}, forbidden=[{"flag": True}, {"flag": False}])
  with pytest.raises(SpaceError, match="skipped 4 forbidden points in a row"):
    QuasiRandomSearch(max_skips=3).build(everything, AUC).ask(1)


def test_qmc_on_a_space_without_dimensions():
  space = Space({"steps": Fixed(100)})
  searcher = QuasiRandomSearch().build(space, AUC)
  assert configs(searcher.ask(3)) == [Config({"steps": 100})] * 3
  restored = QuasiRandomSearch().build(space, AUC)
  restored.load_state_dict(searcher.state_dict())
  assert [s.trial_id for s in restored.ask(1)] == [3]


def test_grid_fixed_asks_pass_over_points_and_keep_them_for_later():
  space = Space({"a": Categorical(("x", "y")), "n": Int(0, 2)})
  searcher = GridSearch().build(space, AUC)
  grid = space.grid()  # a=x: n=0,1,2; a=y: n=0,1,2
  assert configs(searcher.ask(2, fixed={"a": "y"})) == grid[3:5]
  assert searcher.core_state()["taken"] == [3, 4]
  restored = GridSearch().build(space, AUC)
  restored.load_state_dict(json.loads(json.dumps(searcher.state_dict())))
  for s in (searcher, restored):
    assert configs(s.ask(5)) == grid[:3] + grid[5:]  # skipped ones first, taken ones never
    assert s.finished and s.ask(1) == [] and "taken" not in s.core_state()
  searcher = GridSearch().build(space, AUC)
  assert configs(searcher.ask(9, fixed={"n": 1})) == [grid[1], grid[4]]
  assert searcher.ask(1, fixed={"n": 1}) == [] and not searcher.finished


def test_qmc_fixed_asks_keep_the_free_coordinates_of_the_sequence(model_space):
  fixed = {"model": "deepfm", "width": 32}
  free = QuasiRandomSearch(seed=3).build(model_space, AUC)
  held = QuasiRandomSearch(seed=3).build(model_space, AUC)
  batch = held.ask(8, fixed=fixed)
  points = [free._next_point() for _ in range(8)]  # pylint: disable=protected-access
  dims = model_space.dims
  for s, u in zip(batch, points, strict=True):
    model_space.validate(s.config)
    assert s.config["model"] == "deepfm" and s.config["width"] == 32
    for key in ("depth", "lr", "dropout"):
      assert s.config[key] == model_space[key].from_unit(u[dims.index(key)]), key
  assert held.core_state()["position"] == 8
