"""Tests for the per-field-group embedding layout (sfjax/models/field_layout.py)."""

import chex
import numpy as np
import pytest

from sfjax.automl.space import ConfigError
from sfjax.models import field_layout
from sfjax.models.field_layout import FieldLayout


def test_field_dims_split_fields_into_contiguous_groups():
  assert field_layout.field_dims([4], 3) == (4, 4, 4)
  assert field_layout.field_dims([8, 2], 5) == (8, 8, 8, 2, 2)
  assert field_layout.field_dims([1, 2, 3], 3) == (1, 2, 3)


def test_mixed_dims_read_the_first_d_columns_and_the_last_as_weight():
  layout = FieldLayout(dims=(3, 1), first_order=True)
  assert (layout.vector_dim, layout.flat_dim, layout.width) == (3, 4, 4)
  emb = np.arange(2 * 2 * 4, dtype=np.float32).reshape(2, 2, 4)
  vectors = np.asarray(layout.vectors(emb))
  chex.assert_trees_all_equal(vectors[:, 0], emb[:, 0, :3])
  chex.assert_trees_all_equal(vectors[:, 1], np.stack([emb[:, 1, 0], 0 * emb[:, 1, 0],
                                                       0 * emb[:, 1, 0]], axis=1))
  chex.assert_trees_all_equal(np.asarray(layout.flat(emb)),
                              np.concatenate([emb[:, 0, :3], emb[:, 1, :1]], axis=1))
  chex.assert_trees_all_equal(np.asarray(layout.weights(emb)), emb[..., 3])


def test_equal_dims_flatten_like_a_reshape():
  layout = FieldLayout(dims=(2, 2, 2), first_order=False)
  emb = np.random.default_rng(0).normal(size=(3, 3, 2)).astype(np.float32)
  chex.assert_trees_all_equal(np.asarray(layout.flat(emb)), emb.reshape(3, 6))
  assert layout.width == 2


def test_embedding_space_activates_one_dim_per_group():
  space = field_layout.embedding_space(dims=(2, 4), max_groups=3)
  point = {"num_groups": 2, "group0.dim": 4, "group1.dim": 2}
  assert field_layout.embedding_spec_from_config(space.validate(point)) == {"dims": [4, 2]}
  with pytest.raises(ConfigError, match="group2.dim"):
    space.validate({**point, "group2.dim": 2})
