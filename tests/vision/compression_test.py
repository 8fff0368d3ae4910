"""Compression search: exact pruned sizes, mutations, bits, front, a tiny evolution."""

import jax
import numpy as np

from sfjax.automl import pareto_evolution
from sfjax.vision import cnn, compression
from sfjax.vision import conv_layers as layers

WIDTHS = (4, 6, 5)


def test_masks_reduce_the_parameter_count_exactly():
  params = cnn.init_cnn(jax.random.key(0), WIDTHS)
  rng = np.random.default_rng(0)
  for genome in compression.random_masks(rng, WIDTHS, 6):
    small = cnn.prune_cnn(params, compression.split_masks(genome, WIDTHS))
    assert layers.num_params(small) == compression.pruned_param_count(genome, WIDTHS)
  full = np.ones(sum(WIDTHS), np.int32)
  assert compression.pruned_param_count(full, WIDTHS) == layers.num_params(params)
  one_less = full.copy()
  one_less[0] = 0  # one conv1 channel: 9 weights + 1 bias + its 9 x 6 conv2 inputs
  assert compression.pruned_param_count(one_less, WIDTHS) == layers.num_params(params) - 10 - 54


def test_mutations_keep_every_layer_and_stay_on_the_choices():
  rng = np.random.default_rng(0)
  g = np.zeros(sum(WIDTHS), np.int32)
  for _ in range(20):
    m = compression.mutate_masks(rng, g, WIDTHS, rate=0.0)
    assert all(part.sum() >= 1 for part in np.split(m, np.cumsum(WIDTHS)[:-1]))
  bits = compression.random_bits(rng, (2, 4, 8), 5)
  assert (bits[0] == 8).all() and set(np.unique(bits)) <= {2, 4, 8}
  moved = compression.mutate_bits(rng, np.array([2, 8, 4, 4]), (2, 4, 8), rate=1.0)
  assert set(np.abs(np.log2(moved) - np.log2([2, 8, 4, 4]))) <= {0.0, 1.0}
  assert compression.weight_bits([8, 8, 8, 8], WIDTHS) == 8 * sum(cnn.layer_weight_sizes(WIDTHS))


def test_front_and_choice():
  c = lambda genome, size, valid, test: pareto_evolution.Candidate(genome, size, valid, test, size)
  cands = [c((1,), 100, 0.9, 0.88), c((2,), 50, 0.89, 0.87), c((3,), 60, 0.8, 0.8),
           c((4,), 10, 0.5, 0.5)]
  front = pareto_evolution.pareto_front(cands)
  assert [x.size for x in front] == [10, 50, 100]
  assert pareto_evolution.choose(front, 0.9, 0.02).size == 50
  assert pareto_evolution.choose(front, 0.99, 0.0).size == 100
  assert pareto_evolution.ranked(cands)[0].size == 100


def test_evolution_moves_the_front_with_an_exact_objective():
  # valid "accuracy" = share of kept units in the first layer: the best genomes are known.
  evaluate = lambda g: (g[:, :4].mean(axis=1), g[:, :4].mean(axis=1))
  rng = np.random.default_rng(0)
  start = compression.random_masks(rng, WIDTHS, 4)
  out = pareto_evolution.evolve(start, evaluate,
                                lambda g: compression.pruned_param_count(g, WIDTHS),
                                lambda r, g: compression.mutate_masks(r, g, WIDTHS, 0.3), 5, rng)
  assert 4 < len(out) <= 24 and len({c.genome for c in out}) == len(out)
  front = pareto_evolution.pareto_front(out)
  smallest = min(out, key=lambda c: c.size)
  assert front[0].size == smallest.size
  assert max(c.valid for c in front) == 1.0  # the unpruned start scores 1.0, so the front does
