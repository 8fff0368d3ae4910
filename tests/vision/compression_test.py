"""Compression search: exact pruned sizes, mutations, bits, the front against the unpruned
network and random masks, the evaluator by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.automl import pareto_evolution
from sfjax.vision import cnn, compression, image_data
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
  def c(genome, size, valid, test):
    return pareto_evolution.Candidate(genome, size, valid, test, size)

  cands = [c((1,), 100, 0.9, 0.88), c((2,), 50, 0.89, 0.87), c((3,), 60, 0.8, 0.8),
           c((4,), 10, 0.5, 0.5)]
  front = pareto_evolution.candidate_front(cands)
  assert [x.size for x in front] == [10, 50, 100]
  assert pareto_evolution.choose(front, 0.9, 0.02).size == 50
  assert pareto_evolution.choose(front, 0.99, 0.0).size == 100
  assert pareto_evolution.ranked_candidates(cands)[0].size == 100


# A planted objective: valid = share of the LIVE units kept (the others are dead: free to prune).
LIVE = np.zeros(sum(WIDTHS), bool)
LIVE[[0, 2, 4, 6, 9, 11]] = True


def _planted_scores(genomes):
  score = np.asarray(genomes)[:, LIVE].mean(axis=1)
  return score, score


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_front_dominates_the_unpruned_network_and_random_masks_of_its_sizes(seed):
  # Measured over seeds 0-39 with these settings: the front always holds a cheaper point that
  # keeps every live unit (score 1, the unpruned network's).
  rng = np.random.default_rng(seed)

  def size(g):
    return compression.pruned_param_count(g, WIDTHS)

  out = pareto_evolution.evolve(compression.random_masks(rng, WIDTHS, 6), _planted_scores, size,
                                lambda r, g: compression.mutate_masks(r, g, WIDTHS, 0.1), 8, rng)
  assert len({c.genome for c in out}) == len(out)
  full = np.ones(sum(WIDTHS), np.int32)
  best = [c for c in pareto_evolution.candidate_front(out) if c.valid == 1.0]
  assert best and best[0].size < size(full)  # the unpruned network is dominated
  # Random masks of the best point's sizes (the same parameter count) never score more.
  kept = [int(part.sum()) for part in np.split(np.asarray(best[0].genome), np.cumsum(WIDTHS)[:-1])]
  twins = []
  for _ in range(8):
    twins.append(np.concatenate([np.isin(np.arange(w), rng.choice(w, k, replace=False))
                                 for w, k in zip(WIDTHS, kept, strict=True)]).astype(np.int32))
  assert all(size(t) == best[0].size for t in twins)
  assert np.all(_planted_scores(np.stack(twins))[0] <= best[0].valid)


def _tiny_cnn():
  """CNN (C1, C2, H) = (2, 2, 2) whose logits do not depend on the image: conv weights are 0,
  conv2's biases [1, 3] reach dense1 (identity), dense2 reads unit 0 into class 3 (weight 1)
  and unit 1 into class 7 (weight 0.4); class 5 has bias 1.1. Unpruned logits: class 3 1.0,
  class 7 1.2, class 5 1.1 -> class 7."""
  params = cnn.init_cnn(jax.random.key(0), (2, 2, 2))
  params = jax.tree.map(np.zeros_like, params)
  params["conv1"]["b"] = np.array([1.0, 2.0], np.float32)
  params["conv2"]["b"] = np.array([1.0, 3.0], np.float32)
  params["dense1"]["w"] = np.eye(2, dtype=np.float32)
  params["dense2"]["w"][0, 3], params["dense2"]["w"][1, 7] = 1.0, 0.4
  params["dense2"]["b"][5] = 1.1
  return jax.tree.map(jnp.asarray, params)


def _splits(valid_y, test_y):
  def images(n):
    return np.random.default_rng(n).random((n, 4, 4, 1)).astype(np.float32)

  return image_data.ImageSplits(images(4), np.zeros(4, np.int32), images(len(valid_y)),
                                np.asarray(valid_y, np.int32), images(len(test_y)),
                                np.asarray(test_y, np.int32))


def test_evaluator_prune_scores_by_hand():
  splits = _splits([7, 5, 5], [7, 7, 3, 5])
  evaluate = compression.make_evaluator(compression.PRUNE, _tiny_cnn(), splits, steps=0,
                                        batch_size=2, learning_rate=0.1, seed=0)
  full = np.ones(6, np.int32)
  no_c2_1 = full.copy()
  no_c2_1[3] = 0  # C2 unit 1 off: h = [1, 0] -> class 3 1.0, class 7 0, class 5 1.1 -> 5
  no_c2_0 = full.copy()
  no_c2_0[2] = 0  # C2 unit 0 off: h = [0, 3] -> class 7 1.2 -> 7
  no_h_1 = full.copy()
  no_h_1[5] = 0  # dense1 unit 1 off: as C2 unit 1 off -> 5
  valid, test = evaluate(np.stack([full, no_c2_1, no_c2_0, no_h_1]))
  np.testing.assert_allclose(valid, [1 / 3, 2 / 3, 1 / 3, 2 / 3])
  np.testing.assert_allclose(test, [2 / 4, 1 / 4, 2 / 4, 1 / 4])


def test_evaluator_quant_scores_by_hand():
  splits = _splits([7, 5, 5], [7, 7])
  evaluate = compression.make_evaluator(compression.QUANT, _tiny_cnn(), splits, steps=0,
                                        batch_size=2, learning_rate=0.1, seed=0)
  # dense2 at 2 bits: scale 1, 0.4 -> 0: class 7 reads 0 -> class 5 (its bias is not
  # quantized). At 3 bits: 0.4 -> 1/3, class 7 1.0 < 1.1 -> 5. At 4 bits: 0.4 -> 3/7,
  # class 7 9/7 -> 7. The other layers' grids hold their weights exactly (0, 1).
  genomes = np.array([[32] * 4, [32, 32, 32, 2], [32, 32, 32, 3], [32, 32, 32, 4], [2, 2, 2, 32]])
  valid, test = evaluate(genomes)
  np.testing.assert_allclose(valid, [1 / 3, 2 / 3, 2 / 3, 1 / 3, 1 / 3])
  np.testing.assert_allclose(test, [1.0, 0.0, 0.0, 1.0, 1.0])
  with pytest.raises(ValueError, match="compression kind 'nope'"):
    compression.make_evaluator("nope", _tiny_cnn(), splits, 0, 2, 0.1, 0)


def test_evaluator_fine_tunes_every_genome_alike():
  splits = image_data.load_splits("digits", max_train=64)
  params = cnn.init_cnn(jax.random.key(0), WIDTHS[:2] + (5,))
  evaluate = compression.make_evaluator(compression.PRUNE, params, splits, steps=3,
                                        batch_size=8, learning_rate=1e-2, seed=0)
  full = np.ones(sum(WIDTHS), np.int32)
  half = compression.random_masks(np.random.default_rng(1), WIDTHS, 2)[1]
  valid, test = evaluate(np.stack([full, half, full]))
  assert valid[0] == valid[2] and test[0] == test[2]  # same genome, same batches: same result
  untuned = compression.make_evaluator(compression.PRUNE, params, splits, steps=0,
                                       batch_size=8, learning_rate=1e-2, seed=0)
  assert not np.array_equal(untuned(np.stack([full, half, full]))[0], valid)  # the steps count
