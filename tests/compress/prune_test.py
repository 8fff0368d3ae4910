"""ctr_prune: genomes -> masks, column ordering, physical pruning == masked logits, exact sizes."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sfjax.compress import prune as ctr_prune
from sfjax.models import registry

F, ND, D, V, B = 3, 2, 4, 20, 7


def _model(name, **hparams):
  return _built(name, tuple(sorted(hparams.items())))


@functools.cache
def _built(name, hparams):
  cfg = {"name": name, "embed_dim": D, "mlp_dims": (8, 6), **dict(hparams)}

  def build():
    return registry.build_model_from_config(cfg, num_fields=F, num_dense=ND, rngs=nnx.Rngs(0))

  graphdef, state = nnx.split(nnx.eval_shape(build))
  rng = np.random.default_rng(0)  # numpy values of the model's shapes: no op-by-op jax init
  params = jax.tree.map(lambda a: rng.normal(0, 0.5, a.shape).astype(np.float32),
                        nnx.to_pure_dict(state))
  spec = ctr_prune.make_spec(cfg, F, ND)
  values = rng.normal(0, 1, (V, spec.width)).astype(np.float32)
  return spec, graphdef, params, values


@functools.cache
def _inputs():
  rng = np.random.default_rng(1)
  ids = rng.integers(0, V, (B, F)).astype(np.int32)
  dense = rng.normal(0, 1, (B, ND)).astype(np.float32)
  return ids, dense


def test_genome_to_masks_by_hand():
  spec, *_ = _model("deepfm")
  assert spec.hidden == (8, 6) and spec.width == D + 1 and spec.dim_choices == (1, 2, 3, 4)
  genome = ctr_prune.full_genome(spec)
  genome[[1, 9]] = 0
  genome[-2] = 2
  assert genome.shape == (16,) and genome[-1] == 32  # 14 unit bits, k, float rows
  m1, m2 = ctr_prune._unit_masks(spec, genome)
  chex.assert_trees_all_equal(m1, jnp.array([1, 0, 1, 1, 1, 1, 1, 1], jnp.float32))
  chex.assert_trees_all_equal(m2, jnp.array([1, 0, 1, 1, 1, 1], jnp.float32))
  # The first-order weight (last column) is never masked.
  chex.assert_trees_all_equal(ctr_prune._column_mask(spec, genome),
                              jnp.array([1, 1, 0, 0, 1], jnp.float32))
  assert ctr_prune.pruned_model_cfg(spec, genome) == {"name": "deepfm", "embed_dim": 2,
                                                      "mlp_dims": (7, 5)}


@pytest.mark.parametrize("name,hparams", [("deepfm", {}), ("wide_deep", {}),
                                          ("xdeepfm", {"cin_dims": (3,)})])
def test_ordering_columns_keeps_the_function_and_sorts_by_norm(name, hparams):
  spec, graphdef, params, values = _model(name, **hparams)
  ids, dense = _inputs()
  run = jax.jit(lambda p, v: ctr_prune.logits(graphdef, p, v, ids, dense))
  p2, v2 = ctr_prune.order_columns(spec, params, values)
  chex.assert_trees_all_close(run(p2, v2), run(params, values), atol=1e-5)
  norms = np.linalg.norm(np.asarray(v2)[:, :D], axis=0)
  assert np.all(np.diff(norms) <= 0)
  chex.assert_trees_all_equal(v2[:, D], values[:, D])  # first-order column stays last


@pytest.mark.parametrize("name,hparams,k", [("deepfm", {}, 2), ("wide_deep", {}, 1),
                                            ("xdeepfm", {"cin_dims": (3,)}, 3),
                                            ("autoint", {"attention_dim": 4}, D)])
def test_physically_pruned_model_equals_the_masked_one(name, hparams, k):
  spec, graphdef, params, values = _model(name, **hparams)
  params, values = ctr_prune.order_columns(spec, params, values)
  ids, dense = _inputs()
  genome = ctr_prune.full_genome(spec)
  genome[[0, 3, 9, 13]] = 0  # units 0, 3 of layer 0; units 1, 5 of layer 1
  genome[-2] = k
  masked = jax.jit(lambda p, v, g: ctr_prune._masked_logits(graphdef, spec, p, v, g, ids, dense))(
      params, values, jnp.asarray(genome))
  pruned = ctr_prune.prune(spec, params, values, genome)
  assert pruned.model_cfg["mlp_dims"] == (6, 4) and pruned.model_cfg["embed_dim"] == k
  assert pruned.values.shape == (V, registry.embedding_width(name, k))
  run = jax.jit(lambda p, v: ctr_prune.logits(pruned.graphdef, p, v, ids, dense))
  chex.assert_trees_all_close(run(pruned.params, pruned.values), masked, atol=1e-5)
  # The size objective is the pruned model's exact parameter count.
  assert ctr_prune.pruned_size(spec, V, genome) == (ctr_prune._param_count(pruned.params)
                                                    + int(np.prod(pruned.values.shape)))


def test_pruned_size_by_hand_for_deepfm():
  spec, *_ = _model("deepfm")
  genome = ctr_prune.full_genome(spec)
  genome[[0, 1, 8]] = 0
  genome[-2] = 3
  h1, h2, k = 6, 5, 3
  dense = ND + (F * k + ND) * h1 + h1 + h1 * h2 + h2 + h2 + 1
  assert ctr_prune.pruned_size(spec, V, genome) == V * (k + 1) + dense
  assert ctr_prune.pruned_size(spec, V, ctr_prune.full_genome(spec)) == (
      V * (D + 1) + ND + (F * D + ND) * 8 + 8 + 8 * 6 + 6 + 6 + 1)


def test_bad_input_errors_name_the_field():
  with pytest.raises(ValueError, match="model.name: 'fm' has no MLP tower"):
    ctr_prune.make_spec({"name": "fm", "embed_dim": D}, F, ND)
  with pytest.raises(ValueError, match=r"dim_choices: \(9,\) must lie in"):
    ctr_prune.make_spec({"name": "deepfm", "embed_dim": D, "mlp_dims": (4,)}, F, ND, (9,))
  with pytest.raises(ValueError, match="dim_choices: model 'autoint' supports only MLP"):
    ctr_prune.make_spec({"name": "autoint", "embed_dim": D, "mlp_dims": (4,)}, F, ND, (2,))
  spec, graphdef, params, values = _model("deepfm")
  bad = ctr_prune.full_genome(spec)
  with pytest.raises(ValueError, match=r"genome: shape \(15,\)"):
    ctr_prune.check_genome(spec, bad[:-1])
  bad[:8] = 0
  with pytest.raises(ValueError, match="genome: hidden layer 0 keeps no unit"):
    ctr_prune.check_genome(spec, bad)
  with pytest.raises(ValueError, match="genome: kept dim 7"):
    ctr_prune.check_genome(spec, np.concatenate([np.ones(14, np.int32), [7, 32]]))
  with pytest.raises(ValueError, match="genome: table bits 4 is not one of"):
    ctr_prune.check_genome(spec, np.concatenate([np.ones(14, np.int32), [4, 4]]))
  with pytest.raises(ValueError, match="bit_choices:"):
    ctr_prune.make_spec({"name": "deepfm", "embed_dim": D, "mlp_dims": (4,)}, F, ND, None, (1,))
  auto, g2, p2, v2 = _model("autoint", attention_dim=4)
  with pytest.raises(ValueError, match="model.name: 'autoint' does not support"):
    ctr_prune._take_columns(auto, p2, v2, [1, 0, 2, 3])


def test_quantized_pruned_model_equals_the_fake_quantized_masked_one():
  _, graphdef, params, values = _model("deepfm")
  spec = ctr_prune.make_spec({"name": "deepfm", "embed_dim": D, "mlp_dims": (8, 6)}, F, ND,
                             None, (4, 32))
  params, values = ctr_prune.order_columns(spec, params, values)
  ids, dense = _inputs()
  genome = ctr_prune.full_genome(spec)
  genome[[2, 10]] = 0
  genome[-2:] = (3, 4)
  masked = jax.jit(lambda p, v, g: ctr_prune._masked_logits(graphdef, spec, p, v, g, ids, dense))(
      params, values, jnp.asarray(genome))
  pruned = ctr_prune.prune(spec, params, values, genome)
  assert pruned.bits == 4 and pruned.codes.dtype == np.int8 and pruned.codes.shape == (V, 4)
  assert np.abs(pruned.codes).max() <= 7 and pruned.scales.shape == (V,)
  run = jax.jit(lambda p, v: ctr_prune.logits(pruned.graphdef, p, v, ids, dense))
  chex.assert_trees_all_close(run(pruned.params, pruned.values), masked, atol=1e-5)
  # Quantization changed the function (else this test could not fail).
  assert not np.allclose(run(pruned.params, ctr_prune._take_columns(
      spec, params, values, np.arange(3))[1]), masked, atol=1e-3)
  # Stored bits: int8-range codes at 4 bits + a float32 scale per row, float32 dense params.
  dense_params = ND + (F * 3 + ND) * 7 + 7 + 7 * 5 + 5 + 5 + 1
  assert ctr_prune.pruned_bits(spec, V, genome) == V * (4 * 4 + 32) + 32 * dense_params
  genome[-1] = 32
  assert ctr_prune.pruned_bits(spec, V, genome) == 32 * ctr_prune.pruned_size(spec, V, genome)
