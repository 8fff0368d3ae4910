"""Tests for quota filters (sfjax/automl/study/quota.py)."""

import pytest

from sfjax.automl.space import Config
from sfjax.automl.study import Quota, check_quotas, limit_quotas

CONFIG = Config({"model.width": 128, "model.depth": 3, "optim.lr": 0.01})


def params(config):
  return config["model.width"] ** 2 * config["model.depth"]  # 49152 for CONFIG


@pytest.mark.parametrize("expression", [
    "params less than 5", "params <", "< 5", "params => 5", "2 < params", "params < 5 6",
])
def test_bad_expressions_are_rejected(expression):
  with pytest.raises(ValueError, match="expected '<name> <op> <number>'") as info:
    Quota(expression)
  assert repr(expression) in str(info.value)


def test_limit_must_be_a_number():
  with pytest.raises(ValueError, match=r"quota 'params < lots': 'lots' is not a number"):
    Quota("params < lots")
  assert Quota("  params<=2e6 ").expression == "  params<=2e6 "  # spaces are optional


def test_quota_on_a_measure_accepts_and_rejects():
  accept = Quota("params < 5e4", {"params": params})
  assert accept.evaluate(CONFIG) == ({"params": 49152.0}, None)
  reject = Quota("params < 4e4", {"params": params})
  measured, reason = reject.evaluate(CONFIG)
  assert measured == {"params": 49152.0}
  assert reason == "quota 'params < 4e4' failed: params = 49152"


@pytest.mark.parametrize("op, passes", [
    ("<", False), ("<=", True), (">", False), (">=", True), ("==", True), ("!=", False),
])
def test_every_operator(op, passes):
  quota = Quota(f"model.depth {op} 3")
  measured, reason = quota.evaluate(CONFIG)
  assert measured == {"model.depth": 3.0}
  assert (reason is None) == passes
  if not passes:
    assert reason == f"quota 'model.depth {op} 3' failed: model.depth = 3"


def test_a_none_config_value_is_named():
  with pytest.raises(ValueError, match=r"quota 'model.depth < 3': config key 'model.depth' is None"):
    Quota("model.depth < 3").evaluate(Config({"model.depth": None}))


def test_quota_on_a_config_key_and_on_an_absent_key():
  assert Quota("optim.lr <= 0.1").evaluate(CONFIG) == ({"optim.lr": 0.01}, None)
  assert Quota("optim.lr > 0.1").evaluate(CONFIG)[1] == \
      "quota 'optim.lr > 0.1' failed: optim.lr = 0.01"
  # An inactive (absent) key always passes and measures nothing.
  assert Quota("model.cross_layers < 0").evaluate(CONFIG) == ({}, None)
  # A measure takes precedence over a config key of the same name.
  assert Quota("model.width < 10", {"model.width": lambda c: 1}).evaluate(CONFIG) == \
      ({"model.width": 1.0}, None)


def test_check_quotas_returns_the_first_reason_naming_its_quota():
  calls = []

  def no_deep_models(config):
    calls.append(config)
    return "too deep" if config["model.depth"] > 2 else None

  def never_called(config):
    raise AssertionError("filters after the first rejection must not run")

  size = Quota("params < 1e6", {"params": params})
  assert check_quotas([], CONFIG) == ({}, None)
  assert check_quotas([size, Quota("optim.lr < 1")], CONFIG) == \
      ({"params": 49152.0, "optim.lr": 0.01}, None)
  measured, reason = check_quotas([size, Quota("model.width <= 64"), never_called], CONFIG)
  assert measured == {"params": 49152.0, "model.width": 128.0}
  assert reason == "quota 'model.width <= 64' failed: model.width = 128"
  measured, reason = check_quotas([size, no_deep_models, never_called], CONFIG)
  assert (measured, reason) == ({"params": 49152.0}, "too deep") and calls == [CONFIG]


def test_callable_reasons_become_strings():
  assert check_quotas([lambda config: 42], CONFIG) == ({}, "42")
  assert check_quotas([lambda config: None], CONFIG) == ({}, None)


def test_limit_quotas_skip_zero_limits_and_name_missing_measures():
  quotas = limit_quotas({"flops": 2e5, "latency_ms": 0, "params": 10}, {
      "flops": lambda c: 3e5, "latency_ms": lambda c: 1.0, "params": lambda c: 5})
  assert [q.expression for q in quotas] == ["flops <= 200000.0", "params <= 10"]
  assert check_quotas(quotas, Config({})) == ({"flops": 3e5}, "quota 'flops <= 200000.0' "
                                              "failed: flops = 300000")
  with pytest.raises(ValueError, match="'latency_ms'.*no measure"):
    limit_quotas({"latency_ms": 5.0}, {})
  with pytest.raises(ValueError, match="'flops'.*not a finite number"):
    limit_quotas({"flops": float("nan")}, {"flops": lambda c: 1})
