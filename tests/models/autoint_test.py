"""Tests for sfjax.models.autoint."""

import numpy as np
from flax import nnx

from sfjax.models.autoint import AutoInt, InteractingLayer

B, F, D = 4, 3, 4


def _np_interacting(layer, x):
  heads, size = layer.num_heads, layer.head_dim
  def proj(lin):
    return x @ np.asarray(lin.kernel[...])

  q, k, v = proj(layer.query), proj(layer.key), proj(layer.value)
  outs = []
  for h in range(heads):
    cols = slice(h * size, (h + 1) * size)
    scores = np.einsum("bfa,bga->bfg", q[..., cols], k[..., cols]) / np.sqrt(size)
    attn = np.exp(scores - scores.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    outs.append(np.einsum("bfg,bga->bfa", attn, v[..., cols]))
  return np.maximum(np.concatenate(outs, -1) + proj(layer.residual), 0.0)


def test_interacting_layer_matches_numpy_multi_head_attention():
  layer = InteractingLayer(D, 2, 3, rngs=nnx.Rngs(0))
  x = np.random.default_rng(0).standard_normal((B, F, D)).astype(np.float32)
  out = layer(x)
  assert out.shape == (B, F, 6)
  np.testing.assert_allclose(out, _np_interacting(layer, x), rtol=1e-5, atol=1e-5)


def test_interacting_layer_is_permutation_equivariant_over_fields():
  layer = InteractingLayer(D, 2, 2, rngs=nnx.Rngs(0))
  x = np.random.default_rng(1).standard_normal((B, F, D)).astype(np.float32)
  perm = np.array([2, 0, 1])
  np.testing.assert_allclose(layer(x[:, perm]), np.asarray(layer(x))[:, perm], rtol=1e-5,
                             atol=1e-6)


def test_autoint_layer_widths_and_mlp_input():
  model = nnx.eval_shape(lambda: AutoInt(num_fields=F, embed_dim=D, num_dense=2, mlp_dims=(5,),
                                         attention_layers=2, attention_heads=2, attention_dim=3,
                                         rngs=nnx.Rngs(0)))  # shapes only
  assert [layer.query.kernel.shape for layer in model.interacting] == [(D, 6), (6, 6)]
  assert model.attention_head.kernel.shape == (F * 6, 1)
  assert model.mlp.hidden[0].kernel.shape == (F * D + 2, 5)


def test_autoint_forward_with_and_without_dense_features():
  rng = np.random.default_rng(2)
  emb = rng.standard_normal((B, F, D)).astype(np.float32)
  for num_dense in (2, 0):
    model = AutoInt(num_fields=F, embed_dim=D, num_dense=num_dense, mlp_dims=(5,),
                    attention_layers=1, attention_heads=2, attention_dim=3, rngs=nnx.Rngs(0))
    out = model(emb, rng.standard_normal((B, num_dense)).astype(np.float32))
    assert out.shape == (B,) and np.all(np.isfinite(out))
