"""Tests for the deep interaction blocks and their sub-spaces (sfjax/models/deep_blocks.py)."""

import chex
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.models import deep_blocks
from sfjax.models.field_layout import BlockInputs
from sfjax.models.pair_blocks import BlockShape

SHAPE = BlockShape(num_fields=2, num_vectors=2, vector_dim=2, x0_dim=3, has_first_order=False)
X0 = np.array([[1.0, 2.0, -1.0]], np.float32)
INPUTS = BlockInputs(vectors=jnp.asarray([[[1.0, 0.0], [0.5, 2.0]]]), x0=jnp.asarray(X0),
                     weights=None)


def test_cross_network_by_hand():
  block = deep_blocks.CrossNetwork({"layers": 1, "rank": 0}, SHAPE, to_logit=False,
                                   rngs=nnx.Rngs(0))
  w = np.arange(9, dtype=np.float32).reshape(3, 3) / 10
  b = np.array([0.1, -0.2, 0.3], np.float32)
  block.layers[0].kernel[...] = jnp.asarray(w)
  block.layers[0].bias[...] = jnp.asarray(b)
  chex.assert_trees_all_close(block(INPUTS), X0 * (X0 @ w + b) + X0, rtol=1e-6)
  empty = deep_blocks.CrossNetwork({"layers": 0, "rank": 0}, SHAPE, to_logit=False,
                                   rngs=nnx.Rngs(0))
  chex.assert_trees_all_close(empty(INPUTS), X0)


def test_feature_widths_and_logit_heads():
  cin = deep_blocks.CINBlock({"layer_dims": [3, 2]}, SHAPE, to_logit=False, rngs=nnx.Rngs(0))
  chex.assert_shape(cin(INPUTS), (1, 5))
  att = deep_blocks.SelfAttention({"layers": 2, "heads": 2, "head_dim": 3}, SHAPE,
                                  to_logit=False, rngs=nnx.Rngs(0))
  chex.assert_shape(att(INPUTS), (1, 2 * 2 * 3))
  att_logit = deep_blocks.SelfAttention({"layers": 1, "heads": 1, "head_dim": 2}, SHAPE,
                                        to_logit=True, rngs=nnx.Rngs(0))
  chex.assert_shape(att_logit(INPUTS), (1,))
  assert att_logit.head.kernel.shape == (4, 1) and att_logit.head.bias is None


def test_sub_spaces_map_to_spec_parameters():
  rng = np.random.default_rng(0)
  cross = deep_blocks.CrossNetwork.spec_from_config(deep_blocks.CrossNetwork.space().sample(rng))
  assert set(cross) == {"layers", "rank"}
  cin = deep_blocks.CINBlock.spec_from_config({"depth": 2, "width": 16})
  assert cin == {"layer_dims": [16, 16]}
  att = deep_blocks.SelfAttention.spec_from_config(deep_blocks.SelfAttention.space().sample(rng))
  assert set(att) == {"layers", "heads", "head_dim"}
  assert deep_blocks.layer_dims_from_config({"depth": 0, "width": 8}) == []
  assert "width" in deep_blocks.tower_space() and "depth" in deep_blocks.bottom_space()
