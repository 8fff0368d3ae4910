"""Tests for the pairwise and shallow interaction blocks (sfjax/models/pair_blocks.py).

The pairs restriction is checked by hand on a tiny case: 3 fields, 2-dim vectors.
"""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sfjax.models import pair_blocks
from sfjax.models.field_layout import BlockInputs

V = np.array([[[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]]], np.float32)  # [B=1, F=3, D=2]
# <v0,v1> = 2, <v0,v2> = 0, <v1,v2> = 3
SHAPE = pair_blocks.BlockShape(num_fields=3, num_vectors=3, vector_dim=2, x0_dim=6,
                               has_first_order=True)
INPUTS = BlockInputs(vectors=jnp.asarray(V), x0=jnp.asarray(V.reshape(1, -1)),
                     weights=jnp.asarray([[0.5, -1.0, 2.0]]))


def _block(cls, pairs=None, to_logit=True, shape=SHAPE):
  return cls({"pairs": pairs}, shape, to_logit=to_logit, rngs=nnx.Rngs(0))


def test_fm_sums_every_pair_or_only_the_given_ones():
  chex.assert_trees_all_close(_block(pair_blocks.FMBlock)(INPUTS), jnp.array([5.0]))
  chex.assert_trees_all_close(_block(pair_blocks.FMBlock, [[1, 2]])(INPUTS), jnp.array([3.0]))
  chex.assert_trees_all_close(_block(pair_blocks.FMBlock, [[0, 1], [0, 2]])(INPUTS),
                              jnp.array([2.0]))


def test_inner_product_lists_pairs_row_major_and_restricts():
  block = _block(pair_blocks.InnerProduct, to_logit=False)
  chex.assert_trees_all_close(block(INPUTS), jnp.array([[2.0, 0.0, 3.0]]))
  block = _block(pair_blocks.InnerProduct, [[1, 2], [0, 1]], to_logit=False)
  chex.assert_trees_all_close(block(INPUTS), jnp.array([[3.0, 2.0]]))
  # Routed to the logit it gets a bias-free head over its P features.
  block = _block(pair_blocks.InnerProduct, [[0, 1]], to_logit=True)
  assert block.head is not None and block.head.bias is None


def test_gated_pairs_weigh_each_pair_by_its_gate():
  block = _block(pair_blocks.GatedPairs, [[0, 1], [1, 2]])
  chex.assert_trees_all_close(block(INPUTS), jnp.array([5.0]))  # gates start at 1
  block.gates[...] = jnp.array([0.0, 2.0])
  chex.assert_trees_all_close(block(INPUTS), jnp.array([6.0]))


def test_pairs_skip_the_bottom_vector_which_only_the_default_set_includes():
  z = np.array([[[1.0, 1.0]]], np.float32)
  inputs = INPUTS._replace(vectors=jnp.concatenate([z, V], axis=1))
  shape = SHAPE._replace(num_vectors=4)
  # Field pair (1, 2) is vectors (2, 3) behind z.
  chex.assert_trees_all_close(_block(pair_blocks.FMBlock, [[1, 2]], shape=shape)(inputs),
                              jnp.array([3.0]))
  # Default: every pair of [z, v0, v1, v2]: 5 + <z, v0+v1+v2> = 5 + 7.
  chex.assert_trees_all_close(_block(pair_blocks.FMBlock, shape=shape)(inputs), jnp.array([12.0]))


def test_pairs_outside_the_fields_are_rejected():
  with pytest.raises(ValueError, match="index the 3 fields"):
    _block(pair_blocks.FMBlock, [[1, 3]])


def test_first_order_and_outer_product():
  first = pair_blocks.FirstOrder({}, SHAPE, to_logit=False, rngs=nnx.Rngs(0))
  chex.assert_trees_all_close(first(INPUTS), jnp.array([[1.5]]))
  with pytest.raises(ValueError, match="first-order column"):
    pair_blocks.FirstOrder({}, SHAPE._replace(has_first_order=False), to_logit=True,
                           rngs=nnx.Rngs(0))
  outer = pair_blocks.OuterProduct({}, SHAPE, to_logit=False, rngs=nnx.Rngs(0))
  s = V.sum(axis=1)[0]  # [3, 4]
  chex.assert_trees_all_close(outer(INPUTS), jnp.asarray(np.outer(s, s).reshape(1, 4)))
