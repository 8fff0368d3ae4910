"""Tests for `Space`: composition, conditions in action, validation, unit cube, grid, Optuna
(sfjax/automl/space/space.py). Parameters, configs and conditions have their own files."""

import json

import hypothesis
import hypothesis.strategies as st
import numpy as np
import optuna
import pytest

from sfjax.automl.space import (
    INACTIVE_VALUE,
    Bool,
    Categorical,
    Condition,
    Config,
    ConfigError,
    Fixed,
    Float,
    ForbiddenConfigError,
    Int,
    Space,
    SpaceError,
)

MLP = Space({"depth": Int(1, 3), "width": Categorical((64, 128))})


def ctr_space() -> Space:
  """A model space composed from parts, with conditions and a forbidden clause."""
  model = Space({"name": Categorical(("lr", "fm", "deepfm", "dcnv2")),
                 "cross_layers": Int(1, 4)},
                [Condition("cross_layers", "name", "eq", "dcnv2")])
  optim = Space({"name": Categorical(("adam", "sgd")), "lr": Float(1e-4, 1e-1, log=True),
                 "momentum": Float(0.0, 0.99), "nesterov": Bool(), "steps": Fixed(100)},
                [Condition("momentum", "name", "ne", "adam"),
                 Condition("nesterov", "momentum", "in", (0.0,))])
  space = Space.compose({"model": model, "optim": optim})
  space = space.nest("model.mlp", MLP, when=("model.name", "in", ("deepfm", "dcnv2")))
  return space.with_forbidden({"model.name": "dcnv2", "model.mlp.depth": 3})


def expected_active(values) -> set:
  keys = {"model.name", "optim.name", "optim.lr", "optim.steps"}
  if values["model.name"] in ("deepfm", "dcnv2"):
    keys |= {"model.mlp.depth", "model.mlp.width"}
  if values["model.name"] == "dcnv2":
    keys.add("model.cross_layers")
  if values["optim.name"] != "adam":
    keys.add("optim.momentum")
    if values["optim.momentum"] == 0.0:
      keys.add("optim.nesterov")
  return keys


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(seed=st.integers(0, 2**32 - 1))
def test_sample_respects_conditions_and_forbidden(seed):
  space = ctr_space()
  config = space.sample(np.random.default_rng(seed))
  assert set(config) == expected_active(config)
  assert not (config["model.name"] == "dcnv2" and config["model.mlp.depth"] == 3)
  assert space.validate(config) == config
  assert config["optim.steps"] == 100
  assert 1e-4 <= config["optim.lr"] <= 1e-1


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(seed=st.integers(0, 2**32 - 1))
def test_json_and_unit_cube_round_trips(seed, assert_configs_close):
  space = ctr_space()
  config = space.sample(np.random.default_rng(seed))
  assert Config.from_json(config.to_json()) == config
  assert hash(Config.from_json(config.to_json())) == hash(config)
  u = space.encode(config)
  assert u.shape == (space.num_dims,) and np.all((u >= 0) & (u <= 1))
  for i, key in enumerate(space.dims):
    if key not in config:
      assert u[i] == INACTIVE_VALUE
  assert_configs_close(space.decode(u), config)


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(u=st.lists(st.floats(0, 1), min_size=8, max_size=8))
def test_decode_of_any_point_is_valid_or_forbidden(u):
  space = ctr_space()
  assert space.num_dims == 8
  try:
    config = space.decode(u)
  except ForbiddenConfigError as e:
    assert "model.name" in str(e) and "model.mlp.depth" in str(e)
    return
  space.validate(config)


@pytest.mark.parametrize("config, key, fragment", [
    ({"model.name": "lr", "optim.name": "adam", "optim.lr": 0.01, "optim.steps": 100,
      "bogus": 1}, "bogus", "unknown key"),
    ({"model.name": "xgb", "optim.name": "adam", "optim.lr": 0.01, "optim.steps": 100},
     "model.name", "outside"),
    ({"model.name": "lr", "optim.name": "adam", "optim.lr": 2.0, "optim.steps": 100},
     "optim.lr", "outside"),
    ({"model.name": "lr", "optim.name": "adam", "optim.lr": 0.01, "optim.steps": 100,
      "model.mlp.depth": 2}, "model.mlp.depth", "inactive"),
    ({"model.name": "deepfm", "optim.name": "adam", "optim.lr": 0.01, "optim.steps": 100,
      "model.mlp.depth": 2}, "model.mlp.width", "missing"),
    ({"model.name": "lr", "optim.name": "sgd", "optim.lr": 0.01, "optim.steps": 100,
      "optim.momentum": 0.5, "optim.nesterov": True}, "optim.nesterov", "inactive"),
    ({"model.name": "lr", "optim.name": "adam", "optim.lr": 0.01, "optim.steps": 99},
     "optim.steps", "outside"),
    ({"model.name": "dcnv2", "model.cross_layers": 2, "model.mlp.depth": 3,
      "model.mlp.width": 64, "optim.name": "adam", "optim.lr": 0.01, "optim.steps": 100},
     "model.name, model.mlp.depth", "forbidden"),
])
def test_validate_errors_name_the_key(config, key, fragment):
  with pytest.raises(ConfigError) as info:
    ctr_space().validate(config)
  assert info.value.key == key
  assert key in str(info.value) and fragment in str(info.value)


def test_cycle_is_reported_with_its_keys():
  params = {"a": Categorical((0, 1)), "b": Categorical((0, 1)), "c": Categorical((0, 1)),
            "d": Categorical((0, 1))}
  conditions = [Condition("b", "a", "eq", 1), Condition("c", "b", "eq", 1),
                Condition("a", "c", "eq", 1), Condition("d", "a", "eq", 0)]
  with pytest.raises(SpaceError, match="cycle") as info:
    Space(params, conditions)
  message = str(info.value)
  for key in ("a", "b", "c"):
    assert f" {key} " in f" {message} ".replace("->", " ")
  assert "d" not in message.split(":", 1)[1]
  with pytest.raises(SpaceError, match="cycle: a -> a"):
    Space({"a": Categorical((0, 1))}, [Condition("a", "a", "eq", 1)])


@pytest.mark.parametrize("build, fragment", [
    (lambda: Space({"a": Int(0, 1)}, [Condition("b", "a", "eq", 1)]), "unknown child key 'b'"),
    (lambda: Space({"a": Int(0, 1), "b": Int(0, 1)}, [Condition("b", "a", "eq", 7)]),
     "outside a's domain"),
    (lambda: Space({"a": Int(0, 1)}, forbidden=[{"z": 1}]), "unknown key 'z'"),
    (lambda: Space({"model": Int(0, 1), "model.depth": Int(0, 1)}), "prefix of 'model.depth'"),
    (lambda: Space({"bad key": Int(0, 1)}), "bad key"),
])
def test_bad_definitions_are_rejected(build, fragment):
  with pytest.raises((SpaceError, ConfigError), match=fragment):
    build()


def test_compose_prefixes_and_reports_collisions():
  space = ctr_space()
  assert "model.mlp.depth" in space and "optim.lr" in space
  conds = [c for c in space.conditions if c.parent == "model.name" and c.child.startswith("model.mlp")]
  assert {c.child for c in conds} == {"model.mlp.depth", "model.mlp.width"}
  with pytest.raises(SpaceError, match="'model.mlp.width' is defined twice"):
    space.nest("model.mlp", Space({"width": Int(1, 8)}))
  with pytest.raises(SpaceError, match="'x' is defined twice"):
    Space.compose(Space({"x": Int(0, 1)}), {"": Space({"x": Int(0, 2)})})
  assert Space.from_dict(json.loads(json.dumps(space.to_dict()))) == space


def test_grid_counts_by_hand():
  space = Space({"model": Categorical(("lr", "fm", "deepfm")), "depth": Int(1, 3),
                 "width": Categorical((64, 128)), "lr": Float(1e-3, 1e-1, log=True)},
                [Condition("depth", "model", "eq", "deepfm"),
                 Condition("width", "model", "eq", "deepfm")],
                [{"model": "deepfm", "depth": 3, "width": 128}])
  grid = space.grid(num_points_per_float=2)
  # lr, fm: 1 each; deepfm: 3 depths x 2 widths - 1 forbidden = 5; times 2 learning rates.
  assert len(grid) == (1 + 1 + 5) * 2 == 14
  assert len(set(grid)) == 14
  for config in grid:
    space.validate(config)
  assert sorted({c["lr"] for c in grid}) == pytest.approx([1e-3, 1e-1])
  assert space.grid(num_points_per_float=3)[0]["lr"] == pytest.approx(1e-3)
  assert sorted({c["lr"] for c in space.grid(3)}) == pytest.approx([1e-3, 1e-2, 1e-1])
  assert len(space.grid(1, num_points_per_int=2)) == 1 + 1 + (2 * 2 - 1)


def test_grid_refuses_to_explode():
  with pytest.raises(SpaceError, match="pass num_points_per_int"):
    Space({"n": Int(0, 10**6)}).grid()
  assert len(Space({"n": Int(0, 10**6)}).grid(num_points_per_int=5)) == 5
  space = Space({f"k{i}": Int(0, 9) for i in range(4)})
  with pytest.raises(SpaceError, match="exceeds max_size=1000 configs at key 'k3'"):
    space.grid(max_size=1000)


def test_sample_gives_up_when_everything_is_forbidden():
  space = Space({"a": Bool()}, forbidden=[{"a": True}, {"a": False}])
  with pytest.raises(SpaceError, match="after 7 random draws"):
    space.sample(np.random.default_rng(0), max_tries=7)


def test_optuna_suggest_only_active_params():
  space = ctr_space()
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
  seen = 0
  for _ in range(40):
    trial = study.ask()
    try:
      config = space.suggest(trial)
    except ForbiddenConfigError:
      study.tell(trial, state=optuna.trial.TrialState.FAIL)
      continue
    seen += 1
    space.validate(config)
    assert set(trial.params) == set(config) - {"optim.steps"}
    assert set(space.optuna_distributions(config)) == set(trial.params)
    study.tell(trial, 0.0)
  assert seen > 30


def test_fixing_holds_keys_and_keeps_conditions_and_clauses(model_space):
  fixed = model_space.fixing({"model": np.str_("deepfm"), "depth": np.int64(2)})
  assert fixed["model"] == Fixed("deepfm") and fixed["depth"] == Fixed(2)
  assert fixed.dims == ("width", "lr", "dropout")  # the free keys, in the same order
  assert fixed.conditions == model_space.conditions and fixed.forbidden == model_space.forbidden
  rng = np.random.default_rng(0)
  for _ in range(20):
    config = fixed.sample(rng)
    assert config["model"] == "deepfm" and config["depth"] == 2
    assert model_space.validate(config) == fixed.validate(config)
  # Fixing a parent switches its children off: fixed children then just stay absent.
  fm = model_space.fixing({"model": "fm", "depth": 3})
  assert all(set(fm.sample(rng)) == {"model", "lr", "dropout"} for _ in range(5))
  assert model_space.fixing({}) == model_space


@pytest.mark.parametrize("values, fragment", [
    ({"modle": "fm"}, "'modle': not a parameter"),
    ({"model": "xgb"}, "'model': value 'xgb' is outside"),
    ({"depth": 4}, "'depth': value 4 is outside"),
    ({"depth": 2.0}, "'depth': value 2.0 is outside"),
    ({"lr": 0.5}, "'lr': value 0.5 is outside"),
    ({"lr": float("nan")}, "'lr'.*not finite"),
    ({"model": "dcnv2", "depth": 3}, "every config matches forbidden clause"),
])
def test_fixing_errors_name_the_key(model_space, values, fragment):
  with pytest.raises(SpaceError, match=fragment):
    model_space.fixing(values)


def test_a_clause_on_a_free_parent_does_not_block_fixing(model_space):
  # depth=3 is forbidden only with dcnv2; with the model free, fixing depth=3 is fine.
  fixed = model_space.fixing({"depth": 3})
  rng = np.random.default_rng(1)
  configs = [fixed.sample(rng) for _ in range(30)]
  assert {c["model"] for c in configs} == {"fm", "deepfm"}
  assert all(c.get("depth", 3) == 3 for c in configs)
