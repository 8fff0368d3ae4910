"""Multi-objective evolution with an archive: a valid score up, a size cost down.

The search loop shared by VEGA's Prune-EA / Quant-EA (arXiv 2011.01507) on a CNN
(`sfjax.vision.compression`) and on a CTR model (`sfjax.compress.prune_search`):
genomes are tuples of ints, each evaluated once (an archive keyed by genome); the
parents of a generation are the best of everything evaluated so far by (Pareto
rank of (valid up, cost down), valid down, cost up), NSGA-II's elitism without
crowding (Deb et al. 2002); children are their mutations. The test score is
carried along only to be reported: nothing here selects on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from sfjax.automl import pareto

_DIRECTIONS = ("maximize", "minimize")  # (valid, cost)


class Candidate(NamedTuple):
  """One evaluated genome.

  Attributes:
    genome: the genome as a tuple of ints (the archive's key).
    cost: the size objective, minimised (e.g. parameters, or stored bits).
    valid: the score selected on, maximised (e.g. valid accuracy or AUC).
    test: the held-out score, only reported.
    size: a reported size figure (e.g. parameters when `cost` is stored bits);
      equal to `cost` when the search has only one.
  """

  genome: tuple[int, ...]
  cost: int
  valid: float
  test: float
  size: int


def _points(candidates: Sequence[Candidate]) -> list[list[float]]:
  return [[c.valid, c.cost] for c in candidates]


def ranked_candidates(candidates: Sequence[Candidate]) -> list[Candidate]:
  """Candidates by (Pareto rank of (valid up, cost down), valid down, cost up).

  Args:
    candidates: any candidates (ties keep their order).

  Returns:
    The same candidates, best first: the parents `evolve` draws from.
  """
  if not candidates:
    return []
  rank = np.empty(len(candidates), np.int64)
  for r, front in enumerate(pareto.non_dominated_sort(_points(candidates), _DIRECTIONS)):
    rank[front] = r
  order = sorted(range(len(candidates)),
                 key=lambda i: (rank[i], -candidates[i].valid, candidates[i].cost))
  return [candidates[i] for i in order]


def candidate_front(candidates: Sequence[Candidate]) -> list[Candidate]:
  """The non-dominated candidates (valid up, cost down), cheapest first.

  Args:
    candidates: any candidates; rows with a NaN score are dominated by every other.

  Returns:
    The front sorted by (cost, valid down); ties keep their order.
  """
  if not candidates:
    return []
  front = pareto.non_dominated_sort(_points(candidates), _DIRECTIONS)[0]
  return sorted((candidates[i] for i in front), key=lambda c: (c.cost, -c.valid))


def choose(front: Sequence[Candidate], reference_valid: float, max_drop: float) -> Candidate:
  """The cheapest front point whose valid score is within `max_drop` of `reference_valid`.

  Args:
    front: candidates, usually `candidate_front`'s.
    reference_valid: the score to stay close to (e.g. the uncompressed model's).
    max_drop: the largest allowed `reference_valid - valid`.

  Returns:
    The cheapest candidate within the drop; the one with the best valid score when
    none is.

  Raises:
    ValueError: when `front` is empty.
  """
  if not front:
    raise ValueError("choose: front is empty (no candidate was evaluated)")
  ok = [c for c in front if c.valid >= reference_valid - max_drop]
  return min(ok, key=lambda c: c.cost) if ok else max(front, key=lambda c: c.valid)


def evolve(population: np.ndarray, evaluate: Callable, cost_of: Callable, mutate: Callable,
           generations: int, rng: np.random.Generator,
           size_of: Callable | None = None) -> list[Candidate]:
  """Multi-objective evolution (valid up, cost down); every evaluated candidate.

  Each generation evaluates P genomes in one `evaluate` call (P stays the batch,
  so a jitted evaluator compiles once); a genome already in the archive keeps
  its first evaluation.

  Args:
    population: [P, G] initial int genomes.
    evaluate: genomes [P, G] -> (valid [P], test [P]).
    cost_of: genome [G] -> int, the size objective (minimised).
    mutate: (rng, genome [G]) -> genome [G].
    generations: rounds of mutation after the initial population (>= 0).
    rng: the search's random stream (parent picks; handed to `mutate`).
    size_of: genome [G] -> int, the reported `Candidate.size` (None: `cost_of`'s).

  Returns:
    Every evaluated candidate, in the order first evaluated.

  Raises:
    ValueError: naming `population`, `generations` or `evaluate` when malformed.
  """
  population = np.asarray(population)
  if population.ndim != 2 or population.shape[0] == 0:
    raise ValueError(f"evolve: population must be [P >= 1, G] genomes, got shape "
                     f"{population.shape}")
  if generations < 0:
    raise ValueError(f"evolve: generations must be >= 0, got {generations}")
  archive: dict[tuple, Candidate] = {}

  def add(genomes):
    valid, test = evaluate(genomes)
    if len(valid) != len(genomes) or len(test) != len(genomes):
      raise ValueError(f"evolve: evaluate returned {len(valid)} valid / {len(test)} test "
                       f"scores for {len(genomes)} genomes")
    for g, v, t in zip(genomes, valid, test, strict=True):
      key = tuple(int(x) for x in g)
      if key not in archive:
        cost = int(cost_of(g))
        size = cost if size_of is None else int(size_of(g))
        archive[key] = Candidate(key, cost, float(v), float(t), size)

  add(population)
  for _ in range(generations):
    parents = ranked_candidates(list(archive.values()))[:len(population)]
    picks = rng.integers(len(parents), size=len(population))
    add(np.stack([mutate(rng, np.asarray(parents[i].genome)) for i in picks]))
  return list(archive.values())
