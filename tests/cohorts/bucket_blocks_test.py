"""Shape buckets of the `composed` model: trials with different blocks in one padded program."""

import json

import chex
import jax
import numpy as np
import pytest

from search_spaces import blocks as block_space_lib
from sfjax.automl.algorithms import Objective, RandomSearch
from sfjax.automl.study import Study
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import bucket_blocks as padded_blocks
from sfjax.cohorts import buckets as padded
from sfjax.cohorts import cohort_call, trial_states
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts import program as trial_program
from sfjax.ctr_search import search_loop
from sfjax.train import step as step_lib

STEPS = 12  # the shared `data` fixture's steps per budget unit (conftest.py)
FO, FM, IP = {"type": "first_order"}, {"type": "fm"}, {"type": "inner_product"}
GP = {"type": "gated_pairs"}
CIN = {"type": "cin", "layer_dims": [3, 2]}
ATT = {"type": "self_attention", "layers": 1, "heads": 2, "head_dim": 2}


def _cross(layers, rank=0):
  return {"type": "cross", "layers": layers, "rank": rank}


def _arch(interactions, tower=(8,), linear=True, combine="parallel", dims=(4,), **config):
  spec = {"embedding": {"dims": list(dims)}, "interactions": interactions, "combine": combine,
          "dense": {"linear": linear},
          "tower": None if tower is None else {"dims": list(tower)}, "bias": tower is None}
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
          _arch([FO, FM, _cross(1, 4)], tower=(16,))]
  for arch in same:
    assert padded.bucket_key(arch) == padded.bucket_key(base), arch.describe()
  other = [_arch([FM]),  # no first-order column: rows of another width
           _arch([FO, FM], dims=(8,)), _arch([FO, FM], tower=None),
           _arch([FO, FM], tower=()),  # a tower without hidden layers cannot pad
           _arch([FO, FM], combine="stacked"),
           _arch([FO, FM], **{"embedding.optimizer": "adam"}),
           _arch([FO, FM, FM])]  # one entry twice: not maskable
  for arch in other:
    assert padded.bucket_key(arch) != padded.bucket_key(base), arch.describe()


def test_stacked_blocks_stay_in_the_key_but_sizes_do_not():
  base = _arch([FO, _cross(1)], combine="stacked")
  for arch in (_arch([FO, _cross(3)], tower=(16, 16), linear=False, combine="stacked"),):
    assert padded.bucket_key(arch) == padded.bucket_key(base)
  for arch in (_arch([FO, FM, _cross(1)], combine="stacked"),
               _arch([_cross(1), FO], combine="stacked"),  # the tower reads blocks in order
               _arch([FO, _cross(1, 4)], combine="stacked")):
    assert padded.bucket_key(arch) != padded.bucket_key(base), arch.describe()


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
  # Same blocks: no gates; stacked: the trials' block order, no gates.
  assert "gated" not in _spec(padded.superset([_arch([FO, FM]), _arch([FM, FO], tower=(4, 4))]))
  stacked = _spec(padded.superset([_arch([_cross(1), FO], combine="stacked"),
                                   _arch([_cross(2), FO], tower=(4, 4), combine="stacked")]))
  assert stacked["interactions"] == [_cross(2), FO] and "gated" not in stacked
  with pytest.raises(ValueError, match="2 buckets"):
    padded.superset([_arch([FO]), _arch([FM])])


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
}
SUPERSET = _arch([FO, FM, _cross(3), ATT, CIN, IP, GP], tower=(16, 16))


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


def _assert_same(got, want):
  assert got.status == want.status == "done"
  for key in ("auc", "logloss", "train_loss", "test_auc", "params", "flops", "steps"):
    assert abs(got.metrics[key] - want.metrics[key]) <= 1e-5 * max(1.0, abs(want.metrics[key])), key
  chex.assert_trees_all_close(got.state, want.state, atol=5e-5, rtol=1e-4)


def test_padded_cohort_of_block_subsets_equals_each_trial_alone_fresh_and_resumed(data):
  adamw = {"optimizer.name": "adamw"}
  archs = [_arch([FO, FM], tower=(16, 16), **adamw),
           _arch([FO, _cross(1), GP], tower=(8,), linear=False, **adamw),
           _arch([IP, FO, _cross(2)], tower=(16,), **adamw)]
  assert len({padded.bucket_key(a) for a in archs}) == 1
  hparams = [{"embedding.learning_rate": 0.01, "optimizer.learning_rate": 1e-3, "optimizer.weight_decay": 1e-3},
             {"embedding.learning_rate": 0.03, "optimizer.learning_rate": 3e-3},
             {"embedding.learning_rate": 0.005, "optimizer.learning_rate": 1e-2, "optimizer.weight_decay": 1e-2}]
  n = len(archs)
  runner = cohort.CohortRunner(data.task, cohort_width=4, data=data)
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  traces = cohort_call._num_traces()
  half = runner.run(archs, hparams, list(range(n)), [0] * n, STEPS // 2, [None] * n)
  assert cohort_call._num_traces() - traces == 1  # one padded program for the 3 block sets
  full = runner.run(archs, hparams, list(range(n)), [STEPS // 2] * n, STEPS,
                    [r.state for r in half])
  for i, arch in enumerate(archs):
    ref_half = alone.run(arch, [hparams[i]], [i], [0], STEPS // 2, [None])[0]
    ref_full = alone.run(arch, [hparams[i]], [i], [STEPS // 2], STEPS, [ref_half.state])[0]
    _assert_same(half[i], ref_half)
    _assert_same(full[i], ref_full)
    chex.assert_trees_all_equal_shapes(full[i].state, trial_states.state_template(arch, data.spec))


def test_block_space_rounds_are_free_proposals_merged_by_gated_buckets(tmp_path):
  # Issue #26: a round is the algorithm's own proposals (as `study.ask` gives them), and
  # cohorts are formed from them: parallel specs of different block sets share a gated
  # superset's bucket, so the 8 proposals need fewer programs than architectures.
  space = block_space_lib.block_space()
  merged_any = False
  for seed in range(3):
    with Study.open(str(tmp_path / str(seed)), space, RandomSearch(seed=seed),
                    Objective("auc", "maximize")) as study:
      batch = search_loop.ask_round(study, 8)
    with Study.open(str(tmp_path / f"free{seed}"), space, RandomSearch(seed=seed),
                    Objective("auc", "maximize")) as study:
      free = study.ask(8)
    assert [s.config for s in batch] == [s.config for s in free]
    archs = [arch_lib.split_config(block_space_lib.runner_config(s.config))[0] for s in batch]
    groups = search_loop.form_cohorts(archs, merge_optimizers=True)
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
