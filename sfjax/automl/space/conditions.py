"""Conditions (a parameter active only for some parent values) and forbidden clauses.

Both follow VEGA's search-space language (arXiv 2011.01507): a child is active when
its parent EQUALS / NOT_EQUALS / is IN some values; a forbidden clause is a set of
key == value pairs that may not all hold at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sfjax.automl.space.config import Scalar, same_value
from sfjax.automl.space.params import SpaceError

OPS = ("eq", "ne", "in")


@dataclasses.dataclass(frozen=True)
class Condition:
  """`child` is active only when `parent` (itself active) satisfies `op` on `values`.

  Attributes:
    child: dotted key of the conditional parameter.
    parent: dotted key it depends on.
    op: 'eq' (parent == values[0]), 'ne' (parent != values[0]) or 'in'.
    values: a scalar or a sequence of scalars (exactly one for 'eq'/'ne'); stored
      as a tuple.
  """

  child: str
  parent: str
  op: str
  values: Any

  def __post_init__(self):
    if self.op not in OPS:
      raise SpaceError(f"condition on {self.child!r}: op {self.op!r} is not one of {OPS}")
    values = self.values
    values = tuple(values) if isinstance(values, (tuple, list)) else (values,)
    if self.op in ("eq", "ne") and len(values) != 1:
      raise SpaceError(f"condition on {self.child!r}: op {self.op!r} takes one value, got {values}")
    if not values:
      raise SpaceError(f"condition on {self.child!r}: 'in' needs at least one value")
    object.__setattr__(self, "values", values)

  def holds(self, parent_value: Scalar) -> bool:
    """Whether the condition holds for this value of the (active) parent."""
    match = any(same_value(parent_value, v) for v in self.values)
    return not match if self.op == "ne" else match

  def renamed(self, prefix: str) -> Condition:
    """The same condition with both keys under `prefix`."""
    return Condition(join_key(prefix, self.child), join_key(prefix, self.parent), self.op,
                     self.values)

  def to_dict(self) -> dict:
    """JSON-able description; `Condition(**c.to_dict()) == c`."""
    return {"child": self.child, "parent": self.parent, "op": self.op, "values": list(self.values)}


@dataclasses.dataclass(frozen=True)
class Forbidden:
  """A combination that may not occur: all `key == value` pairs holding at once.

  Built from a mapping `{key: value}`; a clause mentioning an inactive (absent) key
  never holds.
  """

  pairs: Any

  def __post_init__(self):
    pairs = tuple(dict(self.pairs).items())
    if not pairs:
      raise SpaceError("a forbidden clause needs at least one key == value pair")
    object.__setattr__(self, "pairs", pairs)

  def __repr__(self):
    return f"Forbidden({dict(self.pairs)!r})"

  def holds(self, values: Mapping[str, Scalar]) -> bool:
    """Whether every pair holds in `values` (a config, possibly partial)."""
    return all(k in values and same_value(values[k], v) for k, v in self.pairs)

  def renamed(self, prefix: str) -> Forbidden:
    """The same clause with its keys under `prefix`."""
    return Forbidden({join_key(prefix, k): v for k, v in self.pairs})

  def to_dict(self) -> dict:
    """JSON-able description; `Forbidden(f.to_dict()) == f`."""
    return dict(self.pairs)


def join_key(prefix: str, key: str) -> str:
  """`prefix.key`, or `key` when `prefix` is empty."""
  return f"{prefix}.{key}" if prefix else key
