"""`Config`: one point of a search space, a frozen mapping dotted key -> scalar.

Only active parameters appear. Values are JSON scalars (str, int, float, bool,
None), so a config round-trips through JSON exactly and can key a dict (cohorts
group trials by the architecture part of their configs).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from sfjax.core.errors import ConfigError

Scalar = str | int | float | bool | None


class SpaceConfigError(ConfigError):
  """A config that does not fit its space; `key` names the offending parameter.

  A `sfjax.core.errors.ConfigError` (the one base of config errors), with the
  space language's message form `<key>: <reason>`.
  """

  def __init__(self, key: str, reason: str):
    self.key = key
    self.reason = reason
    super().__init__(f"{key}: {reason}")


class ForbiddenConfigError(SpaceConfigError):
  """A config that matches a forbidden clause; `key` lists the clause's keys."""

  def __init__(self, clause):
    self.clause = clause
    super().__init__(", ".join(k for k, _ in clause.pairs), f"matches forbidden clause {clause!r}")


def same_value(a: Scalar, b: Scalar) -> bool:
  """Equality that keeps bool apart from int (`True != 1`) but lets `1 == 1.0`."""
  if isinstance(a, bool) or isinstance(b, bool):
    return isinstance(a, bool) and isinstance(b, bool) and a == b
  if isinstance(a, (int, float)) and isinstance(b, (int, float)):
    return a == b
  return type(a) is type(b) and a == b


def as_scalar(key: str, value: Any) -> Scalar:
  """`value` as a plain Python JSON scalar (numpy scalars converted).

  Raises:
    SpaceConfigError: naming `key`, for a non-scalar or non-finite value.
  """
  if isinstance(value, np.generic):
    value = value.item()
  if value is None or isinstance(value, (str, bool, int)):
    return value
  if isinstance(value, float):
    if not math.isfinite(value):
      raise SpaceConfigError(key, f"value {value!r} is not finite")
    return value
  raise SpaceConfigError(key, f"value {value!r} of type {type(value).__name__} is not a JSON scalar")


class Config(Mapping[str, Scalar]):
  """Frozen, hashable mapping of dotted key -> scalar, sorted by key.

  Args:
    values: a mapping (or iterable of pairs) of dotted key -> JSON scalar.
  """

  __slots__ = ("_items", "_dict", "_hash")
  _items: tuple[tuple[str, Scalar], ...]
  _dict: dict[str, Scalar]
  _hash: int

  def __init__(self, values: Mapping[str, Any] | Any = ()):
    raw = dict(values)
    for key in raw:
      if not isinstance(key, str) or not key:
        raise SpaceConfigError(repr(key), "config keys must be non-empty strings")
    items = tuple((k, as_scalar(k, raw[k])) for k in sorted(raw))
    object.__setattr__(self, "_items", items)
    object.__setattr__(self, "_dict", dict(items))
    object.__setattr__(self, "_hash", hash(items))

  def __setattr__(self, name, value):
    raise AttributeError("Config is immutable")

  def __reduce__(self):
    return (Config, (self._dict,))

  def __copy__(self):
    return self

  def __deepcopy__(self, memo):
    return self

  def __getitem__(self, key: str) -> Scalar:
    return self._dict[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._dict)

  def __len__(self) -> int:
    return len(self._items)

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other) -> bool:
    if not isinstance(other, Mapping) or set(self) != set(other):
      return False
    return all(same_value(v, other[k]) for k, v in self._items)

  def __repr__(self) -> str:
    return f"Config({self._dict!r})"

  def to_dict(self) -> dict[str, Scalar]:
    """A plain dict copy (dotted keys)."""
    return dict(self._items)

  def to_json(self) -> str:
    """Compact JSON object with sorted keys; floats keep every bit."""
    return json.dumps(self._dict, sort_keys=True, allow_nan=False)

  @classmethod
  def from_json(cls, text: str) -> Config:
    """Inverse of `to_json`.

    Raises:
      SpaceConfigError: when `text` is not a JSON object of scalars.
    """
    try:
      data = json.loads(text)
    except json.JSONDecodeError as e:
      raise SpaceConfigError("<json>", f"not valid JSON: {e}") from None
    if not isinstance(data, dict):
      raise SpaceConfigError("<json>", f"expected a JSON object, got {type(data).__name__}")
    return cls(data)

  def to_nested_dict(self) -> dict[str, Any]:
    """`{'model.mlp.width': 64}` -> `{'model': {'mlp': {'width': 64}}}`."""
    nested: dict[str, Any] = {}
    for key, value in self._items:
      *parents, leaf = key.split(".")
      node = nested
      for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
          raise SpaceConfigError(key, f"prefix {part!r} is also a value")
      node[leaf] = value
    return nested

  def agrees(self, values: Mapping[str, Any]) -> bool:
    """Whether every key of `values` present in this config holds the same value.

    Keys absent here (inactive parameters) do not count: the test of a config
    against the fixed keys of an architecture-aware ask (`Space.fixing`).
    """
    return all(same_value(self._dict[k], as_scalar(k, v)) for k, v in values.items()
               if k in self._dict)

  def section(self, prefix: str) -> dict[str, Scalar]:
    """Values under `prefix`, keyed relative to it: what a sub-module is built from."""
    head = prefix + "."
    return {k[len(head):]: v for k, v in self._items if k.startswith(head)}
