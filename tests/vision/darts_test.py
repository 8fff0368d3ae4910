"""DARTS: alpha learns only from the valid loss, genotype by hand, derived network."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.vision import darts
from sfjax.vision.darts_ops import OPS

SPEC = darts.SupernetSpec(channels=3, num_cells=1, num_nodes=2, head_grid=2)


def _batch(seed):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return jax.random.uniform(k1, (4, 6, 6, 1)), jax.random.randint(k2, (4,), 0, 10)


def test_alpha_gets_gradients_only_from_the_valid_loss():
  state, w_tx, a_tx = darts.init_search(jax.random.key(0), SPEC, 1e-2, 1e-1)
  step = jax.jit(chex.assert_max_traces(darts.make_search_step(SPEC, w_tx, a_tx), n=1))
  a, _ = step(state, _batch(1), _batch(2))
  b, _ = step(state, _batch(3), _batch(2))  # other train batch: same alpha, other weights
  c, _ = step(state, _batch(1), _batch(4))  # other valid batch: other alpha
  chex.assert_trees_all_close(a.alpha, b.alpha)
  assert not np.allclose(a.alpha, state.alpha)
  assert not np.allclose(a.alpha, c.alpha)
  assert not np.allclose(a.weights["head"]["w"], b.weights["head"]["w"])
  chex.assert_shape(a.alpha, (SPEC.num_edges, len(OPS)))


def test_discretize_by_hand():
  alpha = np.full((5, len(OPS)), -5.0)
  ix = {name: k for k, name in enumerate(OPS)}
  # node 0: edges 0 (s0), 1 (s1); node 1: edges 2 (s0), 3 (s1), 4 (node 0).
  alpha[0, ix["zero"]] = 9.0  # zero dominates, but only non-zero ops count
  alpha[0, ix["skip"]] = 1.0
  alpha[1, ix["conv_3x3"]] = 3.0
  alpha[2, ix["max_pool_3x3"]] = 0.5
  alpha[3, ix["sep_conv_3x3"]] = 4.0
  alpha[4, ix["avg_pool_3x3"]] = 2.0
  genotype = darts.discretize(alpha, num_nodes=2)
  # edge 0's skip weighs softmax ~ e^1/(e^9+...) -- tiny, so node 0 still has only 2 inputs.
  assert genotype == (((0, "skip"), (1, "conv_3x3")), ((1, "sep_conv_3x3"), (2, "avg_pool_3x3")))
  assert darts.genotype_from_json([[list(p) for p in n] for n in genotype]) == genotype
  with pytest.raises(ValueError, match="source 3"):
    darts.genotype_from_json([[[0, "skip"], [3, "skip"]]])


def test_derived_network_has_only_its_ops_and_trains():
  genotype = (((0, "conv_3x3"), (1, "skip")), ((0, "sep_conv_3x3"), (2, "max_pool_3x3")))
  params = darts.init_derived(jax.random.key(0), genotype, SPEC)
  assert set(params["cells"]["cell0"]) == {"e0", "e1", "e2", "e4"}
  x, _ = _batch(0)
  logits = jax.jit(lambda p, x: darts.apply_derived(p, x, genotype, SPEC))(params, x)
  chex.assert_shape(logits, (4, 10))
  chex.assert_tree_all_finite(logits)


def test_grid_pool_by_hand():
  x = jnp.arange(16.0).reshape(1, 4, 4, 1)
  np.testing.assert_allclose(darts.grid_pool(x, 2), [[2.5, 4.5, 10.5, 12.5]])
  with pytest.raises(ValueError, match="head_grid 3"):
    darts.grid_pool(x, 3)
