"""AutoGroup's model: straight-through memberships, group interactions by hand, its Gumbel
stream (a fresh sample per call while training, none after `eval()`), bad settings."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sfjax.models import group_interactions as gi
from sfjax.models import registry


def test_straight_through_membership():
  logits = jnp.array([[[0.0, 2.0], [1.0, -1.0]], [[3.0, 0.0], [-0.5, 0.5]]])  # [F=2, G=2, 2]
  chex.assert_trees_all_equal(gi._straight_through_membership(logits, None, 1.0, False),
                              jnp.array([[1.0, 0.0], [0.0, 1.0]]))
  key = jax.random.key(0)
  m = gi._straight_through_membership(logits, key, 0.5, True)
  assert set(np.unique(np.asarray(m))) <= {0.0, 1.0}
  # The gradient is that of the soft sample's 'member' probability (straight-through).
  grad = jax.grad(lambda x: gi._straight_through_membership(x, key, 0.5, True).sum())(logits)
  gumbel = jax.random.gumbel(key, logits.shape)
  soft_grad = jax.grad(lambda x: jax.nn.softmax((x + gumbel) / 0.5, axis=-1)[..., 1].sum())(logits)
  chex.assert_trees_all_close(grad, soft_grad, atol=1e-6)
  assert np.all(np.abs(np.asarray(grad)) > 0)


def test_group_interactions_by_hand():
  e = jnp.array([[[1.0, 2.0], [3.0, -1.0], [2.0, 0.5]]])  # [B=1, F=3, E=2]
  member = jnp.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])  # group 0 = {0, 1}, group 1 = {0, 2}
  weights = jnp.array([[1.0, 2.0], [1.0, 1.0], [1.0, 1.0]])
  out2 = gi.group_interactions(e, member, weights, 2)
  # Group 0: 2 e0*e1 = [6, -4]; group 1: 2 (2 e0) * e2 = [8, 4].
  chex.assert_trees_all_close(out2, jnp.array([[[6.0, -4.0], [8.0, 4.0]]]))
  out3 = gi.group_interactions(e, member, weights, 3)
  # Group 0: (e0 + e1)^3 - e0^3 - e1^3 = [64 - 1 - 27, 1 - 8 + 1]; group 1 with 2 e0 and e2.
  g1 = (2 * e[0, 0] + e[0, 2]) ** 3 - (2 * e[0, 0]) ** 3 - e[0, 2] ** 3
  chex.assert_trees_all_close(out3, jnp.stack([jnp.array([36.0, -6.0]), g1])[None])


def _model(**kw):
  return registry.build_model("group_interactions", num_fields=4, embed_dim=2, num_dense=1,
                              rngs=nnx.Rngs(0), **{"max_order": 3, "num_groups": (2, 1),
                                                   "mlp_dims": (4,), **kw})


def test_the_model_by_hand_with_fixed_memberships():
  model = _model()
  assert model.orders == (2, 3) and [s.shape for s in model.structure] == [(4, 2, 2), (4, 1, 2)]
  member = [np.array([[1, 0], [1, 1], [0, 1], [0, 0]], bool), np.array([[1], [1], [1], [0]], bool)]
  for logits, m in zip(model.structure, member, strict=True):
    logits[...] = jnp.stack([~m, m], axis=-1).astype(jnp.float32)
  model.eval()
  for found, m in zip(model.memberships(), member, strict=True):
    np.testing.assert_array_equal(np.asarray(found) > 0, m)
  rng = np.random.default_rng(0)
  emb, dense = rng.normal(size=(3, 4, 3)).astype(np.float32), rng.normal(size=(3, 1))
  vectors = emb[..., :2]
  features = [gi.group_interactions(vectors, m.astype(np.float32), np.ones(m.shape), p)
              .reshape(3, -1) for m, p in zip(member, (2, 3), strict=True)]
  tower = model.mlp(jnp.concatenate(features + [jnp.asarray(dense, jnp.float32)], axis=1))[:, 0]
  expected = emb[..., -1].sum(1) + model.dense_linear(jnp.asarray(dense, jnp.float32)) + tower
  chex.assert_trees_all_close(model(jnp.asarray(emb), jnp.asarray(dense, jnp.float32)), expected,
                              atol=1e-5)


def test_training_draws_a_fresh_sample_per_call_and_eval_none():
  model = _model(temperature=0.5)
  emb, dense = jnp.ones((2, 4, 3)), jnp.ones((2, 1))
  first, second = model(emb, dense), model(emb, dense)
  assert int(model.rngs.gumbel.count[...]) == 4  # two orders, two calls
  assert not np.allclose(np.asarray(first), np.asarray(second))  # memberships sampled anew
  model.eval()
  chex.assert_trees_all_equal(model(emb, dense), model(emb, dense))
  assert int(model.rngs.gumbel.count[...]) == 4
  assert "group_interactions" not in registry.MODEL_NAMES


@pytest.mark.parametrize("kw, match", [({"max_order": 1}, "model.max_order"),
                                       ({"num_groups": (2,)}, "model.num_groups must have"),
                                       ({"num_groups": 0}, "model.num_groups must be an int"),
                                       ({"temperature": 0.0}, "model.temperature")])
def test_bad_settings_name_the_key(kw, match):
  with pytest.raises(ValueError, match=f"group_interactions: {match}"):
    _model(**kw)
