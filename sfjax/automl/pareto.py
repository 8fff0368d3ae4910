"""Pareto fronts for multi-objective search (e.g. AUC up, parameters and latency down).

Point a dominates point b when a is no worse in every objective and better in at
least one. `non_dominated_sort` peels fronts (Deb et al. 2002, NSGA-II) with an
O(N^2 M) comparison, one point against all at a time, so memory stays O(N M).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_DIRECTIONS = ("maximize", "minimize")


def _as_losses(points, directions: Sequence[str]) -> np.ndarray:
  """[N, M] lower-is-better copy; rows with NaN become +inf everywhere."""
  points = np.asarray(points, dtype=np.float64)
  if points.ndim != 2:
    raise ValueError(f"points must be [N, M], got shape {points.shape}")
  if len(directions) != points.shape[1]:
    raise ValueError(f"{len(directions)} directions for {points.shape[1]} objectives")
  for d in directions:
    if d not in _DIRECTIONS:
      raise ValueError(f"direction {d!r} is not one of {_DIRECTIONS}")
  sign = np.array([-1.0 if d == "maximize" else 1.0 for d in directions])
  losses = points * sign
  losses[np.isnan(losses).any(axis=1)] = np.inf
  return losses


def _dominated(losses: np.ndarray, candidates: np.ndarray) -> np.ndarray:
  """[len(candidates)] whether each candidate is dominated by another candidate."""
  sub = losses[candidates]  # [C, M]
  out = np.zeros(len(candidates), dtype=bool)
  for i, p in enumerate(sub):
    out[i] = bool(np.any(np.all(sub <= p, axis=1) & np.any(sub < p, axis=1)))
  return out


def non_dominated_sort(points, directions: Sequence[str]) -> list[np.ndarray]:
  """Fronts of non-dominated points, best first.

  Args:
    points: [N, M] objective values.
    directions: M of 'maximize' / 'minimize'.

  Returns:
    A list of int64 index arrays (ascending) partitioning range(N); front 0 is the
    Pareto front. Rows with a NaN are dominated by every row without one.
  """
  losses = _as_losses(points, directions)
  remaining = np.arange(losses.shape[0])
  fronts = []
  while remaining.size:
    dominated = _dominated(losses, remaining)
    fronts.append(remaining[~dominated].astype(np.int64))
    remaining = remaining[dominated]
  return fronts


def pareto_front(points, directions: Sequence[str]) -> np.ndarray:
  """[K] int64 indices (ascending) of the non-dominated rows of `points` [N, M].

  Equal points do not dominate each other, so duplicates on the front all stay.
  Rows with a NaN are left out unless every row has one.
  """
  losses = _as_losses(points, directions)
  if losses.shape[0] == 0:
    return np.zeros(0, dtype=np.int64)
  everyone = np.arange(losses.shape[0])
  return everyone[~_dominated(losses, everyone)].astype(np.int64)


def hypervolume_2d(points, directions: Sequence[str], reference: Sequence[float]) -> float:
  """Area dominated by `points` [N, 2] and bounded by `reference` (exact, 2 objectives).

  Args:
    points: [N, 2] objective values.
    directions: 2 of 'maximize' / 'minimize'.
    reference: the bounding point, worse than every point that should count in
      both objectives; points not strictly better than it in both add nothing.

  Returns:
    The area, in the objectives' units (0.0 for no point). Rows with a NaN add nothing.
  """
  losses = _as_losses(points, directions)
  if losses.shape[1] != 2:
    raise ValueError(f"hypervolume_2d needs 2 objectives, got {losses.shape[1]}")
  ref = _as_losses(np.asarray([reference], dtype=np.float64), directions)[0]
  inside = losses[np.all(losses < ref, axis=1)]
  area, best_second = 0.0, ref[1]
  for first, second in inside[np.lexsort((inside[:, 1], inside[:, 0]))]:
    if second < best_second:  # sorted by the first loss: a new step of the staircase
      area += (ref[0] - first) * (best_second - second)
      best_second = second
  return float(area)
