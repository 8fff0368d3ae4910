"""One cohort program call: eval halves, argument checks, donation, no recompiles."""

import copy
import dataclasses

import chex
import jax
import numpy as np
import pytest

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_call

ARCH = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 4})[0]


def test_split_eval_mask_halves_are_disjoint_and_cover_real_rows():
  mask = np.array([1, 1, 0, 1, 1, 1, 0, 0], np.float32)  # 5 real rows, padding anywhere
  valid, test = cohort_call.split_eval_mask(mask)
  np.testing.assert_array_equal(valid + test, mask)
  assert (valid * test).sum() == 0
  assert valid.sum() == 3 and test.sum() == 2
  assert np.flatnonzero(valid).max() < np.flatnonzero(test).min()


def test_stack_hparams_fills_defaults_per_trial():
  stacked = cohort_call.stack_hparams([{"embedding.learning_rate": 0.5}, {}])
  assert set(stacked) == set(arch_lib.DYNAMIC_KEYS)
  default = arch_lib.resolve_hparams({})["embedding.learning_rate"]
  np.testing.assert_array_equal(stacked["embedding.learning_rate"], np.float32([0.5, default]))


def test_stack_hparams_stacks_bag_poolings_with_the_data_sets_defaults():
  defaults = {"features.tags.pooling": 1.0, "features.long.pooling": 2.0}
  stacked = cohort_call.stack_hparams([{"features.tags.pooling": "sqrtn"}, {}], defaults)
  np.testing.assert_array_equal(stacked["features.tags.pooling"], [2.0, 1.0])
  assert "features.long.pooling" not in stacked  # no trial sets it: the program's default
  with pytest.raises(ValueError, match="'features.nope.pooling': not a multi_hot feature"):
    cohort_call.stack_hparams([{"features.nope.pooling": "sum"}], defaults)


def test_a_call_trains_each_lane_and_a_resume_leaves_the_callers_state(data):
  def call(seeds, start, end, states=None):
    return cohort_call.call_cohort(
        data, None, ARCH, {"embedding.learning_rate": np.float32([0.01, 0.05])}, seeds, start, end,
        states)

  first = call([0, 1], 0, 3)
  assert first.losses.shape == first.applied.shape == (2, 3) and first.applied.all()
  np.testing.assert_array_equal(first.steps, [3, 3])
  assert all(0.0 < a < 1.0 for a in first.auc) and first.auc[0] != first.auc[1]
  host = jax.device_get(first.states)
  kept = jax.tree.map(np.copy, host)
  again = call([0, 1], 3, 6, host)
  traces = cohort_call._num_traces()
  resumed = call([0, 1], 3, 6, host)  # the same host state, not consumed by the first resume
  np.testing.assert_array_equal(again.steps, [6, 6])
  np.testing.assert_array_equal(again.auc, resumed.auc)
  chex.assert_trees_all_equal(host, kept)
  call([2, 3], 0, 3)  # other seeds, same width and step count
  assert cohort_call._num_traces() == traces  # both programs were compiled already


def test_bad_calls_are_named(data):
  with pytest.raises(ValueError, match=r"hparams\['optimizer.learning_rate'\] has shape \(3,\)"):
    cohort_call.call_cohort(data, None, ARCH, {"optimizer.learning_rate": np.ones(3)}, [0, 1], 0, 2)
  with pytest.raises(ValueError, match="embedding.learning_rate"):
    cohort_call.call_cohort(data, None, ARCH, {"embedding.learning_rate": [-1.0]}, [0], 0, 2)
  with pytest.raises(ValueError, match="fresh trials start at step 0"):
    cohort_call.call_cohort(data, None, ARCH, {}, [0], 2, 4)
  with pytest.raises(ValueError, match="dense_masks need init_states"):
    cohort_call.call_cohort(data, None, ARCH, {}, [0], 0, 2, dense_masks={})
  with pytest.raises(ValueError, match="but only"):
    cohort_call.trial_mesh(len(jax.local_devices()) + 1)


def test_the_program_computes_its_dots_as_the_tasks_xla_cpu_dots_says(data, monkeypatch):
  arch = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                "model.mlp.depth": 1, "model.mlp.width": 16})[0]
  calls = []
  program_of = cohort_call.cohort_program

  def spy(*args):  # the program call_cohort compiles, and its arguments
    program = program_of(*args)

    def call(*inputs):
      calls.append((args[-1], program, inputs))
      return program(*inputs)
    return call

  monkeypatch.setattr(cohort_call, "cohort_program", spy)
  losses = {}
  for choice in ("eigen", "xla"):
    task_data = copy.copy(data)  # the same data, another task setting
    task_data.task = dataclasses.replace(data.task, xla_cpu_dots=choice)
    losses[choice] = cohort_call.call_cohort(task_data, None, arch, {}, [0, 1], 0, 3).losses
  (eigen_options, eigen, inputs), (xla_options, xla, _) = calls
  assert dict(eigen_options) == {"xla_cpu_experimental_ynn_fusion_type": ""}
  assert xla_options == () and eigen is not xla  # cached apart
  text = eigen.lower(*inputs).compile().as_text()
  assert "dot(" in text and "__ynn_fusion" not in text  # Eigen: XLA's own dot thunks
  np.testing.assert_allclose(losses["eigen"], losses["xla"], rtol=1e-5)  # float rounding only
