"""Shape buckets: padded programs equal each trial run alone with its own shapes."""

import chex
import jax
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.ctr_search import arch as arch_lib
from sfjax.ctr_search import cohort
from sfjax.ctr_search import padded
from sfjax.ctr_search import trial_data
from sfjax.ctr_search import trial_program
from sfjax.ctr_search import trial_states
from sfjax.train import step as step_lib

STEPS = 12


def _arch(**overrides):
  config = {"model.name": "dcnv2", "model.embed_dim": 4, "model.mlp.depth": 1,
            "model.mlp.width": 16, "model.cross_layers": 1, "optim.dense_optimizer": "adamw"}
  return arch_lib.split_config({**config, **overrides})[0]


@pytest.fixture(scope="module")
def data():
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale, d.synthetic.num_eval = 1e-4, 4096  # ~3.4k table rows
  task = trial_data.CTRTask(d, batch_size=128, eval_rows=1500, steps_per_budget_unit=STEPS,
                            eval_batch_size=512)
  return trial_data.TrialData(task)


def test_bucket_holds_sizes_but_not_family_row_width_or_optimizers():
  base = _arch()
  same = [_arch(**{"model.mlp.depth": 3, "model.mlp.width": 64}), _arch(**{"model.cross_layers": 3}),
          _arch(**{"model.cross_layers": 0})]
  for arch in same:
    assert padded.bucket_key(arch) == padded.bucket_key(base)
  other = [_arch(**{"model.embed_dim": 8}), _arch(**{"optim.embedding_optimizer": "adam"}),
           _arch(**{"optim.dense_optimizer": "adam"}), _arch(**{"model.cross_rank": 4}),
           _arch(**{"model.name": "deepfm"}), _arch(**{"model.mlp.depth": 0})]
  for arch in other:
    assert padded.bucket_key(arch) != padded.bucket_key(base), arch.describe()


def test_superset_takes_the_largest_sizes_and_refuses_two_buckets():
  sup = padded.superset([_arch(**{"model.mlp.depth": 3, "model.mlp.width": 8}),
                         _arch(**{"model.mlp.width": 64, "model.cross_layers": 2})])
  hparams = dict(sup.model_hparams)
  assert hparams["mlp_dims"] == (64, 64, 64) and hparams["cross_layers"] == 2
  with pytest.raises(ValueError, match="2 buckets"):
    padded.superset([_arch(), _arch(**{"model.embed_dim": 8})])
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


@pytest.mark.parametrize("family", ["deepfm", "wide_deep", "dcnv2", "xdeepfm", "autoint", "dlrm"])
def test_padded_model_gives_the_exact_models_logits(data, family):
  small = _arch(**{"model.name": family, "model.mlp.depth": 1, "model.mlp.width": 8,
                   "model.cross_layers": 0})
  big = _arch(**{"model.name": family, "model.mlp.depth": 3, "model.mlp.width": 24,
                 "model.cross_layers": 2})
  assert padded.bucket_key(small) == padded.bucket_key(big)
  sup = padded.superset([small, big])
  state = jax.device_get(trial_program.init_trial_state(
      small, data.spec, arch_lib.resolve_hparams({}), jax.random.key(1)))
  padded_state, _ = padded.pad_state(state, trial_states.state_template(sup, data.spec))
  batch = jax.tree.map(lambda x: x[0], data.eval_batches)
  logits = lambda arch, s: step_lib.eval_logits(
      trial_program.abstract_graphdef(arch, data.spec), s.params, s.table.values, batch)
  chex.assert_trees_all_close(logits(sup, padded_state), logits(small, state), atol=1e-5)


ARCHS = [dict(d) for d in (
    {"model.mlp.depth": 1, "model.mlp.width": 16, "model.cross_layers": 1},
    {"model.mlp.depth": 2, "model.mlp.width": 32, "model.cross_layers": 0},
    {"model.mlp.depth": 3, "model.mlp.width": 8, "model.cross_layers": 2},
    {"model.mlp.depth": 2, "model.mlp.width": 16, "model.cross_layers": 1,
     "model.cross_structure": "parallel"},
)]
HPARAMS = [
    {"optim.embedding_lr": 0.01, "optim.dense_lr": 1e-3, "optim.weight_decay": 1e-3},
    {"optim.embedding_lr": 0.03, "optim.dense_lr": 3e-3},
    {"optim.embedding_lr": 0.005, "optim.dense_lr": 1e-2, "optim.weight_decay": 1e-2},
    {"optim.embedding_lr": 0.02, "optim.embedding_l2": 1e-4},
]


def _assert_same(got, want):
  assert got.status == want.status == "done"
  for key in ("auc", "logloss", "train_loss", "test_auc", "params", "flops", "steps"):
    assert abs(got.metrics[key] - want.metrics[key]) <= 1e-5 * max(1.0, abs(want.metrics[key])), key
  chex.assert_trees_all_close(got.state, want.state, atol=5e-5, rtol=1e-4)


def test_padded_cohort_equals_each_trial_alone_fresh_and_resumed(data):
  archs = [_arch(**a) for a in ARCHS[:3]] + [_arch(**{**ARCHS[3]})]
  # The parallel structure is another bucket: it runs as its own group in the same call.
  assert len({padded.bucket_key(a) for a in archs}) == 2
  runner = cohort.CohortRunner(data.task, cohort_width=4, data=data)
  alone = cohort.CohortRunner(data.task, cohort_width=1, data=data)
  seeds = [0, 1, 2, 3]
  traces = cohort.num_traces()
  half = runner.run(archs, HPARAMS, seeds, [0] * 4, STEPS // 2, [None] * 4)
  assert cohort.num_traces() - traces == 2  # one padded program (3 archs) + the lone 4th
  full = runner.run(archs, HPARAMS, seeds, [STEPS // 2] * 4, STEPS, [r.state for r in half])
  for i, arch in enumerate(archs):
    ref_half = alone.run(arch, [HPARAMS[i]], [seeds[i]], [0], STEPS // 2, [None])[0]
    ref_full = alone.run(arch, [HPARAMS[i]], [seeds[i]], [STEPS // 2], STEPS, [ref_half.state])[0]
    _assert_same(half[i], ref_half)
    _assert_same(full[i], ref_full)
    chex.assert_trees_all_equal_shapes(full[i].state, trial_states.state_template(arch, data.spec))
