"""Quota filters: reject a config before training (VEGA's params / FLOPs / latency quotas).

A filter is either a `Quota` (a simple expression `'<name> <op> <number>'` whose
name is a measure computed from the config, such as a parameter count, or a dotted
config key) or any callable `config -> reason | None`.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping, Sequence

from sfjax.automl.space import Config

_EXPRESSION = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne}


@dataclasses.dataclass(frozen=True)
class Quota:
  """`expression` must hold for a config to be trained, e.g. `Quota('params < 2e6',
  {'params': count_params})`.

  Attributes:
    expression: `'<name> <op> <number>'` with op in <, <=, >, >=, ==, !=.
    measures: name -> function of the config. A name that is not a measure is read
      from the config itself; a quota on an inactive (absent) key always passes.
  """

  expression: str
  measures: Mapping[str, Callable[[Config], float]] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    _parse(self.expression)

  def evaluate(self, config: Config) -> tuple[dict[str, float], str | None]:
    """The measured value (as `{name: value}`) and a rejection reason, or None to accept."""
    name, op, limit = _parse(self.expression)
    if name in self.measures:
      value = float(self.measures[name](config))
    elif name in config:
      raw = config[name]
      if raw is None:
        raise ValueError(f"quota {self.expression!r}: config key {name!r} is None, not a number")
      value = float(raw)
    else:
      return {}, None
    if _OPS[op](value, limit):
      return {name: value}, None
    return {name: value}, f"quota {self.expression!r} failed: {name} = {value:g}"


def _parse(expression: str) -> tuple[str, str, float]:
  """(name, op, limit) of `'<name> <op> <number>'`; ValueError naming the expression."""
  match = _EXPRESSION.match(expression)
  if not match:
    raise ValueError(f"quota {expression!r}: expected '<name> <op> <number>', "
                     f"e.g. 'params < 2e6'")
  name, op, limit = match.groups()
  try:
    return name, op, float(limit)
  except ValueError:
    raise ValueError(f"quota {expression!r}: {limit!r} is not a number") from None


QuotaFilter = Quota | Callable[[Config], str | None]


def check_quotas(filters: Sequence[QuotaFilter],
                 config: Config) -> tuple[dict[str, float], str | None]:
  """Runs every filter; returns the measures taken and the first rejection reason."""
  measured = {}
  for f in filters:
    if isinstance(f, Quota):
      values, reason = f.evaluate(config)
      measured.update(values)
    else:
      reason = f(config)
    if reason is not None:
      return measured, str(reason)
  return measured, None


def limit_quotas(limits: Mapping[str, float],
                 measures: Mapping[str, Callable[[Config], float]]) -> list[Quota]:
  """`Quota('<name> <= <limit>')` for every positive limit (0 or less: no quota).

  Args:
    limits: measure name -> upper limit, e.g. `{'params': 2e6, 'flops': 0, 'latency_ms': 5}`.
    measures: measure name -> function of the config (must cover every positive limit).

  Raises:
    ValueError: a positive limit without a measure, or a limit that is not a finite number.
  """
  quotas = []
  for name, limit in limits.items():
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit != limit \
        or limit in (float("inf"), float("-inf")):
      raise ValueError(f"quota on {name!r}: limit {limit!r} is not a finite number")
    if limit <= 0:
      continue
    if name not in measures:
      raise ValueError(f"quota on {name!r}: no measure of that name (known: {sorted(measures)})")
    quotas.append(Quota(f"{name} <= {limit!r}", {name: measures[name]}))
  return quotas
