"""Tests for sfjax.models.behavior.din: the activation unit, the mask, the layout and the registry."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.configs import ctr
from sfjax import models
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.models import registry
from sfjax.models.behavior import pooling
from sfjax.models.behavior.din import DIN, ActivationUnit, PReLU, target_attention
from sfjax.train import config_check

B, F, D, ND, L = 4, 3, 4, 2, 5
TARGET, SEQ = 1, 2
MASK = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.float32)

# user, the candidate item, genres (a bag) and the item history (a sequence of the item table).
LAYOUT = fl.FeatureLayout(
    (fl.TableSpec("user", 10), fl.TableSpec("item", 20), fl.TableSpec("genre", 6)),
    (fl.FeatureSpec("user_id", "user"),
     fl.FeatureSpec("item_id", "item"),
     fl.FeatureSpec("genres", "genre", "multi_hot", 3, "mean"),
     fl.FeatureSpec("history", "item", "sequence", 4)))


def _model(num_dense=ND, seed=0, din_pooling="sum"):
  return DIN(num_fields=F, embed_dim=D, num_dense=num_dense, rngs=nnx.Rngs(seed),
             target_field=TARGET, sequence_field=SEQ, mlp_dims=(8,), din_attention_dims=(6, 5),
             din_pooling=din_pooling)


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((B, F, D + 1)).astype(np.float32),
          rng.standard_normal((B, ND)).astype(np.float32),
          rng.standard_normal((B, L, D + 1)).astype(np.float32))


def test_shapes_with_and_without_dense():
  emb, dense, hist = _inputs()
  out = _model()(emb, dense, sequences=((hist, MASK),))
  chex.assert_shape(out, (B,))
  chex.assert_tree_all_finite(out)
  out0 = _model(num_dense=0)(emb, np.zeros((B, 0), np.float32), sequences=((hist, MASK),))
  chex.assert_shape(out0, (B,))
  assert DIN.embedding_width(D) == D + 1 and registry.embedding_width("din", D) == D + 1


def test_prelu_slopes_negative_inputs_only():
  act = PReLU(2)
  np.testing.assert_allclose(act(jnp.array([[-2.0, 3.0]])), [[-0.5, 3.0]])


def test_padded_history_items_change_nothing():
  model = _model()
  emb, dense, hist = _inputs()
  out = model(emb, dense, sequences=((hist, MASK),))
  garbage = hist.copy()
  garbage[MASK == 0] = np.array([1e30, -np.inf, np.nan, 7.0, 2.0], np.float32)
  np.testing.assert_array_equal(model(emb, dense, sequences=((garbage, MASK),)), out)
  # ... while a real item does change the logit of its example (and only that one).
  moved = hist.copy()
  moved[0, 0] += 1.0
  diff = np.asarray(model(emb, dense, sequences=((moved, MASK),))) != np.asarray(out)
  np.testing.assert_array_equal(diff, [True, False, False, False])


def test_gradient_to_padded_items_is_exactly_zero():
  model = _model()
  emb, dense, hist = _inputs()
  hist[MASK == 0] = np.nan  # a NaN row must not leak into the gradient either
  grad = jax.grad(lambda h: model(emb, dense, sequences=((h, MASK),)).sum())(jnp.asarray(hist))
  grad = np.asarray(grad)
  np.testing.assert_array_equal(grad[MASK == 0], 0.0)
  assert np.all(np.abs(grad[MASK == 1]).sum(-1) > 0)


def test_attention_weight_depends_on_the_target():
  unit = ActivationUnit(D, (6,), rngs=nnx.Rngs(1))
  hist = _inputs()[2][..., :D]  # the vectors (the unit never sees first-order weights)
  t1, t2 = np.ones((B, D), np.float32), -np.ones((B, D), np.float32)
  w1, w2 = np.asarray(unit(hist, t1)), np.asarray(unit(hist, t2))
  chex.assert_shape(w1, (B, L))
  assert np.all(w1 != w2)
  # The interest is sum_i m_i a_i h_i (by hand, with the unit's weights).
  interest = np.asarray(target_attention(unit, hist, MASK, t1))
  np.testing.assert_allclose(interest, np.einsum("bl,bld->bd", w1 * MASK, hist),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(interest[3], 0.0)  # an empty history: no interest


def test_weights_are_not_normalised():
  # As in the paper: no softmax, so the same item twice counts twice.
  unit = ActivationUnit(D, (6,), rngs=nnx.Rngs(2))
  hist = _inputs()[2][..., :D]
  twice = np.repeat(hist[:, :1], 2, axis=1)  # [B, 2, D]
  target = hist[:, 1]
  once = target_attention(unit, twice, np.array([[1, 0]] * B, np.float32), target)
  both = target_attention(unit, twice, np.ones((B, 2), np.float32), target)
  np.testing.assert_allclose(both, 2 * np.asarray(once), rtol=1e-6)


def test_mean_pooling_divides_the_interest_by_the_real_items_count():
  unit = ActivationUnit(D, (6,), rngs=nnx.Rngs(2))
  hist = _inputs()[2][..., :D]
  target = _inputs(seed=1)[2][:, 0, :D]
  total = np.asarray(target_attention(unit, hist, MASK, target))
  mean = np.asarray(target_attention(unit, hist, MASK, target, "mean"))
  np.testing.assert_allclose(mean[:3], total[:3] / MASK[:3].sum(1, keepdims=True), rtol=1e-6)
  np.testing.assert_array_equal(mean[3], 0.0)  # an empty history: 0, not 0/0
  # The same item twice weighs as much as once: the mean does not grow with the length.
  twice = np.repeat(hist[:, :1], 2, axis=1)
  once = target_attention(unit, twice, np.array([[1, 0]] * B, np.float32), target, "mean")
  both = target_attention(unit, twice, np.ones((B, 2), np.float32), target, "mean")
  np.testing.assert_allclose(both, once, rtol=1e-6)


def test_softmax_pooling_normalises_the_weights_over_the_real_items():
  unit = ActivationUnit(D, (6,), rngs=nnx.Rngs(2))
  hist = _inputs()[2][..., :D]
  target = _inputs(seed=1)[2][:, 0, :D]
  scores = np.asarray(unit(hist, target))
  got = np.asarray(target_attention(unit, hist, MASK, target, "softmax"))
  for b in range(3):  # by hand, over the real items only
    real = MASK[b] > 0
    w = np.exp(scores[b, real] - scores[b, real].max())
    np.testing.assert_allclose(got[b], (w / w.sum()) @ hist[b, real], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[1], hist[1, 0], rtol=1e-6)  # one real item: its own vector
  np.testing.assert_array_equal(got[3], 0.0)  # an empty history: 0, not NaN
  # The same item twice mixes to that item: the weights sum to 1 whatever the length.
  twice = np.repeat(hist[:, :1], 2, axis=1)
  both = target_attention(unit, twice, np.ones((B, 2), np.float32), target, "softmax")
  np.testing.assert_allclose(both, hist[:, 0], rtol=1e-6)


def test_softmax_pooling_keeps_padding_out_of_values_and_gradients():
  model = _model(din_pooling="softmax")
  emb, dense, hist = _inputs()
  out = np.asarray(model(emb, dense, sequences=((hist, MASK),)))
  garbage = hist.copy()
  garbage[MASK == 0] = np.array([1e30, -np.inf, np.nan, 7.0, 2.0], np.float32)
  np.testing.assert_array_equal(model(emb, dense, sequences=((garbage, MASK),)), out)
  grad = jax.grad(lambda h: model(emb, dense, sequences=((h, MASK),)).sum())(jnp.asarray(garbage))
  grad = np.asarray(grad)
  np.testing.assert_array_equal(grad[MASK == 0], 0.0)
  assert np.all(np.isfinite(grad)) and np.all(np.abs(grad[MASK == 1]).sum(-1) > 0)


def test_din_pooling_reaches_the_model_and_padding_still_changes_nothing():
  emb, dense, hist = _inputs()
  total, mean = _model(), _model(din_pooling="mean")
  a = np.asarray(total(emb, dense, sequences=((hist, MASK),)))
  b = np.asarray(mean(emb, dense, sequences=((hist, MASK),)))
  # One real item (example 1) or none (3): the mean is the sum; 3 and 5 items: it is not.
  np.testing.assert_array_equal(a[[1, 3]], b[[1, 3]])
  assert np.all(a[[0, 2]] != b[[0, 2]])
  padded = hist.copy()
  padded[MASK == 0] = np.nan
  np.testing.assert_array_equal(mean(emb, dense, sequences=((padded, MASK),)), b)
  with pytest.raises(ValueError, match=r"din: din_pooling must be one of \('sum', 'mean', 'softmax'\)"):
    DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=0,
        sequence_field=1, din_pooling="max")


def _linear(layer, x):
  return x @ np.asarray(layer.kernel[...]) + np.asarray(layer.bias[...])


def _reference_logits(model, emb, dense, hist, mask, pooling):
  """DIN's logit written out in numpy from the module's parameters (the module docstring)."""
  vectors, first = emb[..., :-1], emb[..., -1]
  h, t = hist[..., :-1] * mask[..., None], vectors[:, model.target_field]
  tb = np.broadcast_to(t[:, None], h.shape)
  x = np.concatenate([h, tb, h - tb, h * tb], axis=-1)
  for layer, act in zip(model.attention.hidden, model.attention.act, strict=True):
    y = _linear(layer, x)
    x = np.where(y >= 0, y, np.asarray(act.alpha[...]) * y)
  a = _linear(model.attention.out, x)[..., 0] * mask
  if pooling == "softmax":
    e = np.where(mask > 0, np.exp(a - np.max(np.where(mask > 0, a, -np.inf), 1, keepdims=True)), 0.0)
    a = e / np.maximum(e.sum(1, keepdims=True), 1e-30)
  interest = np.einsum("bl,bld->bd", a, h)
  if pooling == "mean":
    interest /= np.maximum(mask.sum(1, keepdims=True), 1)
  s = model.sequence_field
  fields = vectors.copy()
  fields[:, s] = interest
  first_sum = first.sum(1) - first[:, s]  # the history's first-order weight is dropped
  summed = fields.sum(1)
  fm = 0.5 * (summed * summed - (fields * fields).sum(1)).sum(-1)
  x = np.concatenate([fields.reshape(len(emb), -1), dense], axis=1)
  for layer in model.mlp.hidden:
    x = np.maximum(_linear(layer, x), 0.0)
  return first_sum + dense @ np.asarray(model.dense_linear.kernel[...]) + fm + _linear(model.mlp.out, x)[:, 0]


@pytest.mark.parametrize("pooling", ["sum", "mean", "softmax"])
def test_logits_equal_a_numpy_reference(pooling):
  # Four fields, the history in the middle (field 1), the target after it (field 3).
  model = DIN(num_fields=4, embed_dim=D, num_dense=ND, rngs=nnx.Rngs(3), target_field=3,
              sequence_field=1, mlp_dims=(8, 7), din_attention_dims=(6, 5), din_pooling=pooling)
  rng = np.random.default_rng(5)
  emb = rng.standard_normal((B, 4, D + 1)).astype(np.float32)
  dense = rng.standard_normal((B, ND)).astype(np.float32)
  hist = rng.standard_normal((B, L, D + 1)).astype(np.float32)
  hist[MASK == 0] = 0.0  # the reference multiplies by the mask; the model must ignore them
  got = np.asarray(model(emb, dense, sequences=((hist, MASK),)))
  np.testing.assert_allclose(got, _reference_logits(model, emb, dense, hist, MASK, pooling),
                             rtol=1e-4, atol=1e-5)


def test_interest_replaces_the_pooled_history_field_and_the_target_matters():
  model = _model()
  emb, dense, hist = _inputs()
  out = np.asarray(model(emb, dense, sequences=((hist, MASK),)))
  pooled = emb.copy()
  pooled[:, SEQ] += 5.0  # the mean-pooled history: replaced by the interest
  np.testing.assert_array_equal(model(pooled, dense, sequences=((hist, MASK),)), out)
  target = emb.copy()
  target[:, TARGET] += 1.0
  assert np.all(np.asarray(model(target, dense, sequences=((hist, MASK),))) != out)


def test_without_sequences_it_says_what_it_needs():
  emb, dense, _ = _inputs()
  with pytest.raises(ValueError, match=r"^din: needs the unpooled history \(sequences=\(\(values, "
                     r"mask\), \.\.\.\)\); build it with a feature layout holding a 'sequence' "
                     r"feature$"):
    _model()(emb, dense)
  with pytest.raises(ValueError, match=r"din: history values must be"):
    _model()(emb, dense, sequences=((np.zeros((B, L, D + 2), np.float32), MASK),))


def test_bad_inputs_are_named_with_their_expected_shapes():
  model, (emb, dense, hist) = _model(), _inputs()
  with pytest.raises(ValueError, match=r"^din: emb must be \[B, 3, 5\]"):
    model(emb[..., :D], dense, sequences=((hist, MASK),))
  with pytest.raises(ValueError, match=r"^din: history values must be \[4, L, 5\], got shape "
                     r"\(4, 5\)$"):
    model(emb, dense, sequences=((hist[..., 0], MASK),))
  with pytest.raises(ValueError, match=r"^din: history mask must be \(4, 5\), got \(4, 3\)$"):
    model(emb, dense, sequences=((hist, MASK[:, :3]),))


def test_sizes_and_widths_are_named():
  with pytest.raises(ValueError, match=r"^din: model\.mlp_dims must"):
    DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=0,
        sequence_field=1, mlp_dims=(4, 0))
  with pytest.raises(ValueError, match=r"^din: target_field must be an int >= 0, got -1"):
    DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=-1,
        sequence_field=1)
  with pytest.raises(ValueError, match=r"^din: sequence_field must be an int >= 0, got -1"):
    DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=0,
        sequence_field=-1)
  with pytest.raises(ValueError, match=r"^din: model\.embed_dim must be an int >= 1, got 0"):
    DIN(num_fields=F, embed_dim=0, num_dense=0, rngs=nnx.Rngs(0), target_field=0,
        sequence_field=1)
  # The history may be field 0 and the target the last field; one past the last is refused.
  DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=F - 1,
      sequence_field=0)
  with pytest.raises(ValueError, match=rf"din: target_field={F} and sequence_field=0"):
    DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=F,
        sequence_field=0)


def test_bad_fields_are_refused():
  with pytest.raises(ValueError, match=r"din: target_field=2 and sequence_field=2"):
    DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=2,
        sequence_field=2)
  with pytest.raises(ValueError, match=r"din: model\.din_attention_dims"):
    DIN(num_fields=F, embed_dim=D, num_dense=0, rngs=nnx.Rngs(0), target_field=0,
        sequence_field=1, din_attention_dims=(4, 0))


def test_jit_traces_once():
  graphdef, state = nnx.split(_model())

  @jax.jit
  @chex.assert_max_traces(n=1)
  def forward(state, emb, dense, hist, mask):
    return nnx.merge(graphdef, state)(emb, dense, sequences=((hist, mask),))

  emb, dense, hist = _inputs()
  a = forward(state, emb, dense, hist, MASK)
  emb2, dense2, hist2 = _inputs(seed=1)
  b = forward(state, emb2, dense2, hist2, MASK[::-1].copy())
  assert not np.allclose(a, b)


def test_layout_args_pick_the_first_sequence_and_its_tables_one_hot():
  assert DIN.layout_args(LAYOUT) == {"target_field": 1, "sequence_field": 3}


@pytest.mark.parametrize("layout,what", [
    (None, "needs a data set with a feature layout holding a 'sequence' feature \\(this data "
           "set has one one-hot id per field\\)$"),
    (fl.one_hot_layout(["user_id", "item_id"], [10, 20]),
     "needs a 'sequence' feature; the layout has \\['user_id:one_hot', 'item_id:one_hot'\\]$"),
    (fl.FeatureLayout((fl.TableSpec("user", 10), fl.TableSpec("item", 20)),
                      (fl.FeatureSpec("user_id", "user"),
                       fl.FeatureSpec("history", "item", "sequence", 4))),
     "one_hot target feature reading table 'item'"),
])
def test_a_layout_without_what_din_reads_names_model_name(layout, what):
  with pytest.raises(ConfigError, match=rf"^config field model\.name: model\.name=din .*{what}"):
    registry.build_model_from_config({"name": "din", "embed_dim": D}, num_fields=2,
                                     num_dense=0, rngs=nnx.Rngs(0), layout=layout)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_build_from_config_wraps_din_in_pooled_input():
  model = registry.build_model_from_config(
      {"name": "din", "embed_dim": 8, "mlp_dims": (6,), "din_attention_dims": (5,)},
      num_fields=LAYOUT.num_features, num_dense=ND, rngs=nnx.Rngs(0), layout=LAYOUT)
  assert isinstance(model, pooling.PooledInput) and isinstance(model.inner, DIN)
  assert (model.inner.target_field, model.inner.sequence_field) == (1, 3)
  s = LAYOUT.num_columns  # 1 + 1 + 3 + 4
  rng = np.random.default_rng(0)
  emb = rng.standard_normal((B, s, 9)).astype(np.float32)  # [B, S, E]: E = D + 1
  dense = rng.standard_normal((B, ND)).astype(np.float32)
  weights = np.ones((B, s), np.float32)  # [B, S]
  weights[:, 4] = 0  # genres: 2 of 3
  weights[0, 7:] = 0  # example 0: a history of 2 items
  weights[1, 5:] = 0  # example 1: no genre, no history
  out = np.asarray(model(emb, dense, weights))
  chex.assert_shape(out, (B,))
  chex.assert_tree_all_finite(out)
  padded = emb.copy()
  padded[weights == 0] = 100.0  # what a padding column's row holds never matters
  np.testing.assert_array_equal(model(padded, dense, weights), out)


def test_registry_names_and_hparams():
  assert "din" in models.SEQUENCE_MODEL_NAMES and "din" in models.TRAIN_MODEL_NAMES
  # Not a generator spec, and no cohort trial (trials build models without a layout).
  assert "din" not in models.MODEL_NAMES and "din" not in models.ALL_MODEL_NAMES
  assert models.model_hparams("din") == ("mlp_dims", "din_attention_dims", "din_pooling")
  assert "din_attention_dims" in models.HPARAM_KEYS and "target_field" not in models.HPARAM_KEYS


def test_config_check_accepts_din_and_checks_its_widths():
  c = ctr.get_config()
  c.model.name = "din"
  config_check.validate(c)
  c.model.din_attention_dims = (8, -1)
  with pytest.raises(ConfigError, match=r"^config field model\.din_attention_dims:"):
    config_check.validate(c)
  c.model.din_attention_dims, c.model.din_pooling = (8,), "mean"
  config_check.validate(c)
  c.model.din_pooling = "avg"
  with pytest.raises(ConfigError, match=r"^config field model\.din_pooling:.*'avg'"):
    config_check.validate(c)


def test_movielens_din_config_pools_the_interest_as_a_mean():
  assert ctr.get_config("movielens_din").model.din_pooling == "mean"
  assert ctr.get_config().model.din_pooling == "sum"  # the paper's, by default


def test_movielens_din_softmax_differs_from_movielens_din_only_in_its_pooling():
  softmax, mean = ctr.get_config("movielens_din_softmax"), ctr.get_config("movielens_din")
  assert softmax.model.din_pooling == "softmax"
  softmax.model.din_pooling = "mean"
  assert softmax.to_dict() == mean.to_dict()
