"""Shape buckets of the `composed` model: trials with different blocks in one padded program."""

import json

import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from search_spaces import blocks as block_space_lib
from sfjax.automl.algorithms import Objective, RandomSearch
from sfjax.automl.study import Study
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_call, trial_states
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import task as trial_data
from sfjax.cohorts.shape_buckets import bucket_blocks as padded_blocks
from sfjax.cohorts.shape_buckets import buckets as padded
from sfjax.ctr_search import search_round
from sfjax.train import step as step_lib
from tests.cohorts.conftest import assert_cohort_equals_each_trial_alone, assert_same_trial

STEPS = 12  # the shared `data` fixture's steps per budget unit (conftest.py)
FO, FM, IP = {"type": "first_order"}, {"type": "fm"}, {"type": "inner_product"}
GP = {"type": "gated_pairs"}
OP = {"type": "outer_product"}
CIN = {"type": "cin", "layer_dims": [3, 2]}
ATT = {"type": "self_attention", "layers": 1, "heads": 2, "head_dim": 2}


def _cross(layers, rank=0):
  return {"type": "cross", "layers": layers, "rank": rank}


def _arch(interactions, tower=(8,), linear=True, combine="parallel", dims=(4,), bias=None,
          inputs=None, bottom=None, **config):
  spec = {"embedding": {"dims": list(dims)}, "interactions": interactions, "combine": combine,
          "dense": {"linear": linear, "bottom_mlp": bottom},
          "tower": None if tower is None else {"dims": list(tower),
                                               **({"inputs": inputs} if inputs else {})},
          "bias": tower is None if bias is None else bias}
  text = json.dumps(spec)
  width = max(dims) + any(b["type"] == "first_order" for b in interactions)
  return arch_lib.split_config({"model.name": "composed", "model.blocks": text,
                                "model.embed_dim": width, **config})[0]


def _spec(arch):
  return json.loads(dict(arch.model_hparams)["blocks"])


def test_parallel_blocks_tower_sizes_and_dense_linear_share_a_bucket():
  base = _arch([FO, FM])
  same = [_arch([FO, FM, _cross(2)]), _arch([FO, CIN, ATT], tower=(32, 32, 32)),
          _arch([FO, GP], linear=False), _arch([FO]), _arch([FM, FO, IP]),
          _arch([FO, FM, _cross(1, 4)], tower=(16,)),
          _arch([FM]), _arch([IP, ATT], tower=(16,), linear=False),  # no first-order column
          _arch([FO, FM], dims=(8,)), _arch([FO, FM], tower=None),  # gated columns; no tower
          _arch([FM], tower=(8,), bias=True), _arch([FO, FM], inputs=["dense"]),
          _arch([FO, FM], inputs=["bottom", "embeddings"])]  # tower inputs: rows remapped
  for arch in same:
    assert padded.bucket_key(arch) == padded.bucket_key(base), arch.describe()
  other = [_arch([FO, FM], dims=(4, 8)),  # another group count: other fields share a dim
           _arch([FO, FM], tower=()),  # a tower without hidden layers cannot pad
           _arch([FO, FM], combine="stacked"),
           _arch([FO, FM], **{"embedding.optimizer": "adam"}),
           _arch([FO, FM], **{"optimizer.name": "sgd"}),
           _arch([FO, FM, FM])]  # one entry twice: not maskable
  for arch in other:
    assert padded.bucket_key(arch) != padded.bucket_key(base), arch.describe()


def test_row_wise_rows_leave_the_key_as_element_wise_ones_do():
  # Issue #26: rowwise_adagrad averages over each lane's own row width
  # (`lane_optimizers.ROW_WIDTH_KEY`), so its dims and first-order column are masked too.
  def rowwise(interactions, **kw):
    return _arch(interactions, **kw, **{"embedding.optimizer": "rowwise_adagrad"})

  base = rowwise([FO, FM])
  for arch in (rowwise([FO, IP], tower=None), rowwise([FO, FM, _cross(2)], bias=True),
               rowwise([FM]), rowwise([FO, FM], dims=(8,))):
    assert padded.bucket_key(arch) == padded.bucket_key(base), arch.describe()
  assert padded.bucket_key(_arch([FO, FM], dims=(8,)), True) == padded.bucket_key(base, True)
  assert padded.bucket_key(_arch([FO, FM])) != padded.bucket_key(base)  # unmerged: by optimizer


def test_first_order_and_bias_leave_the_key():
  # Issue #26: a parallel trial without `first_order` joins one with it (its rows gain a
  # zero first-order column whose gate is 0); the bias is masked like dense.linear.
  base = _arch([FO, FM], bias=True)
  for arch in (_arch([FM], bias=False), _arch([IP]), _arch([FO, FM], bias=False),
               _arch([FO, FM], **{"embedding.optimizer": "adam"})):
    assert padded.bucket_key(arch, True) == padded.bucket_key(base, True), arch.describe()
  stacked = _arch([FO, FM], combine="stacked")
  assert padded.bucket_key(stacked) == padded.bucket_key(_arch([FM], combine="stacked", bias=True))
  sup = padded.superset([_arch([FM], bias=False), _arch([FO, IP], bias=True)])
  assert _spec(sup)["bias"] is True and _spec(sup)["gated"] is True
  assert sup.embed_dim == sup.embedding_width == 5  # D + the first-order column


def test_pad_places_rows_without_first_order_in_the_first_columns(data):
  small = _arch([FM, IP], bias=False, **{"embedding.optimizer": "adam"})
  sup = padded.superset([small, _arch([FO, FM], bias=True, **{"embedding.optimizer": "ftrl"})])
  state = jax.device_get(trial_program.init_trial_state(
      small, data.spec, arch_lib.resolve_hparams({}), jax.random.key(2)))
  rng = np.random.default_rng(0)  # non-zero slots, to see where they go
  state = state._replace(table=state.table._replace(
      opt_slots=rng.random(state.table.opt_slots.shape).astype(np.float32)))
  template = trial_states.state_template(sup, data.spec)
  big, mask = padded.pad_state(state, template, arch=small, sup_arch=sup)
  values, slots = big.table.values, big.table.opt_slots  # [R, 5], adam's m|v: [R, 10]
  np.testing.assert_array_equal(values[:, :4], state.table.values)
  assert not values[:, 4].any()  # the first-order column: zero
  np.testing.assert_array_equal(slots[:, [0, 1, 2, 3, 5, 6, 7, 8]], state.table.opt_slots)
  assert not slots[:, [4, 9]].any()
  np.testing.assert_array_equal(big.params["gates"][...], [0, 1, 1])  # fo, fm, ip
  assert not big.params["bias"][...].any() and not mask["bias"][...].any()
  back = padded.unpad_state(big, trial_states.state_template(small, data.spec), arch=small,
                            sup_arch=sup)
  chex.assert_trees_all_equal(back, jax.tree.map(np.asarray, state))


def test_field_dims_of_one_group_count_share_a_parallel_bucket():
  # Issue #26: per-group dims are gated columns (`gated_columns`): only the group count
  # (which fields share a dim) stays in a parallel key, when F is not given.
  base = _arch([FO, FM], dims=(4, 8))
  for arch in (_arch([FO, FM], dims=(16, 4)), _arch([IP, ATT], dims=(8, 8), bias=True)):
    assert padded.bucket_key(arch, True) == padded.bucket_key(base, True), arch.describe()
  for arch in (_arch([FO, FM], dims=(4,)), _arch([FO, FM], dims=(4, 8, 8)),
               _arch([FO, FM], dims=(4, 16), combine="stacked")):
    assert padded.bucket_key(arch, True) != padded.bucket_key(base, True), arch.describe()
  sup = padded.superset([base, _arch([IP], dims=(16, 4))])
  assert _spec(sup)["embedding"]["dims"] == [16, 8] and _spec(sup)["gated_columns"] is True
  assert sup.embed_dim == 17  # D = 16, plus the first-order column
  text, sup_text = (dict(a.model_hparams)["blocks"] for a in (base, sup))
  gates = padded_blocks.column_gate_row(text, sup_text, num_fields=3)  # fields: 4, 4, 8
  np.testing.assert_array_equal(gates.sum(axis=1), [5, 5, 9])
  assert gates[:, -1].all() and not gates[0, 4:16].any()
  assert "gated_columns" not in _spec(padded.superset([base, _arch([IP], dims=(4, 8))]))


def test_stacked_block_sets_tower_inputs_and_dims_share_a_bucket():
  # Stacked blocks feed the tower: a block a trial lacks has zero tower rows (it adds 0).
  base = _arch([FO, _cross(1)], combine="stacked")
  for arch in (_arch([FO, _cross(3)], tower=(16, 16), linear=False, combine="stacked"),
               _arch([FO, FM, _cross(1)], combine="stacked"),
               _arch([_cross(1), FO], combine="stacked"),
               _arch([FM, _cross(1, 4)], combine="stacked", dims=(16,))):
    assert padded.bucket_key(arch) == padded.bucket_key(base), arch.describe()
  for arch in (_arch([FO, _cross(1)]), _arch([FO, _cross(1)], combine="stacked", tower=()),
               _arch([FO, _cross(1)], combine="stacked", dims=(4, 4))):
    assert padded.bucket_key(arch) != padded.bucket_key(base), arch.describe()
  sup = _spec(padded.superset([base, _arch([_cross(2), OP], combine="stacked", dims=(8,))]))
  assert sup["interactions"] == [FO, OP, _cross(2)] and sup["gated_columns"] is True
  assert "gated" not in sup and sup["tower"]["inputs"] == ["blocks"]


def test_superset_holds_the_union_of_blocks_gated_and_the_largest_sizes():
  archs = [_arch([FO, _cross(1), FM], tower=(8, 8, 8), linear=False),
           _arch([ATT, FO, _cross(3)], tower=(32,), linear=False), _arch([FO, CIN])]
  sup = _spec(padded.superset(archs))
  assert sup["interactions"] == [FO, {**FM, "pairs": None}, _cross(3), CIN, ATT]
  assert sup["gated"] is True and sup["tower"]["dims"] == [32, 32, 32]
  assert sup["dense"]["linear"] is True

  def text(a):
    return dict(a.model_hparams)["blocks"]

  sup_text = dict(padded.superset(archs).model_hparams)["blocks"]
  assert padded_blocks.block_index(text(archs[1]), sup_text) == (4, 0, 2)
  np.testing.assert_array_equal(padded_blocks.gate_row(text(archs[1]), sup_text), [1, 0, 1, 0, 1])
  # Same blocks: no gates; stacked: the union in canonical order, no block gates.
  assert "gated" not in _spec(padded.superset([_arch([FO, FM]), _arch([FM, FO], tower=(4, 4))]))
  stacked = _spec(padded.superset([_arch([_cross(1), FO], combine="stacked"),
                                   _arch([_cross(2), FO], tower=(4, 4), combine="stacked")]))
  assert stacked["interactions"] == [FO, _cross(2)] and "gated" not in stacked
  assert stacked["gated_columns"]  # the tower's rows of the blocks move (`ColumnLayout`)
  with pytest.raises(ValueError, match="2 buckets"):
    padded.superset([_arch([FO]), _arch([FM], dims=(8, 8))])


def test_pad_then_unpad_moves_blocks_to_their_superset_index_and_back(data):
  small = _arch([_cross(1), FO, ATT], tower=(8,), linear=False,
                **{"optimizer.name": "adamw"})
  big = _arch([FO, FM, _cross(2), ATT], tower=(16, 16), **{"optimizer.name": "adamw"})
  sup = padded.superset([small, big])
  state = jax.device_get(trial_program.init_trial_state(
      small, data.spec, arch_lib.resolve_hparams({}), jax.random.key(3)))
  rng = np.random.default_rng(0)  # distinct optimizer state values, to see them move
  state = state._replace(opt_state=jax.tree.map(
      lambda x: rng.random(np.shape(x)).astype(np.asarray(x).dtype), state.opt_state))
  template = trial_states.state_template(sup, data.spec)
  big_state, mask = padded.pad_state(state, template, arch=small, sup_arch=sup)
  chex.assert_trees_all_equal_shapes(big_state, template)
  np.testing.assert_array_equal(big_state.params["gates"][...], [1, 0, 1, 1])  # fo, fm, cross, att
  assert not mask["gates"][...].any()  # frozen
  cross, sup_cross = state.params["blocks"][0], big_state.params["blocks"][2]
  np.testing.assert_array_equal(sup_cross["layers"][0]["kernel"][...],
                                cross["layers"][0]["kernel"][...])
  assert not sup_cross["layers"][1]["kernel"][...].any()  # a missing cross layer: zero
  assert not mask["blocks"][2]["layers"][1]["kernel"][...].any()
  assert not big_state.params["dense_linear"]["kernel"][...].any()
  assert not mask["dense_linear"]["kernel"][...].any()
  np.testing.assert_array_equal(big_state.params["blocks"][3]["head"]["kernel"][...],
                                state.params["blocks"][2]["head"]["kernel"][...])
  back = padded.unpad_state(big_state, trial_states.state_template(small, data.spec), arch=small,
                            sup_arch=sup)
  chex.assert_trees_all_equal(back, jax.tree.map(np.asarray, state))
  with pytest.raises(ValueError, match="arch= and sup_arch="):
    padded.pad_state(state, template)


# (trial's blocks, its tower, its dense.linear); each runs in a superset of every case.
LOGIT_CASES = {
    "fm": ([FO, FM], (8,), True), "cross": ([FO, _cross(1)], (4,), True),
    "self_attention": ([ATT, FO], (8, 8), True), "cin": ([FO, CIN], (8,), False),
    "inner_product": ([FO, IP], (8,), True), "gated_pairs": ([FO, GP], (8,), True),
    "gated_pairs_no_linear": ([GP, FO], (16,), False),
    "no_first_order": ([FM, IP], (8,), True),
}
SUPERSET = _arch([FO, FM, _cross(3), ATT, CIN, IP, GP], tower=(16, 16))
# A trial inside a column-gated superset (`ColumnLayout`): other per-group dims (every
# block that reads them), tower inputs, no tower, stacked blocks of another set and order.
_WIDE = [FO, FM, _cross(2), _cross(1, 2), ATT, CIN, IP, GP, OP]
_STACKED = {"combine": "stacked", "inputs": ["blocks"]}
COLUMN_CASES = {
    "fm_tower": (dict(interactions=[FO, FM], dims=(2, 4)), dict(interactions=_WIDE, dims=(4, 8))),
    "cross": (dict(interactions=[FO, _cross(2, 0)], dims=(4, 2)),
              dict(interactions=_WIDE, tower=(16,), dims=(4, 8))),
    "cross_low_rank": (dict(interactions=[_cross(1, 2), IP], tower=(), dims=(2, 2)),
                       dict(interactions=_WIDE, tower=(), dims=(4, 8))),
    "attention": (dict(interactions=[ATT, GP], dims=(4, 2)), dict(interactions=_WIDE, dims=(4, 8))),
    "outer_cin": (dict(interactions=[OP, CIN, FO], tower=(8, 8), dims=(2, 4)),
                  dict(interactions=_WIDE, tower=(16,), dims=(4, 8))),
    "tower_inputs": (dict(interactions=[FO, FM], inputs=["dense"], bottom=[4]),
                     dict(interactions=[FO, IP], tower=(16,), dims=(8,), bottom=[4],
                          inputs=["embeddings", "dense", "bottom"])),
    "dense_from_rows": (dict(interactions=[FM], linear=False, inputs=["dense"]),  # no Nd leaf
                        dict(interactions=[IP], linear=False, dims=(8,),
                             inputs=["embeddings", "dense"])),
    "dense_from_superset_rows": (dict(interactions=[FM], linear=False, inputs=["embeddings"]),
                                 dict(interactions=[IP], linear=False,
                                      inputs=["dense", "embeddings"])),
    "no_tower": (dict(interactions=[FO, FM], tower=None, bottom=[4], dims=(2,)),
                 dict(interactions=[FM, _cross(1)], tower=(16, 16), bottom=[4],
                      inputs=["bottom", "embeddings"])),
    "stacked": (dict(interactions=[_cross(1), FO], **_STACKED),
                dict(interactions=[FO, FM, OP, _cross(2), ATT, CIN, IP], tower=(16, 16),
                     dims=(8,), combine="stacked", inputs=["embeddings", "blocks"])),
    "stacked_bottom": (dict(interactions=[OP, _cross(1, 2)], dims=(2,), bottom=[4],
                            combine="stacked", inputs=["blocks", "bottom"]),
                       dict(interactions=[FO, OP, _cross(1, 2), GP], bottom=[4],
                            combine="stacked", inputs=["bottom", "dense", "blocks"])),
}


def _assert_padded_is_exact(data, small, sup):
  """`small`'s fresh state padded into `sup` gives `small`'s logits, and unpads exactly."""
  state = jax.device_get(trial_program.init_trial_state(
      small, data.spec, arch_lib.resolve_hparams({}), jax.random.key(1)))
  template = trial_states.state_template(sup, data.spec)
  padded_state, _ = padded.pad_state(state, template, arch=small, sup_arch=sup)
  batch = jax.tree.map(lambda x: x[0], data.eval_batches)

  def logits(arch, s):
    return step_lib.eval_logits(
        trial_program.abstract_graphdef(arch, data.spec), s.params, s.table.values, batch)

  chex.assert_trees_all_close(logits(sup, padded_state), logits(small, state), atol=1e-5)
  back = padded.unpad_state(padded_state, trial_states.state_template(small, data.spec),
                            arch=small, sup_arch=sup)
  chex.assert_trees_all_equal(back, jax.tree.map(np.asarray, state))


@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_column_gated_model_gives_the_exact_models_logits(data, case):
  small_kw, wide_kw = COLUMN_CASES[case]
  small, wide = _arch(**small_kw), _arch(**wide_kw)
  sup = padded.superset([small, wide])
  assert _spec(sup)["gated_columns"]
  _assert_padded_is_exact(data, small, sup)


@pytest.mark.parametrize("case", sorted(LOGIT_CASES))
def test_padded_model_gives_the_exact_models_logits(data, case):
  interactions, tower, linear = LOGIT_CASES[case]
  small = _arch(interactions, tower=tower, linear=linear)
  sup = padded.superset([small, SUPERSET])
  assert _spec(sup)["gated"]
  state = jax.device_get(trial_program.init_trial_state(
      small, data.spec, arch_lib.resolve_hparams({}), jax.random.key(1)))
  padded_state, _ = padded.pad_state(state, trial_states.state_template(sup, data.spec),
                                     arch=small, sup_arch=sup)
  batch = jax.tree.map(lambda x: x[0], data.eval_batches)

  def logits(arch, s):
    return step_lib.eval_logits(
        trial_program.abstract_graphdef(arch, data.spec), s.params, s.table.values, batch)

  chex.assert_trees_all_close(logits(sup, padded_state), logits(small, state), atol=1e-5)


def test_padded_cohort_of_block_subsets_equals_each_trial_alone_fresh_and_resumed(data):
  adamw = {"optimizer.name": "adamw"}
  # Field dims differ (gated columns); the second has no tower; the third no first_order
  # (rows one column narrower), a bias, its tower's inputs reordered and adam rows (lanes).
  archs = [_arch([FO, FM], tower=(16, 16), dims=(4, 2), **adamw),
           _arch([FO, _cross(1), GP], tower=None, linear=False, dims=(2, 4), **adamw),
           _arch([IP, _cross(2)], tower=(16,), bias=True, dims=(4, 4), inputs=["dense", "embeddings"],
                 **adamw, **{"embedding.optimizer": "adam"})]
  assert len({padded.bucket_key(a, True) for a in archs}) == 1
  hparams = [{"embedding.learning_rate": 0.01, "optimizer.learning_rate": 1e-3, "optimizer.weight_decay": 1e-3},
             {"embedding.learning_rate": 0.03, "optimizer.learning_rate": 3e-3},
             {"embedding.learning_rate": 0.005, "optimizer.learning_rate": 1e-2, "optimizer.weight_decay": 1e-2}]
  assert_cohort_equals_each_trial_alone(data, archs, hparams, STEPS, merge_optimizers=True,
                                        num_programs=1)  # one padded program for the 3 sets


@pytest.mark.slow  # ~65 s on 2 cores: a padded program and three solo ones, twice each
def test_padded_cohort_of_stacked_block_sets_equals_each_trial_alone(data):
  # Stacked blocks of other sets and orders, tower inputs and dims: tower rows remapped.
  archs = [_arch([_cross(1), FO], dims=(2,), bottom=[4], combine="stacked",
                 inputs=["blocks", "bottom"]),
           _arch([FO, OP, FM], tower=(16,), bottom=[4], combine="stacked",
                 inputs=["embeddings", "blocks"], **{"embedding.optimizer": "adam"}),
           _arch([ATT, _cross(2, 2)], dims=(4,), bottom=[4], combine="stacked",
                 inputs=["dense", "blocks"], **{"embedding.optimizer": "sgd"})]
  assert len({padded.bucket_key(a, True) for a in archs}) == 1
  hparams = [{"embedding.learning_rate": 0.02, "optimizer.learning_rate": 3e-3}] * 3
  assert_cohort_equals_each_trial_alone(data, archs, hparams, STEPS, merge_optimizers=True)


def test_block_space_rounds_are_free_proposals_merged_by_gated_buckets(tmp_path):
  # Issue #26: a round is the algorithm's own proposals (as `study.ask` gives them), and
  # cohorts are formed from them: parallel specs of different block sets share a gated
  # superset's bucket, so the 8 proposals need fewer programs than architectures.
  space = block_space_lib.block_space()
  merged_any = False
  for seed in range(3):
    with Study.open(str(tmp_path / str(seed)), space, RandomSearch(seed=seed),
                    Objective("auc", "maximize")) as study:
      batch = search_round.ask_round(study, 8)
    with Study.open(str(tmp_path / f"free{seed}"), space, RandomSearch(seed=seed),
                    Objective("auc", "maximize")) as study:
      free = study.ask(8)
    assert [s.config for s in batch] == [s.config for s in free]
    archs = [arch_lib.split_config(block_space_lib.runner_config(s.config))[0] for s in batch]
    groups = search_round.form_cohorts(archs, merge_optimizers=True)
    assert sorted(i for g in groups for i in g) == list(range(8))
    for g in groups:
      assert len({padded.bucket_key(archs[i], True) for i in g}) == 1
    merged_any |= any(len({archs[i] for i in g}) > 1 for g in groups)
  assert merged_any  # some program holds different block sets (gated)


def test_block_space_bucket_keys_fix_used_sub_spaces_and_free_the_masked_sizes():
  space = block_space_lib.block_space()
  first = {"model.combine": "parallel", "model.cross.use": True, "model.cin.use": False}
  fixed = set(block_space_lib.bucket_fixed_keys(first, space.keys))
  free = {"model.tower.depth", "model.tower.width", "model.cross.layers", "model.dense.linear",
          "model.fm.use", "model.outer_product.use", "model.cross.use", "optimizer.learning_rate"}
  assert not fixed & free
  assert {"model.cross.rank", "model.cin.use", "model.first_order.use", "model.combine",
          "model.embedding.num_groups", "embedding.optimizer"} <= fixed
  stacked = set(block_space_lib.bucket_fixed_keys({**first, "model.combine": "stacked"},
                                                  space.keys))
  assert {"model.fm.use", "model.cross.use"} <= stacked and "model.cross.layers" not in stacked


@pytest.fixture(scope="module")
def nodense():
  """The `data` fixture's task without dense features (Nd = 0, as the smoke search's data)."""
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale, d.synthetic.num_eval, d.synthetic.num_dense = 1e-4, 4096, 0
  task = trial_data.CTRTask(d, batch_size=128, eval_rows=1500, steps_per_budget_unit=STEPS,
                            eval_batch_size=512)
  return trial_data.TrialData(task)


def test_without_dense_features_the_bottom_mlp_and_dense_inputs_leave_the_key():
  # Issue #26: with Nd = 0 no bottom MLP is built and "dense"/"bottom" read 0 columns.
  base = _arch([FO, FM])
  # (a hidden tower's inputs are masked whatever Nd; its bottom MLP only when Nd = 0)
  same = [_arch([FO, FM], bottom=[4]), _arch([FM], bottom=[4], inputs=["bottom", "embeddings"]),
          _arch([IP], bottom=[8, 4], inputs=["embeddings", "dense"], tower=(16,))]
  for arch in same:
    assert padded.bucket_key(arch, True, 0) == padded.bucket_key(base, True, 0), arch.describe()
    assert padded.bucket_key(arch, True, 13) != padded.bucket_key(base, True, 13)
    assert padded.bucket_key(arch, True) != padded.bucket_key(base, True)  # Nd unknown
  flat = _arch([FO, FM], tower=(), inputs=["embeddings"])
  assert (padded.bucket_key(_arch([IP], tower=(), inputs=["dense", "embeddings"]), True, 0)
          == padded.bucket_key(flat, True, 0))
  assert padded.bucket_key(_arch([FO, FM], tower=(), inputs=["dense"]), True, 0) != (
      padded.bucket_key(flat, True, 0))  # no embeddings read: not the same tower
  sup = _spec(padded.superset([_arch([FO, FM], tower=(), inputs=["embeddings"]),
                               _arch([IP], tower=(), inputs=["dense", "embeddings"])], 0))
  assert sup["tower"] == {"dims": [], "inputs": ["embeddings", "dense"]}
  with pytest.raises(ValueError, match="different buckets"):
    padded_blocks.superset_blocks([dict(_arch([FM]).model_hparams)["blocks"],
                                   dict(_arch([FM], bottom=[4]).model_hparams)["blocks"]], 13)


NODENSE_CASES = {
    "bottom_and_inputs": (dict(interactions=[FO, FM], bottom=[4], inputs=["bottom", "embeddings"]),
                          dict(interactions=[FO, IP], tower=(16,), dims=(8,),
                               inputs=["embeddings", "dense"])),
    "flat_tower": (dict(interactions=[FO, FM], tower=(), inputs=["dense", "embeddings"]),
                   dict(interactions=[IP, _cross(1)], tower=(), bottom=[4], dims=(8,),
                        inputs=["embeddings", "bottom"])),
}


@pytest.mark.parametrize("case", sorted(NODENSE_CASES))
def test_without_dense_features_a_padded_model_gives_the_exact_models_logits(nodense, case):
  small, wide = (_arch(**kw) for kw in NODENSE_CASES[case])
  sup = padded.superset([small, wide], nodense.spec.num_dense)
  _assert_padded_is_exact(nodense, small, sup)


@pytest.mark.slow  # a padded program and two solo ones
def test_without_dense_features_a_padded_cohort_equals_each_trial_alone(nodense):
  data = nodense
  archs = [_arch([FO, FM], bottom=[4], inputs=["bottom", "embeddings", "dense"], dims=(2,)),
           _arch([IP, _cross(1)], tower=(16,), bias=True, **{"embedding.optimizer": "adam"})]
  assert len({padded.bucket_key(a, True, 0) for a in archs}) == 1
  hparams = [{"embedding.learning_rate": 0.02, "optimizer.learning_rate": 3e-3}] * 2
  runner = cohort.CohortRunner(data.task, cohort_width=4, data=data)
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  traces = cohort_call._num_traces()
  got = runner.run(archs, hparams, [0, 1], [0, 0], STEPS, [None, None], merge_optimizers=True)
  assert cohort_call._num_traces() - traces == 1  # one padded program for both
  for i, arch in enumerate(archs):
    assert_same_trial(got[i], alone.run(arch, [hparams[i]], [i], [0], STEPS, [None])[0])
