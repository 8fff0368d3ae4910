"""Shape buckets: padded programs equal each trial run alone with its own shapes."""

import dataclasses

import chex
import jax
import numpy as np
import pytest

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import trial_states
from sfjax.cohorts.shape_buckets import buckets as padded
from sfjax.train import step as step_lib
from tests.cohorts.conftest import assert_cohort_equals_each_trial_alone

STEPS = 12  # the shared `data` fixture's steps per budget unit (conftest.py)


def _arch(**overrides):
  config = {"model.name": "dcnv2", "model.embed_dim": 4, "model.mlp.depth": 1,
            "model.mlp.width": 16, "model.cross_layers": 1, "optimizer.name": "adamw"}
  return arch_lib.split_config({**config, **overrides})[0]


def test_bucket_holds_sizes_but_not_family_or_optimizers():
  base = _arch()  # adagrad rows: element-wise, so embed_dim is masked
  same = [_arch(**{"model.mlp.depth": 3, "model.mlp.width": 64}), _arch(**{"model.cross_layers": 3}),
          _arch(**{"model.cross_layers": 0}), _arch(**{"model.embed_dim": 8})]
  for arch in same:
    assert padded.bucket_key(arch) == padded.bucket_key(base)
  other = [_arch(**{"embedding.optimizer": "adam"}),
           _arch(**{"optimizer.name": "adam"}), _arch(**{"model.cross_rank": 4}),
           _arch(**{"model.name": "deepfm"}), _arch(**{"model.mlp.depth": 0})]
  for arch in other:
    assert padded.bucket_key(arch) != padded.bucket_key(base), arch.describe()


@pytest.mark.parametrize("row_opt", ["sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad"])
def test_embed_dim_is_masked_only_for_element_wise_row_optimizers(row_opt):
  small, big = (_arch(**{"model.embed_dim": d, "embedding.optimizer": row_opt}) for d in (4, 8))
  maskable = row_opt != "rowwise_adagrad"
  assert (padded.bucket_key(small) == padded.bucket_key(big)) == maskable
  # A model outside padded_layout.EMBED_MASKABLE_MODELS keeps its row width in the key.
  other = [dataclasses.replace(a, model_name="composed") for a in (small, big)]
  assert padded.bucket_key(other[0]) != padded.bucket_key(other[1])


def test_fixed_config_keys_free_embed_dim_only_for_maskable_first_configs():
  keys = ("model.name", "model.embed_dim", "embedding.optimizer", "model.mlp.depth",
          "model.mlp.width", "model.cross_layers", "model.cross_rank")
  free = {"model.name": "deepfm", "embedding.optimizer": "adam"}
  assert padded.fixed_config_keys(free, keys) == (
      "model.name", "embedding.optimizer", "model.cross_rank")
  for config in ({**free, "embedding.optimizer": "rowwise_adagrad"},
                 {**free, "model.name": "composed"}, {"model.name": "deepfm"}):
    assert padded.fixed_config_keys(config, keys) == (
        "model.name", "model.embed_dim", "embedding.optimizer", "model.cross_rank")


def test_superset_takes_the_largest_sizes_and_refuses_two_buckets():
  sup = padded.superset([_arch(**{"model.mlp.depth": 3, "model.mlp.width": 8}),
                         _arch(**{"model.mlp.width": 64, "model.cross_layers": 2})])
  hparams = dict(sup.model_hparams)
  assert hparams["mlp_dims"] == (64, 64, 64) and hparams["cross_layers"] == 2
  assert padded.superset([_arch(**{"model.embed_dim": 8}), _arch(**{"model.embed_dim": 2})]
                         ).embed_dim == 8
  with pytest.raises(ValueError, match="2 buckets"):
    rowwise = {"embedding.optimizer": "rowwise_adagrad"}
    padded.superset([_arch(**rowwise), _arch(**{**rowwise, "model.embed_dim": 8})])
  with pytest.raises(ValueError, match="no architectures"):
    padded.superset([])


def test_pad_then_unpad_is_the_identity_and_the_mask_marks_own_entries(data):
  small = _arch(**{"model.mlp.depth": 1, "model.mlp.width": 8, "model.cross_layers": 0})
  sup = padded.superset([small, _arch(**{"model.mlp.depth": 3, "model.mlp.width": 32,
                                         "model.cross_layers": 2})])
  hparams = arch_lib.resolve_hparams({})
  state = jax.device_get(trial_program.init_trial_state(small, data.spec, hparams,
                                                        jax.random.key(3)))
  sup_template = trial_states.state_template(sup, data.spec)
  big, mask = padded.pad_state(state, sup_template)
  chex.assert_trees_all_equal_shapes(big, sup_template)
  back = padded.unpad_state(big, trial_states.state_template(small, data.spec))
  chex.assert_trees_all_equal(back, jax.tree.map(np.asarray, state))
  leaves = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(big.params)[0]}
  masks = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  hidden1 = [k for k in leaves if "['hidden'][1]" in k and "kernel" in k][0]
  np.testing.assert_array_equal(leaves[hidden1], np.eye(32))  # a layer past the depth: identity
  assert masks[hidden1].sum() == 0  # ... frozen
  hidden0 = [k for k in leaves if "['hidden'][0]" in k and "kernel" in k][0]
  assert masks[hidden0][:, :8].all() and not masks[hidden0][:, 8:].any()
  assert not leaves[hidden0][:, 8:].any()  # units the trial lacks: zero weights
  cross = [k for k in leaves if "['cross']" in k]
  assert cross and all(not leaves[k].any() and not masks[k].any() for k in cross)
  with pytest.raises(ValueError, match="does not fit"):
    padded.pad_state(big, trial_states.state_template(small, data.spec))


def test_embed_dim_remap_places_columns_slots_and_flat_inputs(data):
  """deepfm + adam rows: latent columns, the first-order column, both slot blocks and the
  MLP's flattened input move to the superset's layout; unpad inverts it."""
  small = _arch(**{"model.name": "deepfm", "model.embed_dim": 3,
                   "embedding.optimizer": "adam"})
  sup = padded.superset([small, _arch(**{"model.name": "deepfm", "model.embed_dim": 5,
                                         "embedding.optimizer": "adam"})])
  state = jax.device_get(trial_program.init_trial_state(
      small, data.spec, arch_lib.resolve_hparams({}), jax.random.key(4)))
  state = state._replace(table=state.table._replace(opt_slots=np.random.default_rng(0).random(
      state.table.opt_slots.shape, np.float32)))  # distinct m | v values
  big, mask = padded.pad_state(state, trial_states.state_template(sup, data.spec))
  values, slots = big.table.values, big.table.opt_slots  # [V, 6], [V, 12]: d=3 -> D=5 (+1)
  np.testing.assert_array_equal(values[:, [0, 1, 2, 5]], state.table.values)
  assert not values[:, 3:5].any()
  np.testing.assert_array_equal(slots[:, [0, 1, 2, 5, 6, 7, 8, 11]], state.table.opt_slots)
  assert not slots[:, [3, 4, 9, 10]].any()  # adam's padded m and v: zero
  f, nd = data.spec.num_fields, data.spec.num_dense
  kernel = state.params["mlp"]["hidden"][0]["kernel"][...]  # [F*3 + Nd, 16]
  big_kernel = big.params["mlp"]["hidden"][0]["kernel"][...]  # [F*5 + Nd, 16]
  rows = np.concatenate([(np.arange(f)[:, None] * 5 + np.arange(3)).ravel(), f * 5 + np.arange(nd)])
  np.testing.assert_array_equal(big_kernel[rows], kernel)
  kept = np.zeros(big_kernel.shape[0], bool)
  kept[rows] = True
  assert not big_kernel[~kept].any()
  assert mask["mlp"]["hidden"][0]["kernel"][...][rows].all()
  assert not mask["mlp"]["hidden"][0]["kernel"][...][~kept].any()
  back = padded.unpad_state(big, trial_states.state_template(small, data.spec))
  chex.assert_trees_all_equal(back, jax.tree.map(np.asarray, state))


# (family, overrides of both archs): every model padded_layout declares embed-maskable.
LOGIT_CASES = [
    ("deepfm", {}), ("wide_deep", {}), ("xdeepfm", {}), ("autoint", {}), ("dlrm", {}),
    ("fm", {}), ("dcnv2", {}), ("dcnv2", {"model.cross_structure": "parallel"}),
    ("dcnv2", {"model.cross_rank": 3}), ("deepfm", {"model.mlp.depth": 0}),
    ("dcnv2", {"model.cross_structure": "parallel", "model.mlp.depth": 0}),
]


@pytest.mark.parametrize("family,extra", LOGIT_CASES)
def test_padded_model_gives_the_exact_models_logits(data, family, extra):
  small = _arch(**{"model.name": family, "model.mlp.depth": 1, "model.mlp.width": 8,
                   "model.cross_layers": 0, "model.embed_dim": 3, **extra})
  big = _arch(**{"model.name": family, "model.mlp.depth": 3, "model.mlp.width": 24,
                 "model.cross_layers": 2, "model.embed_dim": 6, **extra})
  assert padded.bucket_key(small) == padded.bucket_key(big)
  sup = padded.superset([small, big])
  state = jax.device_get(trial_program.init_trial_state(
      small, data.spec, arch_lib.resolve_hparams({}), jax.random.key(1)))
  padded_state, _ = padded.pad_state(state, trial_states.state_template(sup, data.spec))
  batch = jax.tree.map(lambda x: x[0], data.eval_batches)

  def logits(arch, s):
    return step_lib.eval_logits(
        trial_program.abstract_graphdef(arch, data.spec), s.params, s.table.values, batch)

  chex.assert_trees_all_close(logits(sup, padded_state), logits(small, state), atol=1e-5)


ARCHS = [dict(d) for d in (  # dcnv2 + adagrad rows: one bucket
    {"model.mlp.depth": 1, "model.mlp.width": 16, "model.cross_layers": 1},
    {"model.mlp.depth": 2, "model.mlp.width": 32, "model.cross_layers": 0, "model.embed_dim": 8},
    {"model.mlp.depth": 3, "model.mlp.width": 8, "model.cross_layers": 2, "model.embed_dim": 2},
)]
HPARAMS = [
    {"embedding.learning_rate": 0.01, "optimizer.learning_rate": 1e-3, "optimizer.weight_decay": 1e-3},
    {"embedding.learning_rate": 0.03, "optimizer.learning_rate": 3e-3},
    {"embedding.learning_rate": 0.005, "optimizer.learning_rate": 1e-2, "optimizer.weight_decay": 1e-2},
]


def _check_against_alone(data, archs, hparams, num_programs):
  """Fresh then resumed padded cohorts of `archs` equal each trial run alone."""
  assert_cohort_equals_each_trial_alone(data, archs, hparams, STEPS, num_programs=num_programs)


def test_padded_cohort_equals_each_trial_alone_fresh_and_resumed(data):
  archs = [_arch(**a) for a in ARCHS]
  assert len({padded.bucket_key(a) for a in archs}) == 1
  _check_against_alone(data, archs, HPARAMS, 1)  # one padded program for the 3 archs


def test_padded_cohort_with_adam_rows_and_first_order_columns_equals_each_trial_alone(data):
  """deepfm + lazy Adam rows: trials of embed_dim 2 and 5 in one padded program."""
  archs = [_arch(**{"model.name": "deepfm", "embedding.optimizer": "adam", **a}) for a in (
      {"model.embed_dim": 2, "model.mlp.width": 8},
      {"model.embed_dim": 5, "model.mlp.depth": 2})]
  assert len({padded.bucket_key(a) for a in archs}) == 1
  _check_against_alone(data, archs, HPARAMS[1:3], 1)
