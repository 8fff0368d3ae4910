"""Regularised (aging) evolution, Real et al. 2019 (arXiv 1802.01548), batched.

The population is the `population_size` most recently finished successful trials:
each new result pushes out the oldest, not the worst, which is the 'aging' that
regularises the search. The first `population_size` suggestions are random; after
that each child is a one-parameter mutation of the best of a tournament of
`sample_size` members drawn from the population. A batch of `n` children comes
from the same population (the asynchronous variant of the paper, with the batch
as the set of busy workers).

`ask(n, fixed)` keeps children in the bucket of `space.fixing(fixed)`: random
suggestions sample the fixing; a tournament draws from the population members
that agree with `fixed` when any do (their one-parameter mutation changes only
free keys), otherwise from the whole population, and the winner's child is its
projection onto the bucket (`project`: fixed keys set, the keys that stay active
keep their values, newly active ones drawn at random).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from sfjax.automl.algorithms.base import AlgorithmSpec, Objective, Searcher
from sfjax.automl.space import Categorical, Config, ConfigError, ForbiddenConfigError, Int, Space

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


def project(space: Space, config: Config, rng: np.random.Generator) -> Config:
  """`config` moved into `space` (a `fixing` of its space): the nearest config there.

  Fixed keys take their fixed values; every other key active in both keeps its
  exact value; keys the move activates get uniform random values (drawn again
  while the result hits a forbidden clause). Falls back to a random sample of
  `space` when every draw does.
  """
  kept = [(i, space[key].to_unit(config[key])) for i, key in enumerate(space.dims)
          if key in config]
  for _ in range(_MUTATION_TRIES):
    u = rng.random(space.num_dims)
    for i, value in kept:
      u[i] = value
    try:
      decoded = space.decode(u)
      return space.validate(Config({k: config[k] if k in config and k in space.dims else x
                                    for k, x in decoded.items()}))
    except ForbiddenConfigError:
      continue
  return space.sample(rng)


def _can_change(param) -> bool:
  if isinstance(param, Categorical):
    return len(param.choices) > 1
  if isinstance(param, Int):
    return param.size > 1
  return True


class _EvolutionSearcher(Searcher):
  spec: RegularizedEvolution

  def __init__(self, spec: RegularizedEvolution, space, objective):
    super().__init__(spec, space, objective)
    self._random_issued = 0

  def population(self):
    """The `population_size` most recent successful results, oldest first."""
    return self._done()[-self.spec.population_size:]

  def _propose(self, n):
    space, fixed = self.sampling_space, self.ask_fixed
    population = self.population()
    bucket = [r for r in population if r.suggestion.config.agrees(fixed)] if fixed else population
    out = []
    for _ in range(n):
      if self._random_issued < self.spec.population_size or not population:
        self._random_issued += 1
        out.append(self._new_suggestion(space.sample(self._rng)))
        continue
      pool = bucket or population
      size = min(self.spec.sample_size, len(pool))
      contenders = self._rng.choice(len(pool), size=size, replace=False)
      parent = min((pool[i] for i in contenders), key=lambda r: (r.loss, r.trial_id))
      if bucket is pool:
        child = mutate(space, parent.suggestion.config, self._rng, self.spec.mutation_scale)
      else:  # no member in the bucket: moving the winner into it is the mutation
        child = project(space, parent.suggestion.config, self._rng)
      out.append(self._new_suggestion(child, parent_trial_id=parent.trial_id))
    return out

  def _extra_core(self):
    return {"random_issued": self._random_issued}

  def _load_extra_core(self, core):
    self._random_issued = int(core["random_issued"])
