"""Helpers shared by the sfjax.automl tests, as session-scoped fixtures.

Session scope keeps them usable from hypothesis tests (which refuse function-scoped
fixtures); every value here is immutable.
"""

import math

import numpy as np
import pytest

from sfjax.automl.algorithms import Objective
from sfjax.automl.space import Categorical, Condition, Config, Float, Int, Space


@pytest.fixture(scope="session")
def model_space() -> Space:
  """A small CTR-like space: conditional depth / width, one forbidden clause."""
  return Space(
      {"model": Categorical(("fm", "deepfm", "dcnv2")), "depth": Int(1, 3),
       "width": Int(16, 256, log=True), "lr": Float(1e-4, 1e-1, log=True),
       "dropout": Float(0, 0.5)},
      [Condition("depth", "model", "in", ("deepfm", "dcnv2")),
       Condition("width", "model", "in", ("deepfm", "dcnv2"))],
      [{"model": "dcnv2", "depth": 3}])


def _fake_auc(config, budget=None) -> float:
  """A smooth toy objective of a `model_space` config (higher is better)."""
  auc = 0.7 - (np.log10(config["lr"]) + 2.5) ** 2 / 20 - config["dropout"] / 10
  if config["model"] != "fm":
    auc += 0.02 * config["depth"] - (np.log2(config["width"]) - 6) ** 2 / 400
  return float(auc + (0.0 if budget is None else 0.01 * np.log(budget)))


@pytest.fixture(scope="session")
def fake_auc():
  """`fake_auc(config, budget=None) -> float`, a toy objective over `model_space`."""
  return _fake_auc


def _toy_best(spec, trials=60, batch=4):
  """Best loss `spec` finds on a 2-D quadratic with minimum 0 at (1.5, -2)."""
  space = Space({"x": Float(-5.0, 5.0), "y": Float(-5.0, 5.0)})
  searcher = spec.build(space, Objective("loss", "minimize"))
  best = np.inf
  while len(searcher.history) < trials:
    for s in searcher.ask(batch):
      loss = (s.config["x"] - 1.5) ** 2 + (s.config["y"] + 2) ** 2
      best = min(best, loss)
      searcher.tell(s.trial_id, {"loss": loss})
  return best


@pytest.fixture(scope="session")
def toy_best():
  """`toy_best(spec, trials=60, batch=4)`: best loss found on a 2-D quadratic."""
  return _toy_best


def _assert_configs_close(a: Config, b: Config):
  assert set(a) == set(b)
  for k in a:
    if isinstance(a[k], float):
      assert math.isclose(a[k], b[k], rel_tol=1e-9, abs_tol=1e-12), k
    else:
      assert a[k] == b[k] and type(a[k]) is type(b[k]), k


@pytest.fixture(scope="session")
def assert_configs_close():
  """`assert_configs_close(a, b)`: same keys, same types, floats equal to 1e-9."""
  return _assert_configs_close
