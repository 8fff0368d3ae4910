"""Compression genomes: layout, random unit bits, empty-layer fixes, mutation by hand."""

import numpy as np
import pytest

from sfjax.compress import genome

LAYOUT = genome.GenomeLayout((4, 3), ((1, 2, 4), (4, 8, 32)))


def test_layout_sizes():
  assert (LAYOUT.num_bits, LAYOUT.length) == (7, 9)
  assert genome.GenomeLayout((5,)).length == 5
  assert genome.GenomeLayout((), ((2, 4),) * 4).length == 4


def test_random_unit_bits_keep_a_share_of_every_layer_in_the_documented_order():
  rng = np.random.default_rng(0)
  bits = genome.random_unit_bits(rng, (8, 6))
  # The same draws by hand: per layer a share, then which units.
  ref = np.random.default_rng(0)
  expected = np.zeros(14, np.int32)
  for start, width in ((0, 8), (8, 6)):
    share = ref.uniform(0.25, 1.0)
    expected[start + ref.choice(width, max(1, int(round(width * share))), replace=False)] = 1
  np.testing.assert_array_equal(bits, expected)
  for seed in range(20):
    bits = genome.random_unit_bits(np.random.default_rng(seed), (8, 1, 3))
    for part, width in zip(np.split(bits, [8, 9]), (8, 1, 3), strict=True):
      assert 1 <= part.sum() <= width and part.sum() >= round(0.25 * width)


def test_fix_empty_layers_keeps_one_unit():
  bits = np.array([0, 0, 0, 0, 1, 0, 0], np.int32)
  fixed = genome._fix_empty_layers(np.random.default_rng(0), bits, (4, 3))
  assert fixed[:4].sum() == 1 and fixed[4:].tolist() == [1, 0, 0]


def test_mutate_by_hand():
  g = np.array([1, 0, 1, 1, 0, 1, 0, 2, 8], np.int32)
  assert genome.mutate_genome(np.random.default_rng(0), LAYOUT, g, 0.0).tolist() == g.tolist()
  # Rate 1: every bit flips, both choice genes move one step (clipped at the ends).
  rng = np.random.default_rng(3)
  out = genome.mutate_genome(rng, LAYOUT, g, 1.0)
  ref = np.random.default_rng(3)
  ref.random(7), ref.random(2)
  steps = ref.choice([-1, 1], 2)
  assert out[:7].tolist() == [0, 1, 0, 0, 1, 0, 1]
  assert out[7] == (1, 2, 4)[1 + steps[0]] and out[8] == (4, 8, 32)[1 + steps[1]]
  top = np.array([1, 1, 1, 1, 1, 1, 1, 4, 32], np.int32)
  for seed in range(10):
    moved = genome.mutate_genome(np.random.default_rng(seed), LAYOUT, top, 1.0)
    assert moved[7] in (2, 4) and moved[8] in (8, 32)  # never past the last choice
    assert moved[:4].sum() >= 1 and moved[4:7].sum() >= 1  # all flipped off, then fixed
  assert g.tolist() == [1, 0, 1, 1, 0, 1, 0, 2, 8]  # the input is not modified
  with pytest.raises(ValueError, match=r"genome: shape \(3,\), expected \(9,\)"):
    genome.mutate_genome(np.random.default_rng(0), LAYOUT, g[:3], 0.1)


def test_mutating_choices_only_or_bits_only_draws_nothing_else():
  # A bits-only layout draws one uniform per bit (then the fixes); a choices-only layout one
  # uniform and one direction per gene: the CNN searches' streams.
  g = np.array([1, 1, 0, 1, 0, 1, 1], np.int32)
  out = genome.mutate_genome(np.random.default_rng(5), genome.GenomeLayout((4, 3)), g, 0.3)
  ref = np.random.default_rng(5)
  flips = ref.random(7) < 0.3
  np.testing.assert_array_equal(out, np.where(flips, 1 - g, g))  # no layer emptied here
  bits = genome.GenomeLayout((), ((2, 4, 8),) * 3)
  out = genome.mutate_genome(np.random.default_rng(6), bits, np.array([2, 4, 8]), 0.5)
  ref = np.random.default_rng(6)
  moves, steps = ref.random(3) < 0.5, ref.choice([-1, 1], 3)
  index = np.clip(np.array([0, 1, 2]) + np.where(moves, steps, 0), 0, 2)
  np.testing.assert_array_equal(out, np.array([2, 4, 8])[index])
