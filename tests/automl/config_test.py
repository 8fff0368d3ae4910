"""Tests for `Config`, one point of a search space (sfjax/automl/space/config.py)."""

import copy
import json
import math
import pickle

import numpy as np
import pytest

from sfjax.automl.space import (
  Config,
  ConfigError,
  Forbidden,
  ForbiddenConfigError,
  SpaceConfigError,
)
from sfjax.automl.space.config import as_scalar, same_value
from sfjax.core import errors


def test_config_is_a_frozen_hashable_mapping():
  config = Config({"model.mlp.width": np.int64(64), "model.name": "fm", "optim.lr": np.float32(0.5)})
  assert type(config["model.mlp.width"]) is int and type(config["optim.lr"]) is float
  assert config.to_nested_dict() == {"model": {"mlp": {"width": 64}, "name": "fm"},
                                     "optim": {"lr": 0.5}}
  assert config.section("model") == {"mlp.width": 64, "name": "fm"}
  assert {config: 1}[Config(dict(config))] == 1
  with pytest.raises(AttributeError):
    config.x = 1
  with pytest.raises(ConfigError, match="not finite"):
    Config({"a": float("nan")})
  with pytest.raises(ConfigError, match="expected a JSON object"):
    Config.from_json("[1, 2]")
  assert Config({"a": True}) != Config({"a": 1})


@pytest.mark.parametrize("a, b, same", [
    (1, 1.0, True), (1, 1, True), (0.5, 0.5, True), ("x", "x", True), (None, None, True),
    (True, True, True), (True, 1, False), (1, True, False), (False, 0, False), (False, 0.0, False),
    ("1", 1, False), (None, 0, False), (None, "None", False), (1, 2, False),
])
def test_same_value_keeps_bool_apart_from_numbers(a, b, same):
  assert same_value(a, b) is same and same_value(b, a) is same


def test_as_scalar_converts_numpy_and_names_the_key():
  assert type(as_scalar("k", np.int32(3))) is int and type(as_scalar("k", np.float64(2.5))) is float
  assert type(as_scalar("k", np.bool_(True))) is bool and as_scalar("k", None) is None
  with pytest.raises(ConfigError, match=r"^model\.width: value \[1\] of type list is not a JSON"):
    as_scalar("model.width", [1])
  with pytest.raises(ConfigError, match=r"^lr: value inf is not finite"):
    as_scalar("lr", math.inf)
  with pytest.raises(ConfigError, match="not a JSON scalar"):
    as_scalar("k", np.zeros(2))


def test_keys_are_sorted_and_checked():
  config = Config({"b": 1, "a.z": 2, "a": 3})
  assert list(config) == ["a", "a.z", "b"] and len(config) == 3
  assert repr(config) == "Config({'a': 3, 'a.z': 2, 'b': 1})"
  assert Config([("b", 1), ("a", 2)]) == Config({"a": 2, "b": 1})  # pairs accepted
  for bad in ("", 1, None):
    with pytest.raises(ConfigError, match="config keys must be non-empty strings") as info:
      Config({bad: 1})
    assert info.value.key == repr(bad)


def test_equality_with_plain_mappings():
  config = Config({"a": 1, "b": "x"})
  assert config == {"a": 1.0, "b": "x"} and config == Config({"b": "x", "a": 1})
  assert config != {"a": 1} and config != {"a": 1, "b": "x", "c": 0}
  assert config != {"a": True, "b": "x"}
  assert config != [("a", 1), ("b", "x")]  # not a mapping
  assert hash(Config({"a": 1})) == hash(Config({"a": 1}))


def test_json_round_trip_keeps_every_float_bit():
  config = Config({"b": 0.1 + 0.2, "a": 1 / 3, "c": 5e-324, "d": -0.0, "e": None, "f": True,
                   "g": 7, "h": "s"})
  text = config.to_json()
  assert list(json.loads(text)) == sorted(config)
  back = Config.from_json(text)
  assert back == config and hash(back) == hash(config)
  for key, value in config.items():
    assert type(back[key]) is type(value)
    if isinstance(value, float):
      assert back[key].hex() == value.hex()
  with pytest.raises(ConfigError, match="not valid JSON") as info:
    Config.from_json("{'a': 1}")
  assert info.value.key == "<json>"
  with pytest.raises(ConfigError, match=r"^x: value \{'y': 1\} of type dict"):
    Config.from_json('{"x": {"y": 1}}')


def test_nested_dict_and_section():
  with pytest.raises(ConfigError, match=r"^a\.b: prefix 'a' is also a value"):
    Config({"a": 1, "a.b": 2}).to_nested_dict()
  config = Config({"optim.lr": 0.1, "optim.beta.1": 0.9, "optimizer": "adam"})
  assert config.section("optim") == {"lr": 0.1, "beta.1": 0.9}  # not 'optimizer'
  assert config.section("optim.beta") == {"1": 0.9}
  assert config.section("model") == {}
  assert Config().to_nested_dict() == {} and len(Config()) == 0


def test_pickle_and_copies():
  config = Config({"a": 1, "b.c": 0.5})
  back = pickle.loads(pickle.dumps(config))
  assert back == config and hash(back) == hash(config) and isinstance(back, Config)
  assert copy.copy(config) is config and copy.deepcopy(config) is config
  with pytest.raises(TypeError):
    config["a"] = 2  # pylint: disable=unsupported-assignment-operation


def test_errors_carry_key_and_reason():
  error = SpaceConfigError("optim.lr", "too large")
  assert (error.key, error.reason, str(error)) == ("optim.lr", "too large", "optim.lr: too large")
  assert isinstance(error, ValueError)
  clause = Forbidden({"model.name": "dcnv2", "model.mlp.depth": 3})
  forbidden = ForbiddenConfigError(clause)
  assert isinstance(forbidden, SpaceConfigError) and forbidden.clause == clause
  assert forbidden.key == "model.name, model.mlp.depth"
  assert "matches forbidden clause Forbidden(" in str(forbidden)


def test_agrees_ignores_absent_keys_and_keeps_bool_apart():
  config = Config({"model": "fm", "lr": 0.01, "flag": True, "n": 2})
  assert config.agrees({}) and config.agrees({"model": "fm", "depth": 3})
  assert config.agrees({"n": np.int64(2), "lr": 0.01}) and config.agrees({"n": 2.0})
  assert not config.agrees({"model": "deepfm"})
  assert not config.agrees({"flag": 1})


def test_one_config_error_base():
  # The space language's error is a subclass of the one ConfigError, under its own name.
  assert ConfigError is errors.ConfigError
  assert issubclass(SpaceConfigError, errors.ConfigError) and SpaceConfigError is not ConfigError
  with pytest.raises(errors.ConfigError, match=r"^lr: value inf is not finite"):
    Config({"lr": float("inf")})
