"""Every named model is one point of the generator: same parameter count, same function.

The named model's parameters (perturbed, so no zero bias hides a misplaced one)
are copied into the generated module by an explicit path mapping; both must then
give the same logits on random inputs.
"""

import chex
import jax
import numpy as np
import pytest
from flax import nnx

from sfjax import models
from sfjax.models import generator

F, ND, D, B = 5, 3, 4, 6

# (name, hparams, num_dense): the default setting and one non-default setting each.
CASES = [
    ("lr", {}, ND), ("lr", {}, 0),
    ("fm", {}, ND), ("fm", {}, 0),
    ("deepfm", {}, ND), ("deepfm", {"mlp_dims": (5, 3)}, ND),
    ("wide_deep", {}, ND), ("wide_deep", {"mlp_dims": ()}, ND),
    ("dcnv2", {}, ND),
    ("dcnv2", {"cross_structure": "parallel", "cross_rank": 2, "cross_layers": 1,
               "mlp_dims": (6,)}, ND),
    ("xdeepfm", {}, ND), ("xdeepfm", {"cin_dims": (3, 2), "mlp_dims": (4,)}, ND),
    ("autoint", {}, ND),
    ("autoint", {"attention_layers": 1, "attention_heads": 3, "attention_dim": 2}, ND),
    ("dlrm", {}, ND), ("dlrm", {"bottom_mlp_dims": (), "mlp_dims": (7,)}, 0),
]


def test_every_named_model_is_covered():
  assert {name for name, _, _ in CASES} == set(models.MODEL_NAMES)


def _abstract(build):
  """(graphdef, {path: abstract Variable}) of a model built under eval_shape (no eager op)."""
  graphdef, state = nnx.split(nnx.eval_shape(build))
  return graphdef, dict(nnx.to_flat_state(state))


def _renames(name, hparams):
  """Named path prefix -> generated path prefix."""
  common = {("dense_linear",): ("dense_linear",), ("bias",): ("bias",)}
  per_model = {
      "deepfm": {("mlp",): ("tower",)},
      "wide_deep": {("mlp",): ("tower",)},
      "xdeepfm": {("mlp",): ("tower",), ("cin",): ("blocks", 1, "cin"),
                  ("cin_head",): ("blocks", 1, "head")},
      "autoint": {("mlp",): ("tower",), ("interacting",): ("blocks", 0, "layers"),
                  ("attention_head",): ("blocks", 0, "head")},
      "dcnv2": {("cross",): ("blocks", 0, "layers"), ("mlp",): ("tower",)},
      "dlrm": {("bottom",): ("bottom",), ("top",): ("tower",)},
  }
  return {**common, **per_model.get(name, {})}


def _map_params(name, hparams, named_flat, gen_flat, x0_dim):
  """The generated module's parameters, taken from the named module's."""
  out = {}
  renames = _renames(name, hparams)
  for path, value in named_flat.items():
    if name == "dcnv2" and path[0] == "head":  # parallel: one head over [cross, mlp hidden]
      if path[1] == "kernel":
        out[("blocks", 0, "head", "kernel")] = value[:x0_dim]
        out[("tower", "out", "kernel")] = value[x0_dim:]
      else:
        out[("tower", "out", "bias")] = value
      continue
    prefix = next(p for p in renames if path[:len(p)] == p)
    out[renames[prefix] + path[len(prefix):]] = value
  assert set(out) == set(gen_flat), (sorted(out), sorted(gen_flat))
  for path, value in out.items():
    assert value.shape == gen_flat[path].shape, path
  return out


@pytest.mark.parametrize("name,hparams,num_dense", CASES)
def test_named_model_is_a_point_of_the_generator(name, hparams, num_dense):
  spec = generator.named_model_spec(name, D, **hparams)
  width = generator.spec_embedding_width(spec)
  assert width == models.embedding_width(name, D)
  named_def, named_vars = _abstract(lambda: models.build_model(
      name, num_fields=F, embed_dim=D, num_dense=num_dense, rngs=nnx.Rngs(0), **hparams))
  gen_def, gen_vars = _abstract(lambda: generator.build_from_spec(spec, F, num_dense, nnx.Rngs(0)))
  def count(flat):
    return sum(int(np.prod(v.shape)) for v in flat.values())

  assert count(gen_vars) == count(named_vars)

  # Random named parameters (no zero bias hides a misplaced one), copied by the mapping.
  rng = np.random.default_rng(0)
  named_flat = {p: (0.2 * rng.normal(size=v.shape)).astype(np.float32)
                for p, v in named_vars.items()}
  mapped = _map_params(name, hparams, named_flat, gen_vars, x0_dim=F * D + num_dense)
  named_state = nnx.from_flat_state([(p, v.replace(named_flat[p])) for p, v in named_vars.items()])
  gen_state = nnx.from_flat_state([(p, v.replace(mapped[p])) for p, v in gen_vars.items()])

  @jax.jit
  def both(named_state, gen_state, emb, dense):
    return nnx.merge(named_def, named_state)(emb, dense), nnx.merge(gen_def, gen_state)(emb, dense)

  emb = rng.normal(size=(B, F, width)).astype(np.float32)
  dense = rng.normal(size=(B, num_dense)).astype(np.float32)
  want, got = both(named_state, gen_state, emb, dense)
  chex.assert_shape(got, (B,))
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-5)


def test_spec_json_round_trip_of_every_named_model():
  for name in ("lr", "fm", "deepfm", "wide_deep", "dcnv2", "xdeepfm", "autoint", "dlrm"):
    spec = generator.named_model_spec(name, 8)
    text = generator.spec_to_json(spec)
    assert generator.spec_from_json(text) == spec
    assert generator.spec_to_json(generator.spec_from_json(text)) == text


def test_named_model_spec_rejects_unknown_names_and_hparams():
  with pytest.raises(ValueError, match="composed"):
    generator.named_model_spec("composed", 4)
  with pytest.raises(ValueError, match="mlp_dimz"):
    generator.named_model_spec("deepfm", 4, mlp_dimz=(3,))
  # A key another model uses is ignored, as build_model does.
  assert generator.named_model_spec("fm", 4, mlp_dims=(3,)) == generator.named_model_spec("fm", 4)


def test_config_to_spec_builds_deepfm():
  point = {"model.embedding.num_groups": 1, "model.embedding.group0.dim": 16,
           "model.first_order.use": True, "model.fm.use": True, "model.inner_product.use": False,
           "model.combine": "parallel", "model.tower.use": True, "model.tower.depth": 3,
           "model.tower.width": 400, "model.dense.linear": True, "model.dense.bottom.use": False,
           "optimizer.learning_rate": 1e-3}
  assert generator.config_to_spec(point) == generator.named_model_spec("deepfm", 16)


def test_config_to_spec_names_bad_keys():
  with pytest.raises(generator.SpecError, match="model.tower_width"):
    generator.config_to_spec({"model.tower_width": 3})
  with pytest.raises(generator.SpecError, match="num_groups"):
    generator.config_to_spec({"model.embedding.group0.dim": 4})
  with pytest.raises(generator.SpecError, match="stacked model needs a tower"):
    generator.config_to_spec({"model.embedding.num_groups": 1, "model.embedding.group0.dim": 4,
                              "model.fm.use": True, "model.combine": "stacked"})


@pytest.mark.parametrize("name", ["lr", "fm", "deepfm", "wide_deep", "dcnv2", "xdeepfm",
                                  "autoint"])
def test_spec_to_config_is_the_inverse_of_config_to_spec(name):
  spec = generator.named_model_spec(name, 8)
  point = generator.spec_to_config(spec, unused_dim=4)
  assert generator.config_to_spec(point) == spec
  assert all(k.startswith("model.") for k in point)


def test_spec_to_config_refuses_what_the_block_space_cannot_express():
  with pytest.raises(generator.SpecError, match="equal widths"):
    generator.spec_to_config(generator.named_model_spec("deepfm", 8, mlp_dims=(8, 4)), 8)
  with pytest.raises(generator.SpecError, match="pairs"):
    generator.spec_to_config(generator.with_interaction_pairs(
        generator.named_model_spec("fm", 8), [(0, 1)]), 8)
  gated = {**generator.named_model_spec("deepfm", 8), "gated": True}
  with pytest.raises(generator.SpecError, match="not a point of the block space"):
    generator.spec_to_config(gated, 8)


def test_a_point_that_reads_no_field_vector_stores_none():
  # LR's point: first-order weights only; whatever its group dims say, rows hold one weight.
  point = generator.spec_to_config(generator.named_model_spec("lr", 16), unused_dim=16)
  for dim in (4, 16):
    spec = generator.config_to_spec({**point, "model.embedding.group0.dim": dim})
    assert spec == generator.named_model_spec("lr", 16)
    assert generator.spec_embedding_width(spec) == 1
  # A tower over the embeddings reads them: the group dims stay.
  wide = generator.spec_to_config(generator.named_model_spec("wide_deep", 4), unused_dim=4)
  assert generator.config_to_spec(wide)["embedding"]["dims"] == [4]
