"""One model off an AUC-latency front: the fastest within ΔAUC of the best (issue #26).

A hardware-aware search (`study.objectives='auc:max,latency_ms:min'`, NSGA-II / MOTPE)
returns a front of trade-offs; serving wants one model. `select_within_auc(front,
delta)` takes the best AUC on the front, keeps the members whose AUC is at least
`best - delta`, and returns the fastest of them (ties: the higher AUC, then the
earlier member). The fastest such trial of a whole study is always on its front, so
passing every trial gives the same choice up to ties.

Members are `TrialRecord`s or `trials.jsonl` records (dicts with `metrics`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

Member = TypeVar("Member")
_EPS = 1e-12  # float slack: an AUC exactly `delta` below the best is within (0.8 - 0.1 > 0.7)


def _metrics(member: Any) -> Mapping[str, float]:
  """A member's metrics: `member.metrics`, or `member['metrics']` of a record."""
  if isinstance(member, Mapping):
    return member.get("metrics") or {}
  return getattr(member, "metrics", None) or {}


def _value(member: Any, i: int, metric: str) -> float:
  value = _metrics(member).get(metric)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ValueError(f"select_within_auc: front member {i} has no finite {metric!r} "
                     f"(metrics: {sorted(_metrics(member))})")
  return float(value)


def select_within_auc(front: Sequence[Member], delta: float, *, auc: str = "auc",
                      latency: str = "latency_ms") -> Member:
  """The fastest member of `front` whose `auc` is within `delta` of the best.

  Args:
    front: the candidates (typically a study's AUC-latency Pareto front).
    delta: the AUC one is willing to give up (>= 0; 0: the best AUC, the fastest of ties).
    auc, latency: the metrics compared (higher `auc` better, lower `latency` better).

  Returns:
    The chosen member of `front`.

  Raises:
    ValueError: an empty front, a negative or non-finite delta, or a member without a
      finite `auc` / `latency` (naming its index).
  """
  if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < math.inf:
    raise ValueError(f"select_within_auc: delta must be a finite number >= 0, got {delta!r}")
  if not front:
    raise ValueError("select_within_auc: the front is empty (no finished trial has both "
                     f"{auc!r} and {latency!r})")
  points = [(_value(m, i, auc), _value(m, i, latency)) for i, m in enumerate(front)]
  top = max(a for a, _ in points)
  within = [i for i, (a, _) in enumerate(points) if top - a <= delta + _EPS]
  best = min(within, key=lambda i: (points[i][1], -points[i][0], i))
  return front[best]
