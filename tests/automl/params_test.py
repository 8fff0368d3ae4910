"""Tests for the typed search parameters (sfjax/automl/space/params.py)."""

import math

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from sfjax.automl.space import (
    Bool,
    Categorical,
    Config,
    ConfigError,
    Fixed,
    Float,
    Int,
    Space,
    SpaceError,
)
from sfjax.automl.space.params import param_from_dict


def test_log_float_and_int_lattice_round_trip(assert_configs_close):
  space = Space({"lr": Float(1e-5, 1.0, log=True), "units": Int(8, 512, log=True),
                 "batch": Int(16, 256, step=16)})
  for lr, units, batch in [(1e-5, 8, 16), (1.0, 512, 256), (3e-3, 37, 112)]:
    config = Config({"lr": lr, "units": units, "batch": batch})
    assert_configs_close(space.decode(space.encode(config)), config)
  # log encoding: the geometric midpoint sits at u = 0.5.
  assert space.encode({"lr": 10**-2.5, "units": 8, "batch": 16})[0] == pytest.approx(0.5)
  samples = [space.sample(np.random.default_rng(i)) for i in range(300)]
  assert {s["batch"] % 16 for s in samples} == {0}
  assert min(s["units"] for s in samples) >= 8 and max(s["units"] for s in samples) <= 512
  # Log-uniform: about half the draws below the geometric midpoint 10**-2.5.
  below = np.mean([s["lr"] < 10**-2.5 for s in samples])
  assert 0.4 < below < 0.6


def test_int_cells_are_uniform():
  p = Int(1, 3)
  assert [p.from_unit(u) for u in (0.0, 0.33, 0.34, 0.66, 0.67, 1.0)] == [1, 1, 2, 2, 3, 3]


def test_bool_and_int_values_are_not_confused():
  space = Space({"flag": Bool(), "n": Int(0, 3)})
  with pytest.raises(ConfigError, match="flag"):
    space.validate({"flag": 1, "n": 0})
  with pytest.raises(ConfigError, match="n"):
    space.validate({"flag": True, "n": True})
  with pytest.raises(ConfigError, match="n"):
    space.validate({"flag": True, "n": 1.5})


@pytest.mark.parametrize("build, fragment", [
    (lambda: Int(0, 10, step=3), "divide"),
    (lambda: Int(0, 10, log=True), "low >= 1"),
    (lambda: Float(0.0, 1.0, log=True), "low > 0"),
    (lambda: Float(1.0, 1.0), "must be <"),
    (lambda: Categorical((1, 1.0)), "appears twice"),
    (lambda: Categorical(((1, 2),)), "not a JSON scalar"),
    (lambda: Categorical(()), "at least one choice"),
    (lambda: Int(True, 3), "Int.low must be an int"),
    (lambda: Int(0, 3.0), "Int.high must be an int"),
    (lambda: Int(3, 1), "low 3 > high 1"),
    (lambda: Int(0, 4, step=0), "step 0 must be >= 1"),
    (lambda: Int(1, 9, log=True, step=2), "step == 1"),
    (lambda: Float(0.0, math.inf), "Float.high must be a finite number"),
    (lambda: Float(math.nan, 1.0), "Float.low must be a finite number"),
])
def test_bad_parameters_are_rejected(build, fragment):
  with pytest.raises((SpaceError, ConfigError), match=fragment):
    build()


@pytest.mark.parametrize("param", [
    Categorical(("a", 1, 2.5, None, True)), Bool(), Int(-3, 4), Int(0, 20, step=5),
    Int(1, 1000, log=True), Int(7, 7),
], ids=repr)
def test_every_discrete_value_round_trips_through_its_cell(param):
  values = param.choices if isinstance(param, Categorical) else range(param.low, param.high + 1,
                                                                        param.step)
  for value in values:
    u = param.to_unit(value)
    assert 0.0 <= u <= 1.0
    assert param.from_unit(u) == value and type(param.from_unit(u)) is type(value)


def test_float_unit_mapping():
  linear, log = Float(-2.0, 2.0), Float(1e-4, 1.0, log=True)
  assert (linear.from_unit(0.0), linear.from_unit(0.25), linear.from_unit(1.0)) == (-2.0, -1.0, 2.0)
  ends = (log.from_unit(0.0), log.from_unit(1.0))  # exp(log(x)) may be off by an ulp, but
  assert ends == pytest.approx((1e-4, 1.0), rel=1e-12) and all(map(log.contains, ends))  # inside
  assert log.from_unit(0.5) == pytest.approx(1e-2)
  assert log.to_unit(1e-3) == pytest.approx(0.25)
  for u in (0.1, 0.37, 0.9):
    assert linear.to_unit(linear.from_unit(u)) == pytest.approx(u)
    assert log.to_unit(log.from_unit(u)) == pytest.approx(u)


def test_contains():
  assert Int(0, 10, step=5).contains(5) and Int(0, 10, step=5).contains(np.int64(10))
  assert not Int(0, 10, step=5).contains(3) and not Int(0, 10).contains(11)
  assert not Int(0, 10).contains(2.0) and not Int(0, 10).contains(True)
  assert Float(0.0, 1.0).contains(1) and Float(0.0, 1.0).contains(np.float32(0.5))
  for bad in (True, math.nan, math.inf, 1.5, "0.5"):
    assert not Float(0.0, 1.0).contains(bad), bad
  assert Categorical((1, 2)).contains(1.0) and not Categorical((1, 2)).contains(True)
  assert Bool().contains(False) and not Bool().contains(0)
  assert Fixed(3).contains(3.0) and not Fixed(3).contains(4)


def test_grid_values():
  assert Int(0, 10, step=5).grid_values(3, None) == (0, 5, 10)
  assert Int(0, 100).grid_values(3, 3) == (0, 50, 100)
  assert Int(1, 100, log=True).grid_values(3, 3) == (1, 10, 100)
  assert Int(0, 2).grid_values(3, 10) == (0, 1, 2)  # more points than values: every value
  with pytest.raises(SpaceError, match="num_points_per_int must be >= 1"):
    Int(0, 100).grid_values(3, 0)
  assert Float(0.0, 1.0).grid_values(3, None) == (0.0, 0.5, 1.0)
  log_axis = Float(1e-3, 1e-1, log=True).grid_values(3, None)
  assert log_axis[0] == 1e-3 and log_axis[2] == 1e-1 and log_axis[1] == pytest.approx(1e-2)
  assert Float(1e-3, 1e-1, log=True).grid_values(1, None) == pytest.approx((1e-2,))
  with pytest.raises(SpaceError, match="num_points_per_float must be >= 1"):
    Float(0.0, 1.0).grid_values(0, None)
  assert Categorical(("x", "y")).grid_values(3, None) == ("x", "y")
  assert Fixed("z").grid_values(3, None) == ("z",)


def test_fixed_owns_no_dimension():
  fixed = Fixed(np.int64(100))
  assert fixed.value == 100 and type(fixed.value) is int and fixed.num_dims == 0
  assert fixed.from_unit(0.3) == 100 and fixed.suggest(None, "steps") == 100
  with pytest.raises(SpaceError, match="no unit-cube dimension"):
    fixed.to_unit(100)
  with pytest.raises(SpaceError, match="no Optuna distribution"):
    fixed.optuna_distribution()
  with pytest.raises(ConfigError, match="not finite"):
    Fixed(math.nan)


def test_bool_is_a_categorical_of_false_true():
  assert Bool().choices == (False, True) and Bool().to_dict() == {"type": "bool"}
  assert Bool() == Bool() and hash(Bool()) == hash(Bool())
  with pytest.raises(TypeError):
    Bool((True,))  # pylint: disable=too-many-function-args


def test_optuna_distributions():
  assert Int(16, 256, log=True).optuna_distribution() == IntDistribution(16, 256, log=True)
  assert Int(0, 10, step=5).optuna_distribution() == IntDistribution(0, 10, step=5)
  assert Float(1e-4, 1.0, log=True).optuna_distribution() == FloatDistribution(1e-4, 1.0, log=True)
  assert Categorical(("a", 1)).optuna_distribution() == CategoricalDistribution(["a", 1])


@pytest.mark.parametrize("param", [
    Categorical(("a", 1, None)), Bool(), Int(0, 20, step=5), Int(1, 64, log=True),
    Float(-1.0, 1.0), Float(1e-4, 1.0, log=True), Fixed("adam"),
], ids=repr)
def test_param_from_dict_inverts_to_dict(param):
  assert param_from_dict("k", param.to_dict()) == param


def test_param_from_dict_errors_name_the_key():
  with pytest.raises(SpaceError, match="optim.lr: unknown parameter type 'real'"):
    param_from_dict("optim.lr", {"type": "real", "low": 0, "high": 1})
  with pytest.raises(SpaceError, match="optim.lr: bad float parameter"):
    param_from_dict("optim.lr", {"type": "float", "low": 0.0})
  with pytest.raises(SpaceError, match="model.kind: bad categorical parameter"):
    param_from_dict("model.kind", {"type": "categorical"})
