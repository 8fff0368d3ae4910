"""Typed search parameters: `Categorical`, `Bool`, `Int`, `Float`, `Fixed`.

Each parameter is a frozen, hashable spec that knows its domain (`contains`), its
cell of the unit interval (`from_unit` / `to_unit`, log-scaled where asked), its
grid axis and its Optuna distribution. `Fixed` owns no dimension.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any

import numpy as np

from sfjax.automl.space.config import Scalar, as_scalar, same_value

# A grid axis longer than this must be thinned with `num_points_per_int`.
_MAX_INT_AXIS = 10_000


class SpaceError(ValueError):
  """A badly defined space (parameter, condition, forbidden clause or composition)."""


class Param(abc.ABC):
  """Base of every parameter type."""

  num_dims = 1

  @abc.abstractmethod
  def contains(self, value: Any) -> bool:
    """Whether `value` is in the domain."""

  @abc.abstractmethod
  def from_unit(self, u: float) -> Scalar:
    """The value of the cell of [0, 1] holding `u`."""

  @abc.abstractmethod
  def to_unit(self, value: Scalar) -> float:
    """A point of [0, 1] that `from_unit` maps back to `value`."""

  @abc.abstractmethod
  def grid_values(self, num_points_per_float: int, num_points_per_int: int | None) -> tuple:
    """The values a grid search tries."""

  @abc.abstractmethod
  def suggest(self, trial, key: str) -> Scalar:
    """Asks an `optuna.Trial` for a value under `key`."""

  @abc.abstractmethod
  def optuna_distribution(self):
    """The matching `optuna.distributions.BaseDistribution`."""

  @abc.abstractmethod
  def to_dict(self) -> dict:
    """JSON-able description."""


def _cell(u: float, n: int) -> int:
  return min(int(u * n), n - 1)


@dataclasses.dataclass(frozen=True)
class Categorical(Param):
  """One of `choices` (JSON scalars; ints, floats, strings, bools or None)."""

  choices: tuple

  def __post_init__(self):
    choices = tuple(as_scalar("choices", c) for c in self.choices)
    if not choices:
      raise SpaceError("Categorical needs at least one choice")
    for i, c in enumerate(choices):
      if any(same_value(c, d) for d in choices[:i]):
        raise SpaceError(f"Categorical choice {c!r} appears twice in {choices}")
    object.__setattr__(self, "choices", choices)

  def contains(self, value):
    return any(same_value(value, c) for c in self.choices)

  def index(self, value) -> int:
    """Position of `value` in `choices`."""
    return next(i for i, c in enumerate(self.choices) if same_value(value, c))

  def from_unit(self, u):
    return self.choices[_cell(u, len(self.choices))]

  def to_unit(self, value):
    return (self.index(value) + 0.5) / len(self.choices)

  def grid_values(self, num_points_per_float, num_points_per_int):
    return self.choices

  def suggest(self, trial, key):
    return trial.suggest_categorical(key, list(self.choices))

  def optuna_distribution(self):
    from optuna.distributions import CategoricalDistribution  # pylint: disable=g-import-not-at-top
    return CategoricalDistribution(list(self.choices))

  def to_dict(self):
    return {"type": "categorical", "choices": list(self.choices)}


@dataclasses.dataclass(frozen=True)
class Bool(Categorical):
  """False or True."""

  choices: tuple = dataclasses.field(default=(False, True), init=False)

  def to_dict(self):
    return {"type": "bool"}


@dataclasses.dataclass(frozen=True)
class Int(Param):
  """An integer in [low, high] on the lattice low + k * step; log-uniform when `log`."""

  low: int
  high: int
  log: bool = False
  step: int = 1

  def __post_init__(self):
    for name in ("low", "high", "step"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise SpaceError(f"Int.{name} must be an int, got {v!r}")
      object.__setattr__(self, name, int(v))
    if self.low > self.high:
      raise SpaceError(f"Int: low {self.low} > high {self.high}")
    if self.step < 1 or (self.high - self.low) % self.step:
      raise SpaceError(f"Int: step {self.step} must be >= 1 and divide high - low = "
                       f"{self.high - self.low}")
    if self.log and (self.low < 1 or self.step != 1):
      raise SpaceError(f"Int(log=True) needs low >= 1 and step == 1, got low={self.low}, "
                       f"step={self.step}")

  @property
  def size(self) -> int:
    """Number of values."""
    return (self.high - self.low) // self.step + 1

  def _log_edges(self) -> tuple[float, float]:
    # Half-integer edges give each integer the cell that rounds to it.
    return math.log(self.low - 0.5), math.log(self.high + 0.5)

  def contains(self, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      return False
    return self.low <= value <= self.high and (value - self.low) % self.step == 0

  def from_unit(self, u):
    if self.log:
      a, b = self._log_edges()
      return int(min(max(round(math.exp(a + u * (b - a))), self.low), self.high))
    return self.low + _cell(u, self.size) * self.step

  def to_unit(self, value):
    if self.log:
      a, b = self._log_edges()
      return (math.log(value) - a) / (b - a)
    return ((value - self.low) // self.step + 0.5) / self.size

  def grid_values(self, num_points_per_float, num_points_per_int):
    if num_points_per_int is None or num_points_per_int >= self.size:
      if self.size > _MAX_INT_AXIS:
        raise SpaceError(f"{self!r} has {self.size} values; pass num_points_per_int")
      return tuple(range(self.low, self.high + 1, self.step))
    if num_points_per_int < 1:
      raise SpaceError(f"num_points_per_int must be >= 1, got {num_points_per_int}")
    if self.log:
      points = np.geomspace(self.low, self.high, num_points_per_int)
    else:
      points = np.linspace(self.low, self.high, num_points_per_int)
    snapped = self.low + np.round((points - self.low) / self.step) * self.step
    return tuple(sorted({int(v) for v in snapped}))

  def suggest(self, trial, key):
    return trial.suggest_int(key, self.low, self.high, step=self.step, log=self.log)

  def optuna_distribution(self):
    from optuna.distributions import IntDistribution  # pylint: disable=g-import-not-at-top
    return IntDistribution(self.low, self.high, log=self.log, step=self.step)

  def to_dict(self):
    return {"type": "int", "low": self.low, "high": self.high, "log": self.log, "step": self.step}


@dataclasses.dataclass(frozen=True)
class Float(Param):
  """A float in [low, high]; log-uniform when `log` (then low > 0)."""

  low: float
  high: float
  log: bool = False

  def __post_init__(self):
    for name in ("low", "high"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not math.isfinite(v):
        raise SpaceError(f"Float.{name} must be a finite number, got {v!r}")
      object.__setattr__(self, name, float(v))
    if not self.low < self.high:
      raise SpaceError(f"Float: low {self.low} must be < high {self.high} (use Fixed for one value)")
    if self.log and self.low <= 0:
      raise SpaceError(f"Float(log=True) needs low > 0, got {self.low}")

  def _edges(self) -> tuple[float, float]:
    return (math.log(self.low), math.log(self.high)) if self.log else (self.low, self.high)

  def contains(self, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
      return False
    return math.isfinite(value) and self.low <= value <= self.high

  def from_unit(self, u):
    a, b = self._edges()
    v = a + u * (b - a)
    return float(min(max(math.exp(v) if self.log else v, self.low), self.high))

  def to_unit(self, value):
    a, b = self._edges()
    return ((math.log(value) if self.log else value) - a) / (b - a)

  def grid_values(self, num_points_per_float, num_points_per_int):
    n = num_points_per_float
    if n < 1:
      raise SpaceError(f"num_points_per_float must be >= 1, got {n}")
    if n == 1:
      return (self.from_unit(0.5),)
    points = [self.from_unit(i / (n - 1)) for i in range(n)]
    return tuple([self.low] + points[1:-1] + [self.high])

  def suggest(self, trial, key):
    return trial.suggest_float(key, self.low, self.high, log=self.log)

  def optuna_distribution(self):
    from optuna.distributions import FloatDistribution  # pylint: disable=g-import-not-at-top
    return FloatDistribution(self.low, self.high, log=self.log)

  def to_dict(self):
    return {"type": "float", "low": self.low, "high": self.high, "log": self.log}


@dataclasses.dataclass(frozen=True)
class Fixed(Param):
  """A constant (present in every config where it is active; owns no dimension)."""

  value: Any
  num_dims = 0

  def __post_init__(self):
    object.__setattr__(self, "value", as_scalar("Fixed.value", self.value))

  def contains(self, value):
    return same_value(value, self.value)

  def from_unit(self, u):
    return self.value

  def to_unit(self, value):
    raise SpaceError("a Fixed parameter has no unit-cube dimension")

  def grid_values(self, num_points_per_float, num_points_per_int):
    return (self.value,)

  def suggest(self, trial, key):
    return self.value

  def optuna_distribution(self):
    raise SpaceError("a Fixed parameter has no Optuna distribution")

  def to_dict(self):
    return {"type": "fixed", "value": self.value}


def param_from_dict(key: str, data: dict) -> Param:
  """Inverse of `Param.to_dict`; errors name `key`."""
  kind = data.get("type")
  fields = {k: v for k, v in data.items() if k != "type"}
  builders = {"categorical": lambda: Categorical(tuple(fields["choices"])), "bool": Bool,
              "int": lambda: Int(**fields), "float": lambda: Float(**fields),
              "fixed": lambda: Fixed(fields["value"])}
  if kind not in builders:
    raise SpaceError(f"{key}: unknown parameter type {kind!r}; expected one of {sorted(builders)}")
  try:
    return builders[kind]()
  except (KeyError, TypeError) as e:
    raise SpaceError(f"{key}: bad {kind} parameter {data!r}: {e}") from None
