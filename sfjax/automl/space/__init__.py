"""Search-space language: typed parameters, conditions, forbidden clauses, configs.

`ConfigError` is `sfjax.core.errors.ConfigError` (the base of every config error);
a point that does not fit its space raises its subclass `SpaceConfigError`.
"""

from sfjax.automl.space.conditions import Condition, Forbidden
from sfjax.automl.space.config import (
  Config,
  ConfigError,
  ForbiddenConfigError,
  Scalar,
  SpaceConfigError,
)
from sfjax.automl.space.params import Bool, Categorical, Fixed, Float, Int, Param, SpaceError
from sfjax.automl.space.space import INACTIVE_VALUE, Space

__all__ = [
    "Bool", "Categorical", "Condition", "Config", "ConfigError", "Fixed", "Float",
    "Forbidden", "ForbiddenConfigError", "INACTIVE_VALUE", "Int", "Param", "Scalar", "Space",
    "SpaceConfigError", "SpaceError",
]
