"""A bag's pooling as a traced per-trial code: keys, defaults, and weights renormalised by hand."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.cohorts.table_choices import bag_pooling
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data import types
from sfjax.models.behavior import pooling

LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 5), fl.TableSpec("tag", 7), fl.TableSpec("item", 9)),
    (fl.FeatureSpec("user", "user"), fl.FeatureSpec("tags", "tag", "multi_hot", 3, "mean", True),
     fl.FeatureSpec("history", "item", "sequence", 2),
     fl.FeatureSpec("genres", "tag", "multi_hot", 2, "sqrtn")))
SPEC = types.DatasetSpec(tuple(types.FieldSpec(f.name, r) for f, r in
                               zip(LAYOUT.features, (5, 7, 9, 7), strict=True)), 0, LAYOUT)
# [B=2, S=8]: user | tags (3) | history (2) | genres (2); row 1 has an empty genres bag.
WEIGHTS = np.asarray([[1, 1, 2, 2, 1, 1, 3, 4],
                      [1, 0.5, 0, 0, 1, 0, 0, 0]], np.float32)


def test_keys_codes_and_names():
  assert bag_pooling.pooling_key("tags") == "features.tags.pooling"
  assert bag_pooling.pooled_feature("features.tags.pooling") == "tags"
  assert bag_pooling.pooled_feature("model.embed_dim") is None
  assert [bag_pooling.pooling_code("k", v) for v in ("sum", "mean", "sqrtn", 2)] == [0, 1, 2, 2]
  assert bag_pooling.pooling_name(1.0) == "mean"
  for bad in ("max", 3, 1.5, True):
    with pytest.raises(ValueError, match="config key 'features.x.pooling': must be one of"):
      bag_pooling.pooling_code("features.x.pooling", bad)


def test_defaults_are_the_layouts_bags():
  assert bag_pooling.multi_hot_features(SPEC) == (1, 3)
  assert bag_pooling.default_codes(SPEC) == {"features.tags.pooling": 1.0,
                                             "features.genres.pooling": 2.0}
  assert bag_pooling.default_codes(types.DatasetSpec((types.FieldSpec("a", 3),), 0)) == {}
  summed = bag_pooling.summed_spec(SPEC)
  assert [f.pooling for f in summed.layout.features] == ["sum", "sum", "sum", "sum"]
  assert summed.layout.features[2] == LAYOUT.features[2]  # the sequence is untouched
  bag_pooling.check_pooling_keys(SPEC, ["features.tags.pooling", "model.name"])
  with pytest.raises(ConfigError, match="features.history.pooling: 'history' is not a multi_hot"):
    bag_pooling.check_pooling_keys(SPEC, ["features.history.pooling"])


def test_weights_renormalised_by_hand():
  codes = {"features.tags.pooling": 2.0, "features.genres.pooling": 1.0}  # sqrtn, mean
  got = np.asarray(bag_pooling.repool_weights(SPEC, jnp.asarray(WEIGHTS), codes))
  want = WEIGHTS.copy()
  want[0, 1:4] /= 3.0  # sqrt(1 + 4 + 4)
  want[0, 6:8] /= 7.0
  want[1, 1:4] /= 0.5
  np.testing.assert_allclose(got, want, rtol=1e-6)  # the empty bag stays 0
  # No key: the layout's poolings (tags mean, genres sqrtn).
  default = np.asarray(bag_pooling.repool_weights(SPEC, jnp.asarray(WEIGHTS), {}))
  np.testing.assert_allclose(default[0, 1:4], WEIGHTS[0, 1:4] / 5.0, rtol=1e-6)
  np.testing.assert_allclose(default[0, 6:8], WEIGHTS[0, 6:8] / 5.0, rtol=1e-6)
  np.testing.assert_array_equal(default[:, [0, 4, 5]], WEIGHTS[:, [0, 4, 5]])


def test_summed_pooling_of_repooled_weights_is_each_pooling_under_vmap():
  emb = jax.random.normal(jax.random.key(0), (2, 8, 3))
  codes = jnp.asarray([0.0, 1.0, 2.0])  # one trial per pooling of `tags`

  def fields(code):
    weights = bag_pooling.repool_weights(SPEC, jnp.asarray(WEIGHTS), {"features.tags.pooling": code})
    return pooling.pool_features(bag_pooling.summed_spec(SPEC).layout, emb, weights)

  got = jax.jit(jax.vmap(fields))(codes)  # [3, B, F, E]
  for i, name in enumerate(fl.POOLINGS):
    want = pooling.pool_bag(emb[:, 1:4], jnp.asarray(WEIGHTS[:, 1:4]), name)
    chex.assert_trees_all_close(got[i, :, 1], want, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(got[:, :, 2], jnp.broadcast_to(got[0, :, 2], got[:, :, 2].shape))


def test_trainer_pooling_of_a_trial_config():
  config = {"model.name": "fm", "features.tags.pooling": "sqrtn", "features.genres.pooling": 0}
  assert bag_pooling.trainer_pooling(config) == "genres:sum,tags:sqrtn"
  assert bag_pooling.trainer_pooling({"model.name": "fm"}) == ""
