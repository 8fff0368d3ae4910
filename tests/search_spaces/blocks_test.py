"""Tests for the block space (search_spaces/blocks.py): composition, baseline, search."""

import chex
import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from experiments.configs import ctr as ctr_config
from experiments.configs import search_ctr
from search_spaces import blocks
from search_spaces.blocks import BLOCK_SEARCH_SPACE
from sfjax.automl.space import ConfigError, SpaceError
from sfjax.cohorts.arch import split_config
from sfjax.core import feature_layout as fl
from sfjax.ctr_search import search_loop
from sfjax.data import types
from sfjax.models import generator
from sfjax.train.defaults import ctr_defaults


def test_each_blocks_sub_space_is_nested_under_its_switch():
  space = blocks.block_space()
  for kind, cls in generator.BLOCK_TYPES.items():
    for key in cls.space().keys:
      full = f"model.{kind}.{key}"
      assert full in space
      assert not space.is_active(full, {f"model.{kind}.use": False})
  assert "model.embedding.group2.dim" in space and "optimizer.learning_rate" in space


def test_default_config_is_the_trainers_deepfm():
  config = blocks.default_config()
  model = ctr_defaults().model
  want = generator.named_model_spec("deepfm", model.embed_dim, mlp_dims=tuple(model.mlp_dims))
  assert generator.config_to_spec(config) == want
  arch, hparams = split_config(blocks.runner_config(config))
  assert arch.model_name == "composed" and arch.embed_dim == model.embed_dim + 1
  assert generator.spec_from_json(dict(arch.model_hparams)["blocks"]) == want
  assert hparams["optimizer.weight_decay"] == 0.0
  with pytest.raises(ConfigError, match="model.tower.width"):
    blocks.default_config(blocks.block_space(tower_widths=(8,)))


def test_every_sampled_point_is_a_valid_spec():
  space = blocks.block_space()
  rng = np.random.default_rng(0)
  kinds = set()
  for _ in range(300):
    spec = generator.config_to_spec(space.sample(rng))  # forbidden clauses keep it valid
    kinds |= {b["type"] for b in spec["interactions"]} | {spec["combine"]}
  assert kinds == set(generator.BLOCK_TYPES) | set(generator.COMBINES)


@pytest.mark.slow  # compiles two generated models (tests/models/generator_test.py: each block)
def test_sampled_points_build_and_run_under_jit():
  space = blocks.block_space(tower_widths=(8,), embed_dims=(2, 3))
  rng = np.random.default_rng(1)
  num_fields, num_dense, batch = 4, 2, 3
  for _ in range(2):
    spec = generator.config_to_spec(space.sample(rng))
    width = generator.spec_embedding_width(spec)

    @jax.jit
    def logits(emb, dense, spec=spec):
      return generator.build_from_spec(spec, num_fields, num_dense, nnx.Rngs(0))(emb, dense)

    out = logits(rng.normal(size=(batch, num_fields, width)).astype(np.float32),
                 rng.normal(size=(batch, num_dense)).astype(np.float32))
    chex.assert_shape(out, (batch,))
    chex.assert_tree_all_finite(out)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_every_pooled_feature_can_take_its_own_dim():
  """Issue #22: with `max_field_groups` = F the field groups are the F pooled features of a
  layout (a bag, a sequence: one field each); a feature of dim d reads only the first d
  columns of its pooled vector, and its bag's pooling is searched beside."""
  layout = fl.FeatureLayout(
      (fl.TableSpec("user", 5), fl.TableSpec("tag", 7), fl.TableSpec("item", 9)),
      (fl.FeatureSpec("user", "user"), fl.FeatureSpec("tags", "tag", "multi_hot", 3, "mean"),
       fl.FeatureSpec("item", "item"), fl.FeatureSpec("history", "item", "sequence", 2)))
  data = types.DatasetSpec(tuple(types.FieldSpec(f.name, r) for f, r in
                                 zip(layout.features, (5, 7, 9, 9), strict=True)), 1, layout)
  space = blocks.space_from_config(ml_collections.ConfigDict(dict(
      mlp_widths="8,400", max_field_groups=4, poolings="tags:mean")))
  assert "model.embedding.group3.dim" in space and "features.tags.pooling" in space
  assert blocks.default_config(space)["features.tags.pooling"] == "mean"
  point = dict(_point({"first_order", "fm"}, tower=True), **{
      "model.embedding.num_groups": 4, "model.embedding.group0.dim": 4,
      "model.embedding.group1.dim": 8, "model.embedding.group2.dim": 16,
      "model.embedding.group3.dim": 4, "model.tower.depth": 1, "model.tower.width": 8})
  arch, hparams = split_config(blocks.runner_config(dict(
      point, **{"features.tags.pooling": "sqrtn", "embedding.optimizer": "adagrad"})))
  assert hparams["features.tags.pooling"] == 2.0 and arch.embedding_width == 17
  model = arch.build_model(data, nnx.Rngs(0))
  rng = np.random.default_rng(0)
  emb = rng.normal(size=(3, layout.num_columns, 17)).astype(np.float32)
  weights = np.ones((3, layout.num_columns), np.float32)
  dense = np.zeros((3, 1), np.float32)
  base = model(emb, dense, weights)
  # The columns past each feature's own dim (before the first-order one) are never read.
  noisy = emb.copy()
  for f, dim in enumerate((4, 8, 16, 4)):
    noisy[:, layout.columns(f), dim:16] += 10.0
  chex.assert_trees_all_close(model(noisy, dense, weights), base, rtol=1e-5, atol=1e-5)
  noisy[:, layout.columns(1), 7] += 1.0  # the bag's 8th column is its own
  assert not np.allclose(np.asarray(model(noisy, dense, weights)), np.asarray(base))
  with pytest.raises(SpaceError, match="space.max_field_groups"):
    blocks.space_from_config(ml_collections.ConfigDict(dict(mlp_widths="8", max_field_groups=0)))


@pytest.mark.slow  # a whole search in-process (its search loop: tests/ctr_search)
def test_a_search_of_per_feature_dims_on_bags_completes(tmp_path):
  """Issue #22: generated models with one dim per pooled feature (8 features: one-hots,
  bags and a history) and the bags' poolings, on the planted multi-hot smoke data."""
  c = search_ctr.get_config("smoke")
  c.task.data = ctr_config.get_config("multihot_smoke").data
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 128, 512, 512
  c.task.steps_per_budget_unit = 2
  c.space.mlp_widths, c.space.max_field_groups = "8,400", 8
  c.space.poolings = "bag1:mean,long0:sqrtn"
  c.study.algorithm, c.study.num_trials, c.study.cohort_width = "random", 2, "1"
  c.study.min_budget = c.study.max_budget = 1.0
  summary = search_loop.run_search(c, str(tmp_path), BLOCK_SEARCH_SPACE)
  assert summary["num_trials_done"] == 2 and summary["num_failed"] == 0
  assert "features.bag1.pooling" in summary["best_config"]
  assert np.isfinite(summary["default_metrics"]["auc"])


@pytest.mark.slow  # a whole search in-process (its search loop: tests/ctr_search)
def test_a_tiny_search_over_generated_models_completes(tmp_path):
  c = search_ctr.get_config("smoke")
  s = c.task.data.synthetic
  s.num_train, s.num_eval, s.cardinality_scale, s.num_dense = 4096, 1024, 0.0001, 2
  c.task.batch_size, c.task.eval_rows, c.task.eval_batch_size = 64, 512, 512
  c.task.steps_per_budget_unit = 2
  c.space.mlp_widths = "8"
  c.study.algorithm, c.study.num_trials, c.study.cohort_width = "random", 2, "1"
  c.study.min_budget = c.study.max_budget = 1.0
  summary = search_loop.run_search(c, str(tmp_path), BLOCK_SEARCH_SPACE)
  assert summary["num_trials_done"] == 2
  assert summary["best_config"] is not None
  assert np.isfinite(summary["default_metrics"]["auc"])


def _point(blocks_on, combine="parallel", tower=True, linear=True, bottom=None, **settings):
  values = {f"model.{kind}.use": kind in blocks_on for kind in blocks.BLOCK_KINDS}
  values.update({"model.combine": combine, "model.dense.linear": linear,
                 "model.embedding.num_groups": 1, "model.embedding.group0.dim": 16,
                 "model.tower.use": tower, "model.dense.bottom.use": bottom is not None})
  if tower:
    values.update({"model.tower.depth": 3, "model.tower.width": 400})
  if bottom is not None:
    values.update({"model.dense.bottom.depth": len(bottom), "model.dense.bottom.width": bottom[0]})
  values.update({f"model.{k.replace('__', '.')}": v for k, v in settings.items()})
  return blocks.architecture_space().validate(values)


@pytest.mark.parametrize("name,hparams,point", [
    ("fm", {}, lambda: _point({"first_order", "fm"}, tower=False)),
    ("wide_deep", {}, lambda: _point({"first_order"})),
    ("dcnv2", {"cross_layers": 2, "cross_rank": 4},
     lambda: _point({"cross"}, combine="stacked", cross__layers=2, cross__rank=4)),
    ("dcnv2", {"cross_structure": "parallel"},
     lambda: _point({"cross"}, cross__layers=3, cross__rank=0)),
    ("xdeepfm", {"cin_dims": (32, 32)},
     lambda: _point({"first_order", "cin"}, cin__depth=2, cin__width=32)),
    ("autoint", {"attention_heads": 4},
     lambda: _point({"self_attention"}, self_attention__layers=2, self_attention__heads=4,
                    self_attention__head_dim=16)),
    ("dlrm", {"bottom_mlp_dims": (32,)},
     lambda: _point({"inner_product"}, combine="stacked", linear=False, bottom=(32,))),
])
def test_named_models_are_points_of_the_block_space(name, hparams, point):
  want = generator.named_model_spec(name, 16, mlp_dims=(400,) * 3, **hparams)
  assert generator.config_to_spec(point()) == want


def test_presets_are_the_named_models():
  space = blocks.block_space()
  for name in blocks.PRESETS:
    spec = generator.config_to_spec(blocks.preset_config(name, space))
    assert spec == generator.named_model_spec(name, 16, **{**blocks._trainer_hparams(name),  # pylint: disable=protected-access
                                                 **blocks.PRESET_HPARAMS.get(name, {})})
  narrow = blocks.preset_config("dcnv2", space, embed_dim=8, mlp_dims=(64, 64), cross_layers=1)
  assert generator.config_to_spec(narrow) == generator.named_model_spec(
      "dcnv2", 8, mlp_dims=(64, 64), cross_layers=1)
  assert blocks.default_config() == blocks.preset_config("deepfm")


def test_a_preset_the_space_cannot_hold_is_named():
  with pytest.raises(SpaceError, match="preset 'transformer'"):
    blocks.preset_config("transformer")
  with pytest.raises(SpaceError, match="equal widths"):
    blocks.preset_config("deepfm", mlp_dims=(64, 32))
  with pytest.raises(ConfigError, match="model.tower.width"):
    blocks.preset_config("wide_deep", blocks.block_space(tower_widths=(32,)))
