"""Per-lane row optimizers: a mixed-optimizer cohort equals each trial run alone."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_call, lane_optimizers
from sfjax.cohorts import cohort_runner as cohort
from sfjax.cohorts.shape_buckets import buckets
from sfjax.embedding import row_optimizers
from sfjax.train import defaults as ctr_defaults_lib
from tests.cohorts.conftest import assert_cohort_equals_each_trial_alone

STEPS = 12  # the shared `data` fixture's steps per budget unit (conftest.py)
_EMB = ctr_defaults_lib.ctr_defaults().embedding


def _arch(**overrides):
  config = {"model.name": "deepfm", "model.embed_dim": 4, "model.mlp.depth": 1,
            "model.mlp.width": 16, "optimizer.name": "adam"}
  return arch_lib.split_config({**config, **overrides})[0]


def test_lanes_name_orders_and_round_trips():
  name = lane_optimizers.lanes_name(["ftrl", "sgd", "adam", "sgd"])
  assert name == "lanes:sgd|adam|ftrl"
  assert lane_optimizers.lane_names(name) == ("sgd", "adam", "ftrl")
  assert lane_optimizers.lanes_name(["adam", "adam"]) == "adam"
  assert lane_optimizers.lane_index(name, "ftrl") == 2
  with pytest.raises(ValueError, match="not one of"):
    lane_optimizers.lane_index(name, "adagrad")
  with pytest.raises(ValueError, match="lanes_name"):
    lane_optimizers.lanes_name(["adam", "lion"])


@pytest.mark.parametrize("own", row_optimizers.ROW_OPTIMIZER_NAMES)
def test_chosen_update_is_the_optimizers_own_on_its_columns(own):
  names = row_optimizers.ROW_OPTIMIZER_NAMES
  e, u = 3, 5
  key = jax.random.split(jax.random.key(0), 3)
  rows, grads = jax.random.normal(key[0], (u, e)), jax.random.normal(key[1], (u, e))
  plain = row_optimizers.make(own, 0.05, _EMB)
  mixed = lane_optimizers.make_lane_optimizer(lane_optimizers.lanes_name(names), 0.05, _EMB,
                               choice=jnp.int32(names.index(own)))
  width = mixed.slot_width(e)
  assert width == max(row_optimizers.make(n, 0.05, _EMB).slot_width(e) for n in names)
  own_width = plain.slot_width(e)
  slots = jnp.abs(jax.random.normal(key[2], (u, width))) + 0.1
  want_rows, want_slots = plain.update(rows, slots[:, :own_width], grads, jnp.int32(3))
  got_rows, got_slots = mixed.update(rows, slots, grads, jnp.int32(3))
  chex.assert_trees_all_close(got_rows, want_rows, rtol=1e-6)
  chex.assert_trees_all_close(got_slots[:, :own_width], want_slots, rtol=1e-6)
  np.testing.assert_array_equal(got_slots[:, own_width:], slots[:, own_width:])  # untouched


def test_merged_bucket_ignores_the_row_optimizer_only_when_asked():
  adam, sgd = _arch(**{"embedding.optimizer": "adam"}), _arch(**{"embedding.optimizer": "sgd"})
  assert buckets.bucket_key(adam) != buckets.bucket_key(sgd)
  assert buckets.bucket_key(adam, True) == buckets.bucket_key(sgd, True)
  rowwise = _arch(**{"embedding.optimizer": "rowwise_adagrad"})  # embed_dim stays in its key
  assert buckets.bucket_key(rowwise, True) != buckets.bucket_key(adam, True)
  sup = buckets.superset([sgd, adam, _arch(**{"embedding.optimizer": "ftrl",
                                              "model.embed_dim": 8})])
  assert sup.embedding_optimizer == "lanes:sgd|adam|ftrl" and sup.embed_dim == 8


HPARAMS = [
    {"embedding.learning_rate": 0.05, "optimizer.learning_rate": 1e-3},
    {"embedding.learning_rate": 0.01, "optimizer.learning_rate": 3e-3},
    {"embedding.learning_rate": 0.02, "optimizer.learning_rate": 2e-3,
     "optimizer.weight_decay": 1e-3},
    {"embedding.learning_rate": 0.2, "optimizer.learning_rate": 1e-3},
]


@pytest.mark.slow  # ~2 min on 2 cores: 10 compiled programs
def test_mixed_optimizer_cohort_equals_each_trial_alone_fresh_and_resumed(data):
  """sgd, adagrad, adam and ftrl rows (and two embed dims, widths) in one program."""
  archs = [_arch(**{"embedding.optimizer": "sgd"}),
           _arch(**{"embedding.optimizer": "adagrad", "model.embed_dim": 8}),
           _arch(**{"embedding.optimizer": "adam", "model.mlp.width": 8}),
           _arch(**{"embedding.optimizer": "ftrl", "model.mlp.depth": 2})]
  half = assert_cohort_equals_each_trial_alone(
      data, archs, HPARAMS, STEPS, merge_optimizers=True,
      num_programs=1)  # one program serves the four optimizers
  assert {r.chunk for r in half} == {half[0].chunk} and half[0].chunk.masked


def test_without_merging_each_optimizer_runs_its_own_program(data):
  archs = [_arch(**{"embedding.optimizer": "sgd"}), _arch(**{"embedding.optimizer": "adam"})]
  runner = cohort.CohortRunner(data.task, cohort_width=4, data=data)
  chunks = runner.plan(archs, [0, 0], [STEPS, STEPS], [False, False])
  assert len(chunks) == 2
  assert len(runner.plan(archs, [0, 0], [STEPS, STEPS], [False, False],
                         merge_optimizers=True)) == 1


def test_bad_lane_indices_are_named():
  with pytest.raises(ValueError, match="embedding.optimizer_lane"):
    cohort_call.stacked_hparams({lane_optimizers.LANE_KEY: np.asarray([0, -1])}, 2)


@pytest.mark.parametrize("widths", [[4.0, 0.0], [4.0, np.nan], [4.0]])
def test_bad_row_widths_are_named(widths):
  with pytest.raises(ValueError, match="embedding.row_width"):
    cohort_call.stacked_hparams({lane_optimizers.ROW_WIDTH_KEY: np.asarray(widths)}, 2)


def test_a_lane_row_width_reaches_rowwise_adagrad_only():
  # rowwise_adagrad's lane divides by the lane's own width; the element-wise lanes ignore it.
  e, u = 5, 4
  key = jax.random.split(jax.random.key(1), 2)
  rows, grads = jax.random.normal(key[0], (u, e)), jax.random.normal(key[1], (u, e))
  grads = grads.at[:, 3:].set(0.0)  # the lane's own rows are 3 wide
  name = lane_optimizers.lanes_name(["rowwise_adagrad", "adam"])
  slots = jnp.full((u, 2 * e), 0.1)
  for choice, own in enumerate(lane_optimizers.lane_names(name)):
    mixed = lane_optimizers.make_lane_optimizer(name, 0.05, _EMB, choice=jnp.int32(choice),
                                                row_width=jnp.float32(3))
    plain = (row_optimizers.rowwise_adagrad(0.05, _EMB.adagrad_initial_accumulator, row_width=3)
             if own == "rowwise_adagrad" else row_optimizers.make(own, 0.05, _EMB))
    width = plain.slot_width(e)
    want = plain.update(rows, slots[:, :width], grads, jnp.int32(2))
    got = mixed.update(rows, slots, grads, jnp.int32(2))
    chex.assert_trees_all_close((got[0], got[1][:, :width]), want, rtol=1e-6)
  single = lane_optimizers.make_lane_optimizer("rowwise_adagrad", 0.05, _EMB, row_width=3.0)
  chex.assert_trees_all_close(single.update(rows, slots[:, :1], grads, jnp.int32(2)),
                              row_optimizers.rowwise_adagrad(0.05, 0.1, row_width=3.0).update(
                                  rows, slots[:, :1], grads, jnp.int32(2)), rtol=1e-6)
