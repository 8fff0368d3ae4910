"""Population-based training's exploit / explore decision (Jaderberg et al. 2017).

The vmapped runner owns the population (parameters and hyperparameters stacked
along the trial axis); this module only decides. `exploit` = members in the bottom
quantile copy a random member of the top quantile (the runner gathers state along
the trial axis with `source_index`); `explore` = the copied hyperparameters are
multiplied by a random factor from `perturb` and clipped to the space's bounds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from sfjax.automl.algorithms.base import AlgorithmSpec, Objective, Searcher
from sfjax.automl.algorithms.random_search import RandomSearcher
from sfjax.automl.space import Float, Int, Space


@dataclasses.dataclass(frozen=True)
class PBT(AlgorithmSpec):
  """Population-based training: a population of `population_size` members trained together.

  Asking draws a population's initial configs at random (seeded); the runner
  trains the population as one batch (`population_based`), calling
  `pbt_exploit_explore` every `pbt_interval` budget units, and tells each
  member's final result.

  `ask(n, fixed)` draws the initial configs from `space.fixing(fixed)` (as random
  search does), so a whole population can share one bucket. Exploit / explore
  never leaves it: exploit copies members of the same population and explore
  perturbs only the Int / Float hyperparameters the runner passes to
  `pbt_exploit_explore`, so keep bucket keys out of those.
  """

  name: ClassVar[str] = "pbt"
  population_based: ClassVar[bool] = True
  population_size: int = 16
  pbt_interval: float = 1.0
  quantile: float = 0.25
  seed: int = 0

  def __post_init__(self):
    if isinstance(self.population_size, bool) or not isinstance(self.population_size, int) \
        or self.population_size < 2:
      raise ValueError(f"PBT.population_size: needs an integer >= 2, got {self.population_size!r}")
    if not self.pbt_interval > 0:
      raise ValueError(f"PBT.pbt_interval: must be > 0, got {self.pbt_interval!r}")
    if not 0 < self.quantile <= 0.5:
      raise ValueError(f"PBT.quantile: must be in (0, 0.5], got {self.quantile!r}")

  def rounds(self, max_budget: float) -> int:
    """Exploit / explore rounds of a member trained to `max_budget`.

    Raises:
      ValueError: `pbt_interval` does not divide `max_budget` into whole rounds.
    """
    rounds = max_budget / self.pbt_interval
    if rounds < 1 or abs(rounds - round(rounds)) > 1e-9:
      raise ValueError(f"PBT.pbt_interval: {self.pbt_interval} must divide the max budget "
                       f"({max_budget}) into a whole number of rounds")
    return int(round(rounds))

  def build(self, space: Space, objective: Objective) -> Searcher:
    return RandomSearcher(self, space, objective)


def pbt_exploit_explore(
    scores: Sequence[float] | np.ndarray,
    hparams: Mapping[str, np.ndarray],
    rng: np.random.Generator,
    quantile: float = 0.25,
    perturb: Sequence[float] = (0.8, 1.2),
    bounds: Space | Mapping[str, tuple[float, float]] | None = None,
    maximize: bool = True,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """One PBT exploit/explore step over a population of P members.

  Args:
    scores: [P] each member's latest score; NaN ranks last.
    hparams: name -> [P] array of each member's hyperparameter.
    rng: numpy generator (the decision's only randomness).
    quantile: fraction in (0, 0.5] of members that copy / are copied;
      floor(P * quantile) members, at least one when P >= 2.
    perturb: factors; each copied hyperparameter is multiplied by one of them.
    bounds: name -> (low, high) clip range, or a `Space` whose Int / Float
      parameters of the same name give it. Names without bounds are not clipped.
    maximize: whether higher scores are better.

  Returns:
    source_index: [P] int64, the member whose state each member continues from
      (itself unless it is in the bottom quantile).
    new_hparams: name -> [P] array, same dtype as the input (integers rounded).
  """
  scores = np.asarray(scores, dtype=np.float64)
  if scores.ndim != 1:
    raise ValueError(f"scores must be [P], got shape {scores.shape}")
  if not 0 < quantile <= 0.5:
    raise ValueError(f"quantile must be in (0, 0.5], got {quantile}")
  if not perturb:
    raise ValueError("perturb needs at least one factor")
  size = scores.shape[0]
  for name, values in hparams.items():
    if np.shape(values) != (size,):
      raise ValueError(f"hparams[{name!r}] has shape {np.shape(values)}, expected ({size},)")
  count = max(1, int(size * quantile)) if size >= 2 else 0
  key = np.where(np.isnan(scores), np.inf, -scores if maximize else scores)
  order = np.argsort(key, kind="stable")  # best first
  top, bottom = order[:count], order[size - count:]
  source = np.arange(size, dtype=np.int64)
  source[bottom] = rng.choice(top, size=count)
  limits = _bounds(bounds, hparams)
  new_hparams = {}
  for name, values in hparams.items():
    values = np.asarray(values)
    copied = values[source].astype(np.float64)
    copied[bottom] *= rng.choice(np.asarray(perturb, dtype=np.float64), size=count)
    if name in limits:
      copied = np.clip(copied, *limits[name])
    if np.issubdtype(values.dtype, np.integer):
      copied = np.round(copied)
    new_hparams[name] = copied.astype(values.dtype)
  return source, new_hparams


def _bounds(bounds, hparams) -> dict[str, tuple[float, float]]:
  if bounds is None:
    return {}
  if isinstance(bounds, Space):
    return {k: (bounds[k].low, bounds[k].high) for k in hparams
            if k in bounds and isinstance(bounds[k], (Int, Float))}
  return {k: tuple(v) for k, v in bounds.items()}
