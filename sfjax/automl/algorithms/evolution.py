"""Regularised (aging) evolution, Real et al. 2019 (arXiv 1802.01548), batched.

The population is the `population_size` most recently finished successful trials:
each new result pushes out the oldest, not the worst, which is the 'aging' that
regularises the search. The first `population_size` suggestions are random; after
that each child is a one-parameter mutation of the best of a tournament of
`sample_size` members drawn from the population. A batch of `n` children comes
from the same population (the asynchronous variant of the paper, with the batch
as the set of busy workers).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from sfjax.automl.algorithms.base import AlgorithmSpec, Objective, Searcher
from sfjax.automl.space import Categorical, Config, ConfigError, Int, Space

_MUTATION_TRIES = 20


@dataclasses.dataclass(frozen=True)
class RegularizedEvolution(AlgorithmSpec):
  """Aging evolution.

  Attributes:
    population_size: P, the number of most recent results kept.
    sample_size: S, the tournament size (S <= P).
    mutation_scale: standard deviation, in unit-cube coordinates, of the Gaussian
      step applied to a mutated Int / Float parameter (categories are resampled).
    seed: generator seed.
  """

  name: ClassVar[str] = "evolution"
  population_size: int = 20
  sample_size: int = 5
  mutation_scale: float = 0.2
  seed: int = 0

  def __post_init__(self):
    if not 1 <= self.sample_size <= self.population_size:
      raise ValueError(f"RegularizedEvolution: need 1 <= sample_size ({self.sample_size}) <= "
                       f"population_size ({self.population_size})")
    if not self.mutation_scale > 0:
      raise ValueError(f"RegularizedEvolution.mutation_scale must be > 0, got {self.mutation_scale}")

  def build(self, space: Space, objective: Objective) -> Searcher:
    return _EvolutionSearcher(self, space, objective)


def mutate(space: Space, config: Config, rng: np.random.Generator, scale: float) -> Config:
  """`config` with one active parameter changed, respecting conditions and clauses.

  The parameter is chosen uniformly among the active ones that can change. A
  category moves to another choice; an Int / Float takes a Gaussian step of `scale`
  in unit-cube coordinates. Parameters the change activates get fresh random values;
  ones it deactivates disappear. Falls back to a random sample when no mutation
  yields a new, allowed config.
  """
  u = space.encode(config)
  mutable = [i for i, key in enumerate(space.dims) if key in config and _can_change(space[key])]
  for _ in range(_MUTATION_TRIES if mutable else 0):
    i = int(rng.choice(mutable))
    param = space[space.dims[i]]
    v = u.copy()
    inactive = np.array([key not in config for key in space.dims], dtype=bool)
    v[inactive] = rng.random(int(inactive.sum()))  # fresh values for newly active keys
    if isinstance(param, Categorical):
      k = len(param.choices)
      j = int(rng.choice([c for c in range(k) if c != param.index(config[space.dims[i]])]))
      v[i] = (j + 0.5) / k
    else:
      v[i] = np.clip(u[i] + rng.normal(0.0, scale), 0.0, 1.0)
    try:
      decoded = space.decode(v)
      # Unchanged parameters keep their exact values (float decoding is not bit-exact).
      child = space.validate(Config({k: config[k] if k in config and k != space.dims[i] else x
                                     for k, x in decoded.items()}))
    except ConfigError:  # includes ForbiddenConfigError
      continue
    if child != config:
      return child
  return space.sample(rng)


def _can_change(param) -> bool:
  if isinstance(param, Categorical):
    return len(param.choices) > 1
  if isinstance(param, Int):
    return param.size > 1
  return True


class _EvolutionSearcher(Searcher):

  def __init__(self, spec: RegularizedEvolution, space, objective):
    super().__init__(spec, space, objective)
    self._random_issued = 0

  def population(self):
    """The `population_size` most recent successful results, oldest first."""
    return self._done()[-self.spec.population_size:]

  def _propose(self, n):
    population = self.population()
    out = []
    for _ in range(n):
      if self._random_issued < self.spec.population_size or not population:
        self._random_issued += 1
        out.append(self._new_suggestion(self.space.sample(self._rng)))
        continue
      size = min(self.spec.sample_size, len(population))
      contenders = self._rng.choice(len(population), size=size, replace=False)
      parent = min((population[i] for i in contenders), key=lambda r: (r.loss, r.trial_id))
      child = mutate(self.space, parent.suggestion.config, self._rng, self.spec.mutation_scale)
      out.append(self._new_suggestion(child, parent_trial_id=parent.trial_id))
    return out

  def _extra_core(self):
    return {"random_issued": self._random_issued}

  def _load_extra_core(self, core):
    self._random_issued = int(core["random_issued"])
