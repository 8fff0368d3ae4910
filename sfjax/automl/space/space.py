"""Search-space language: typed parameters, conditions, forbidden clauses, composition.

A `Space` maps dotted keys (`model.mlp.width`, `optim.lr`) to typed parameters
(`Categorical`, `Int`, `Float`, `Bool`, `Fixed`; `params.py`). A
`Condition` makes a child parameter active only when its parent EQUALS / NOT_EQUALS
/ is IN some values; conditions form a DAG (checked). A `Forbidden` clause is a set
of key == value pairs that may not all hold at once. Spaces compose: each searchable
module declares its own sub-space and a model's space is `Space.compose` / `nest` of
its parts' (a key defined twice is an error naming it), as in VEGA's search-space
language (arXiv 2011.01507).

Every parameter that is not `Fixed` owns one dimension of the unit cube, in
declaration order; `encode`/`decode` map configs to and from [0, 1]^d, which is what
random, quasi-random and evolutionary search work in (`sample` is `decode` of a
uniform point, with rejection against forbidden clauses).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sfjax.automl.space.conditions import Condition, Forbidden, join_key
from sfjax.automl.space.config import (
  Config,
  ForbiddenConfigError,
  Scalar,
  SpaceConfigError,
  as_scalar,
)
from sfjax.automl.space.params import Fixed, Param, SpaceError, param_from_dict

# Unit-cube value of the dimension of an inactive parameter (`Space.encode`).
INACTIVE_VALUE = 0.5

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class Space:
  """An immutable search space over dotted keys.

  Args:
    params: dotted key -> parameter, in dimension order.
    conditions: `Condition`s; several on one child must all hold.
    forbidden: `Forbidden` clauses (a plain mapping is accepted for one clause).
    domains: the parameters that condition and clause values are checked against
      (default: `params`); `fixing` passes the unfixed ones, so a condition on a
      value other than the fixed one stays legal (it simply never holds).

  Raises:
    SpaceError: bad key, a key that is also a prefix of another key, a condition
      or clause naming an unknown key or a value outside the parent's domain, or a
      condition cycle (the message lists the keys on it).
  """

  def __init__(self, params: Mapping[str, Param], conditions: Iterable[Condition] = (),
               forbidden: Iterable[Forbidden | Mapping[str, Scalar]] = (),
               domains: Mapping[str, Param] | None = None):
    self._params = dict(params)
    self._domains = dict(domains) if domains is not None else self._params
    self._conditions = tuple(conditions)
    self._forbidden = tuple(f if isinstance(f, Forbidden) else Forbidden(f) for f in forbidden)
    self._check_keys()
    self._check_references()
    self._order = self._topological_order()
    self._dims = tuple(k for k, p in self._params.items() if p.num_dims)
    self._conds_of = {k: tuple(c for c in self._conditions if c.child == k) for k in self._params}

  # ---- construction checks ---------------------------------------------
  def _check_keys(self):
    for key, param in self._params.items():
      if not isinstance(key, str) or not _KEY_RE.match(key):
        raise SpaceError(f"bad key {key!r}: expected dotted identifiers like 'model.mlp.width'")
      if not isinstance(param, Param):
        raise SpaceError(f"{key}: expected a parameter (Categorical, Int, ...), got {param!r}")
    for key in self._params:
      parts = key.split(".")
      for i in range(1, len(parts)):
        if ".".join(parts[:i]) in self._params:
          raise SpaceError(f"key {'.'.join(parts[:i])!r} is both a parameter and a prefix of {key!r}")

  def _check_references(self):
    for c in self._conditions:
      if not isinstance(c, Condition):
        raise SpaceError(f"expected a Condition, got {c!r}")
      for role, key in (("child", c.child), ("parent", c.parent)):
        if key not in self._params:
          raise SpaceError(f"condition {c!r}: unknown {role} key {key!r}")
      for v in c.values:
        if not self._domains[c.parent].contains(v):
          raise SpaceError(f"condition {c!r}: value {v!r} is outside {c.parent}'s domain "
                           f"{self._domains[c.parent]!r}")
    for f in self._forbidden:
      for key, v in f.pairs:
        if key not in self._params:
          raise SpaceError(f"forbidden clause {f!r}: unknown key {key!r}")
        if not self._domains[key].contains(v):
          raise SpaceError(f"forbidden clause {f!r}: value {v!r} is outside {key}'s domain")

  def _topological_order(self) -> tuple[str, ...]:
    """Parents before children, otherwise declaration order; a cycle raises."""
    parents: dict[str, list[str]] = {k: [] for k in self._params}
    for c in self._conditions:
      if c.parent == c.child:
        raise SpaceError(f"condition cycle: {c.child} -> {c.child}")
      parents[c.child].append(c.parent)
    order: list[str] = []
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done

    def visit(key, stack):
      if state.get(key) == 2:
        return
      if state.get(key) == 1:
        cycle = stack[stack.index(key):] + [key]
        raise SpaceError("condition cycle: " + " -> ".join(reversed(cycle)))
      state[key] = 1
      for parent in parents[key]:
        visit(parent, stack + [key])
      state[key] = 2
      order.append(key)

    for key in self._params:
      visit(key, [])
    return tuple(order)

  # ---- accessors -------------------------------------------------------
  @property
  def keys(self) -> tuple[str, ...]:
    """All keys, in declaration order."""
    return tuple(self._params)

  @property
  def dims(self) -> tuple[str, ...]:
    """Keys owning a unit-cube dimension (every non-`Fixed` key), in encode order."""
    return self._dims

  @property
  def num_dims(self) -> int:
    """d, the dimension of the unit cube."""
    return len(self._dims)

  @property
  def conditions(self) -> tuple[Condition, ...]:
    """Every condition, in declaration order."""
    return self._conditions

  @property
  def forbidden(self) -> tuple[Forbidden, ...]:
    """Every forbidden clause, in declaration order."""
    return self._forbidden

  def __getitem__(self, key: str) -> Param:
    if key not in self._params:
      raise KeyError(f"unknown key {key!r}; known: {sorted(self._params)}")
    return self._params[key]

  def __contains__(self, key) -> bool:
    return key in self._params

  def __len__(self) -> int:
    return len(self._params)

  def __eq__(self, other):
    return isinstance(other, Space) and self.to_dict() == other.to_dict()

  def __hash__(self):
    return hash(json.dumps(self.to_dict(), sort_keys=True))

  def __repr__(self):
    return f"Space({len(self._params)} params, {len(self._conditions)} conditions, " \
           f"{len(self._forbidden)} forbidden)"

  def to_dict(self) -> dict:
    """JSON-able description (what a study stores to detect a changed space)."""
    return {"params": {k: p.to_dict() for k, p in self._params.items()},
            "conditions": [c.to_dict() for c in self._conditions],
            "forbidden": [f.to_dict() for f in self._forbidden]}

  @classmethod
  def from_dict(cls, data: Mapping) -> Space:
    """Inverse of `to_dict`."""
    return cls({k: param_from_dict(k, d) for k, d in data["params"].items()},
               [Condition(**c) for c in data.get("conditions", ())],
               [Forbidden(f) for f in data.get("forbidden", ())])

  # ---- composition -----------------------------------------------------
  def prefixed(self, prefix: str) -> Space:
    """This space with every key (and condition / clause key) under `prefix`."""
    return Space({join_key(prefix, k): p for k, p in self._params.items()},
                 [c.renamed(prefix) for c in self._conditions],
                 [f.renamed(prefix) for f in self._forbidden])

  @classmethod
  def compose(cls, *parts: Space | Mapping[str, Space]) -> Space:
    """Union of spaces; a mapping part puts each space under its prefix ('' = none).

    Raises:
      SpaceError: naming a key that two parts define.
    """
    spaces = []
    for part in parts:
      if isinstance(part, Space):
        spaces.append(part)
      elif isinstance(part, Mapping):
        spaces.extend(s.prefixed(prefix) for prefix, s in part.items())
      else:
        raise SpaceError(f"compose takes Spaces or {{prefix: Space}} mappings, got {part!r}")
    params: dict[str, Param] = {}
    conditions: list[Condition] = []
    forbidden: list[Forbidden] = []
    for s in spaces:
      for key, param in s._params.items():
        if key in params:
          raise SpaceError(f"key collision while composing spaces: {key!r} is defined twice")
        params[key] = param
      conditions.extend(s._conditions)
      forbidden.extend(s._forbidden)
    return cls(params, conditions, forbidden)

  def nest(self, prefix: str, sub_space: Space,
           when: tuple[str, str, Any] | None = None) -> Space:
    """Adds `sub_space` under `prefix`, optionally active only `when` (parent, op, values).

    `when` conditions every root key of the sub-space (its keys without a parent);
    the others follow them, since a child of an inactive parent is inactive.
    """
    inner = sub_space.prefixed(prefix)
    merged = Space.compose(self, inner)
    if when is None:
      return merged
    parent, op, values = when
    roots = [k for k in inner.keys if not inner._conds_of[k]]
    return merged.with_conditions(*(Condition(k, parent, op, values) for k in roots))

  def with_conditions(self, *conditions: Condition) -> Space:
    """This space plus `conditions`."""
    return Space(self._params, self._conditions + tuple(conditions), self._forbidden)

  def with_forbidden(self, *clauses: Forbidden | Mapping[str, Scalar]) -> Space:
    """This space plus forbidden `clauses`."""
    return Space(self._params, self._conditions, self._forbidden + tuple(clauses))

  def fixing(self, values: Mapping[str, Any]) -> Space:
    """The same space with each key of `values` replaced by `Fixed(value)`.

    Conditions and forbidden clauses are kept, so a config of the fixing is a
    config of this space whose active fixed keys hold their fixed values (a fixed
    key whose parents switch it off is simply absent). What architecture-aware
    asking samples from (`Searcher.ask(n, fixed)`). A fixing is for sampling:
    compose / nest the full space first, then fix it (its conditions may name
    values its fixed parents no longer take, which `Space(...)`, `compose` and
    `from_dict` reject).

    Raises:
      SpaceError: naming the key that is not a parameter of this space, whose value
        is outside the parameter's domain, or a forbidden clause that every config
        of the fixing would match.
    """
    params = dict(self._params)
    for key, value in values.items():
      if key not in self._params:
        raise SpaceError(f"fixing {key!r}: not a parameter of the space; known: "
                         f"{sorted(self._params)}")
      try:
        value = as_scalar(key, value)
      except SpaceConfigError as e:
        raise SpaceError(f"fixing {key!r}: {e.reason}") from None
      if not self._params[key].contains(value):
        raise SpaceError(f"fixing {key!r}: value {value!r} is outside {self._params[key]!r}")
      params[key] = Fixed(value)
    fixed = Space(params, self._conditions, self._forbidden, domains=self._domains)
    certain: dict[str, Scalar] = {}  # keys active in every config of the fixing, with values
    for key in fixed._order:
      param = params[key]
      if isinstance(param, Fixed) and all(c.parent in certain and c.holds(certain[c.parent])
                                          for c in fixed._conds_of[key]):
        certain[key] = param.value
    clause = fixed.violated_clause(certain)
    if clause is not None:
      raise SpaceError(f"fixing {sorted(values)}: every config matches forbidden clause {clause!r}")
    return fixed

  # ---- activity, validation --------------------------------------------
  def is_active(self, key: str, values: Mapping[str, Scalar]) -> bool:
    """Whether `key` is active given its parents' `values` (an absent parent is inactive)."""
    return all(c.parent in values and c.holds(values[c.parent]) for c in self._conds_of[key])

  def violated_clause(self, values: Mapping[str, Scalar]) -> Forbidden | None:
    """The first forbidden clause that `values` satisfies, or None."""
    return next((f for f in self._forbidden if f.holds(values)), None)

  def validate(self, config: Mapping[str, Scalar]) -> Config:
    """Checks `config` against the space and returns it as a `Config`.

    Raises:
      SpaceConfigError: naming the key that is unknown, out of its domain, present while
        inactive or missing while active; `ForbiddenConfigError` naming the keys of
        a forbidden clause that holds.
    """
    for key in config:
      if key not in self._params:
        raise SpaceConfigError(key, f"unknown key; known keys: {sorted(self._params)}")
    for key in self._order:
      active = self.is_active(key, config)
      if active and key not in config:
        raise SpaceConfigError(key, "missing: the parameter is active")
      if not active and key in config:
        conds = ", ".join(map(repr, self._conds_of[key]))
        raise SpaceConfigError(key, f"present but inactive (conditions: {conds})")
      if active and not self._params[key].contains(config[key]):
        raise SpaceConfigError(key, f"value {config[key]!r} is outside {self._params[key]!r}")
    clause = self.violated_clause(config)
    if clause is not None:
      raise ForbiddenConfigError(clause)
    return config if isinstance(config, Config) else Config(config)

  # ---- unit cube -------------------------------------------------------
  def decode(self, u: Sequence[float] | np.ndarray) -> Config:
    """Maps a point of [0, 1]^num_dims to a valid config.

    Values are taken in declaration order of `dims`; the dimensions of inactive
    parameters are ignored. Out-of-range values are clipped to [0, 1].

    Raises:
      ValueError: wrong shape or NaN.
      ForbiddenConfigError: the decoded config matches a forbidden clause.
    """
    values = self._decode_unchecked(u)
    clause = self.violated_clause(values)
    if clause is not None:
      raise ForbiddenConfigError(clause)
    return Config(values)

  def _decode_unchecked(self, u) -> dict[str, Scalar]:
    u = np.asarray(u, dtype=np.float64)
    if u.shape != (self.num_dims,):
      raise ValueError(f"decode expects shape ({self.num_dims},) for dims {self._dims}, got {u.shape}")
    if np.isnan(u).any():
      raise ValueError(f"decode got NaN at dims {[self._dims[i] for i in np.flatnonzero(np.isnan(u))]}")
    u = np.clip(u, 0.0, 1.0)
    position = {k: i for i, k in enumerate(self._dims)}
    values: dict[str, Scalar] = {}
    for key in self._order:
      if self.is_active(key, values):
        param = self._params[key]
        # Only a Fixed parameter owns no dimension.
        values[key] = param.value if isinstance(param, Fixed) else param.from_unit(
            float(u[position[key]]))
    return values

  def encode(self, config: Mapping[str, Scalar]) -> np.ndarray:
    """[num_dims] float64 point in [0, 1]^d; inactive dimensions are `INACTIVE_VALUE`.

    `decode(encode(c)) == c` for every valid `c` (log parameters are encoded in log
    space; integers and categories sit at the centres of their cells).
    """
    config = self.validate(config)
    return np.array([self._params[k].to_unit(config[k]) if k in config else INACTIVE_VALUE
                     for k in self._dims], dtype=np.float64)

  def sample(self, rng: np.random.Generator, max_tries: int = 100) -> Config:
    """A uniformly random valid config (log parameters log-uniform).

    Draws are rejected while they match a forbidden clause.

    Raises:
      SpaceError: no allowed config after `max_tries` draws.
    """
    for _ in range(max_tries):
      values = self._decode_unchecked(rng.random(self.num_dims))
      if self.violated_clause(values) is None:
        return Config(values)
    raise SpaceError(f"no config outside the forbidden clauses {list(self._forbidden)} "
                     f"after {max_tries} random draws; is almost all of the space forbidden?")

  # ---- grid ------------------------------------------------------------
  def grid(self, num_points_per_float: int = 3, num_points_per_int: int | None = None,
           max_size: int = 1_000_000) -> list[Config]:
    """Every combination of per-parameter grid values, respecting conditions and clauses.

    Categorical / Bool parameters take every choice; Int parameters every value
    (or `num_points_per_int` evenly spaced ones, log-spaced when `log`); Float
    parameters `num_points_per_float` evenly spaced points, log-spaced when `log`.
    Inactive parameters are absent, so no config appears twice.

    Raises:
      SpaceError: the grid would exceed `max_size` configs.
    """
    axes = {k: self._params[k].grid_values(num_points_per_float, num_points_per_int)
            for k in self._order}
    configs: list[dict] = [{}]
    for key in self._order:
      grown: list[dict] = []
      for values in configs:
        if self.is_active(key, values):
          grown.extend({**values, key: v} for v in axes[key])
        else:
          grown.append(values)
      if len(grown) > max_size:
        raise SpaceError(f"the grid exceeds max_size={max_size} configs at key {key!r}; use "
                         "fewer points per float / int")
      configs = grown
    return [Config(v) for v in configs if self.violated_clause(v) is None]

  # ---- Optuna bridge ---------------------------------------------------
  def suggest(self, trial) -> Config:
    """Samples a config through an `optuna.Trial`, suggesting only active parameters.

    `Fixed` parameters are not suggested (they are constants). Raises
    `ForbiddenConfigError` when the suggested config matches a forbidden clause;
    the caller tells Optuna the trial failed and asks again.
    """
    values: dict[str, Scalar] = {}
    for key in self._order:
      if self.is_active(key, values):
        param = self._params[key]
        # Fixed parameters (no dimension) are constants, not suggested.
        values[key] = param.value if isinstance(param, Fixed) else param.suggest(trial, key)
    clause = self.violated_clause(values)
    if clause is not None:
      raise ForbiddenConfigError(clause)
    return Config(values)

  def optuna_distributions(self, config: Mapping[str, Scalar]) -> dict:
    """Optuna distributions of the active, non-`Fixed` keys of `config`.

    With the matching `optuna_params`, this replays a finished trial into an Optuna
    study (`optuna.trial.create_trial`).
    """
    config = self.validate(config)
    return {k: self._params[k].optuna_distribution() for k in self._dims if k in config}

  def optuna_params(self, config: Mapping[str, Scalar]) -> dict[str, Scalar]:
    """The values of `config` that Optuna sees (every active, non-`Fixed` key)."""
    return {k: config[k] for k in self._dims if k in config}

