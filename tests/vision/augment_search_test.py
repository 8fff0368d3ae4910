"""PBA search: exploit copies along the trial axis, a tiny run gives a schedule."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from sfjax.vision import augment, augment_search, cnn, image_data


def test_exploit_indices_by_hand():
  idx = augment_search.exploit_indices([0.5, 0.9, 0.1, 0.7, 0.3, 0.8, 0.2, 0.6], 0.25)
  # best: 1 (0.9), 5 (0.8); worst: 2 (0.1), 6 (0.2) -> 2 copies 1, 6 copies 5.
  np.testing.assert_array_equal(idx, [0, 1, 1, 3, 4, 5, 5, 7])
  np.testing.assert_array_equal(augment_search.exploit_indices([1.0, 0.0], 0.25), [0, 1])


def test_gather_members_copies_every_leaf():
  tree = {"w": jnp.arange(4.0)[:, None] * jnp.ones((4, 3)), "s": (jnp.arange(4),)}
  out = augment_search.gather_members(tree, np.array([0, 0, 3, 3]))
  np.testing.assert_array_equal(out["s"][0], [0, 0, 3, 3])
  np.testing.assert_array_equal(out["w"][:, 0], [0, 0, 3, 3])


def test_tiny_pba_run():
  splits = image_data.load_splits("digits", max_train=200)
  result = augment_search.pba_search(lambda k: cnn.init_cnn(k, (4, 8, 8)), cnn.apply_cnn, splits,
                                     population=2, intervals=2, interval_steps=2, batch_size=8,
                                     learning_rate=1e-2, weight_decay=1e-4, seed=0, fraction=0.5)
  chex.assert_shape(result.schedule, (2, len(augment.AUG_OPS), 2))
  chex.assert_shape(result.valid_accuracy, (2, 2))
  # interval 0's policy is one of the initial policies (levels <= 3); exploit + explore follow
  assert result.schedule[0].max() <= 3
  assert result.best_valid_accuracy == result.valid_accuracy[-1].max()
