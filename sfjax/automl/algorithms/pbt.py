"""Population-based training's exploit and explore (Jaderberg et al. 2017), for every caller.

The vmapped runner owns the population (parameters and hyperparameters stacked
along the trial axis). Exploit is decided by `exploit_sources` (members in the
bottom quantile copy a member of the top quantile: a random one, or PBA's i-th
best for the i-th worst) and carried out by `gather_members` (a gather of every
state leaf along the trial axis); `pbt_exploit_explore` adds PBT's explore (the
copied hyperparameters are multiplied by a random factor from `perturb` and
clipped to the space's bounds). Callers: the CTR PBT population
(`sfjax.cohorts.pbt_population`), PBA's augmentation search
(`sfjax.vision.augment_search`) and the search driver through them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
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


def exploit_sources(scores: Sequence[float] | np.ndarray, quantile: float,
                    rng: np.random.Generator | None = None, maximize: bool = True) -> np.ndarray:
  """PBT's exploit: the member each of P members continues from.

  The bottom floor(P * quantile) members (at least one when P >= 2; NaN ranks
  last, ties by member index) copy a member of the top as many: with `rng` each a
  random one (PBT's truncation selection), without it the i-th worst copies the
  i-th best (PBA's pairing, Ho et al. 2019). Every other member keeps itself.

  Args:
    scores: [P] each member's latest score.
    quantile: the fraction in (0, 0.5] of members that copy / are copied.
    rng: the decision's randomness (one `choice` of P * quantile draws), or None.
    maximize: whether higher scores are better.

  Returns:
    [P] int64 source index (`gather_members` carries it out).

  Raises:
    ValueError: naming `scores` or `quantile` when malformed.
  """
  top, bottom = _top_and_bottom(scores, quantile, maximize)
  source = np.arange(np.shape(scores)[0], dtype=np.int64)
  if rng is not None:
    source[bottom] = rng.choice(top, size=top.size)
  else:
    source[bottom[::-1]] = top  # the worst copies the best, the second worst the second best
  return source


def _top_and_bottom(scores, quantile: float, maximize: bool) -> tuple[np.ndarray, np.ndarray]:
  """(top, bottom): the best `count` members best first, the worst `count` worst last."""
  scores = np.asarray(scores, dtype=np.float64)
  if scores.ndim != 1:
    raise ValueError(f"scores must be [P], got shape {scores.shape}")
  if not 0 < quantile <= 0.5:
    raise ValueError(f"quantile must be in (0, 0.5], got {quantile}")
  size = scores.shape[0]
  count = max(1, int(size * quantile)) if size >= 2 else 0
  key = np.where(np.isnan(scores), np.inf, -scores if maximize else scores)
  order = np.argsort(key, kind="stable")  # best first
  return order[:count], order[size - count:]


def gather_members(tree: Any, source_index) -> Any:
  """Exploit carried out: member i of every leaf ([P, ...]) becomes member `source_index[i]`."""
  source_index = jnp.asarray(source_index, jnp.int32)
  return jax.tree.map(lambda x: jnp.take(x, source_index, axis=0), tree)


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
  if not perturb:
    raise ValueError("perturb needs at least one factor")
  _top_and_bottom(scores, quantile, maximize)  # validates scores and quantile first
  size = np.shape(scores)[0]
  for name, values in hparams.items():
    if np.shape(values) != (size,):
      raise ValueError(f"hparams[{name!r}] has shape {np.shape(values)}, expected ({size},)")
  source = exploit_sources(scores, quantile, rng, maximize)
  bottom = _top_and_bottom(scores, quantile, maximize)[1]  # the copies, in rank order
  count = bottom.size
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
    out: dict[str, tuple[float, float]] = {}
    for k in hparams:
      param = bounds[k] if k in bounds else None
      if isinstance(param, (Int, Float)):
        out[k] = (param.low, param.high)
    return out
  return {k: tuple(v) for k, v in bounds.items()}
