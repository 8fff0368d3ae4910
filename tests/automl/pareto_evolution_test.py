"""pareto_evolution: ranked / front / choose by hand, an archive-keeping evolution on an
exact toy objective, and clear errors."""

import math

import numpy as np
import pytest

from sfjax.automl import pareto
from sfjax.automl.pareto_evolution import (
  Candidate,
  candidate_front,
  choose,
  evolve,
  ranked_candidates,
)

G = 8  # toy genome: 8 bits; valid = share of the first 4 set, cost = bits set


def _toy_evaluate(calls):
  def evaluate(genomes):
    calls.append(np.asarray(genomes).shape)
    valid = np.asarray(genomes)[:, :4].mean(axis=1)
    return valid, valid - 0.01  # test: another number, never selected on
  return evaluate


def _flip(rng, genome):
  flips = rng.random(genome.shape) < 0.25
  return np.where(flips, 1 - genome, genome).astype(np.int32)


def _c(genome, cost, valid, size=None):
  return Candidate(genome, cost, valid, valid - 0.1, cost if size is None else size)


def _dominates(a, b):
  return a.valid >= b.valid and a.cost <= b.cost and (a.valid > b.valid or a.cost < b.cost)


def test_front_ranked_and_choose_by_hand():
  cands = [_c((1,), 100, 0.9), _c((2,), 50, 0.89), _c((3,), 60, 0.8), _c((4,), 10, 0.5),
           _c((5,), 50, 0.89), _c((6,), 70, 0.85)]
  front = candidate_front(cands)
  assert [c.genome for c in front] == [(4,), (2,), (5,), (1,)]  # cheapest first, ties kept
  # rank 0 by valid down, then rank 1 ((3,) and (6,)), each by valid down then cost
  assert [c.genome for c in ranked_candidates(cands)] == [(1,), (2,), (5,), (4,), (6,), (3,)]
  assert choose(front, 0.9, 0.02).genome == (2,)  # the cheapest within the drop
  assert choose(front, 0.9, 0.0).genome == (1,)
  assert choose(front, 0.99, 0.0).genome == (1,)  # none within: the best valid score
  assert choose(front, 0.5, 0.5).genome == (4,)
  assert candidate_front([]) == [] and ranked_candidates([]) == []


def test_nan_scores_never_reach_the_front():
  cands = [_c((1,), 5, math.nan), _c((2,), 10, 0.6), _c((3,), 20, 0.7)]
  assert [c.genome for c in candidate_front(cands)] == [(2,), (3,)]
  assert ranked_candidates(cands)[-1].genome == (1,)


def test_evolution_keeps_an_archive_and_improves_the_front():
  calls = []
  start = np.random.default_rng(0).integers(0, 2, (4, G)).astype(np.int32)
  def cost_of(g):
    return int(np.sum(g))
  first = evolve(start, _toy_evaluate(calls), cost_of, _flip, 0, np.random.default_rng(1))
  more = evolve(start, _toy_evaluate(calls), cost_of, _flip, 6, np.random.default_rng(1),
                size_of=lambda g: 100 + int(np.sum(g)))
  assert calls == [(4, G)] * 8  # every evaluation is one batch of P genomes
  assert [c.genome for c in first] == [c.genome for c in more[:len(first)]]  # nothing lost
  assert len({c.genome for c in more}) == len(more) and len(first) < len(more) <= 28
  for c in more:
    g = np.asarray(c.genome)
    assert (c.cost, c.size, c.valid) == (g.sum(), 100 + g.sum(), g[:4].mean())
    assert c.test == pytest.approx(c.valid - 0.01)
  assert all(c.size == c.cost for c in first)  # no size_of: size is the cost
  front = candidate_front(more)
  assert not any(_dominates(o, c) for c in front for o in more)
  assert all(any(_dominates(c, o) for c in front) for o in set(more) - set(front))
  assert set(ranked_candidates(more)[:len(front)]) == set(front)
  def points(cs):
    return [[c.valid, c.cost] for c in cs]
  dirs, ref = ("maximize", "minimize"), (-1.0, G + 1)
  assert (pareto.hypervolume_2d(points(front), dirs, ref)
          > pareto.hypervolume_2d(points(candidate_front(first)), dirs, ref))
  again = evolve(start, _toy_evaluate([]), cost_of, _flip, 6, np.random.default_rng(1),
                 size_of=lambda g: 100 + int(np.sum(g)))
  assert again == more  # seeded: the same candidates in the same order


def test_a_duplicate_genome_keeps_its_first_evaluation():
  scores = iter([np.array([0.5, 0.6]), np.array([0.9, 0.9])])
  def evaluate(g):
    return next(scores), np.zeros(len(g))
  out = evolve(np.array([[0, 1], [1, 1]]), evaluate, lambda g: int(g.sum()),
               lambda rng, g: g, 1, np.random.default_rng(0))
  assert [(c.genome, c.valid) for c in out] == [((0, 1), 0.5), ((1, 1), 0.6)]


def test_bad_input_names_the_field():
  evaluate, cost_of = _toy_evaluate([]), lambda g: int(np.sum(g))
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="population"):
    evolve(np.zeros(G, np.int32), evaluate, cost_of, _flip, 1, rng)
  with pytest.raises(ValueError, match="population"):
    evolve(np.zeros((0, G), np.int32), evaluate, cost_of, _flip, 1, rng)
  with pytest.raises(ValueError, match="generations"):
    evolve(np.zeros((2, G), np.int32), evaluate, cost_of, _flip, -1, rng)
  with pytest.raises(ValueError, match="evaluate returned 1 valid"):
    evolve(np.zeros((2, G), np.int32), lambda g: (np.zeros(1), np.zeros(1)), cost_of, _flip,
           0, rng)
  with pytest.raises(ValueError, match="front is empty"):
    choose([], 0.5, 0.1)
