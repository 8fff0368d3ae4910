"""Saved trial states: exact round trip, mismatches named by file and leaf, atomic writes."""

import os

import chex
import jax
import numpy as np
import pytest

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import program as trial_program
from sfjax.cohorts import trial_states
from sfjax.data import types

SPEC = types.DatasetSpec(tuple(types.FieldSpec(f"c{i}", n) for i, n in enumerate([7, 11, 5])), 2)
ARCH, HPARAMS = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 4})


@pytest.fixture(scope="module")
def state():
  """A host (numpy) trial state, as a CohortRunner returns it."""
  return jax.device_get(trial_program.init_trial_state(ARCH, SPEC, HPARAMS, jax.random.key(3)))


def test_round_trip_is_exact(tmp_path, state):
  path = trial_states.state_path(str(tmp_path), 7)
  assert path == os.path.join(str(tmp_path), "7.npz")
  trial_states.save_state(path, state)
  assert os.listdir(tmp_path) == ["7.npz"]  # atomic: no temporary file left behind
  loaded = trial_states.load_state(path, trial_states.state_template(ARCH, SPEC))
  assert jax.tree.structure(loaded) == jax.tree.structure(state)
  chex.assert_trees_all_equal(loaded, state)
  chex.assert_trees_all_equal_dtypes(loaded, state)
  assert loaded.table.values.shape == (SPEC.total_rows, ARCH.embedding_width)


def test_overwrite_replaces_the_file(tmp_path, state):
  path = trial_states.state_path(str(tmp_path), 1)
  trial_states.save_state(path, state)
  later = state._replace(step=np.int32(5))
  trial_states.save_state(path, later)
  assert os.listdir(tmp_path) == ["1.npz"]
  loaded = trial_states.load_state(path, trial_states.state_template(ARCH, SPEC))
  assert int(loaded.step) == 5


def test_wrong_leaf_shape_names_file_and_leaf(tmp_path, state):
  path = trial_states.state_path(str(tmp_path), 2)
  trial_states.save_state(path, state)
  bigger = types.DatasetSpec(SPEC.fields + (types.FieldSpec("c3", 4),), 2)  # 4 more table rows
  with pytest.raises(trial_states.StateFileError,
                     match=r"2\.npz: leaf \.table\.values is float32\[23, 5\], the architecture "
                           r"expects float32\[27, 5\]"):
    trial_states.load_state(path, trial_states.state_template(ARCH, bigger))


def test_wrong_leaf_dtype_names_the_leaf(tmp_path, state):
  path = trial_states.state_path(str(tmp_path), 2)
  trial_states.save_state(path, state._replace(step=np.float32(0)))
  with pytest.raises(trial_states.StateFileError, match=r"leaf \.step is float32\[\]"):
    trial_states.load_state(path, trial_states.state_template(ARCH, SPEC))


def test_wrong_leaf_count_is_named(tmp_path, state):
  path = trial_states.state_path(str(tmp_path), 3)
  trial_states.save_state(path, (state, np.zeros(2)))
  n = len(jax.tree.leaves(state))
  with pytest.raises(trial_states.StateFileError,
                     match=rf"3\.npz: holds {n + 1} arrays, the architecture's state has {n} "):
    trial_states.load_state(path, trial_states.state_template(ARCH, SPEC))


def test_corrupt_file_is_named(tmp_path):
  path = trial_states.state_path(str(tmp_path), 4)
  with open(path, "wb") as f:
    f.write(b"torn")
  with pytest.raises(trial_states.StateFileError, match=r"4\.npz: unreadable saved state"):
    trial_states.load_state(path, trial_states.state_template(ARCH, SPEC))


def test_missing_file_raises_file_not_found(tmp_path):
  with pytest.raises(FileNotFoundError):
    trial_states.load_state(trial_states.state_path(str(tmp_path), 5),
                            trial_states.state_template(ARCH, SPEC))


def test_template_matches_the_trial_init(state):
  template = trial_states.state_template(ARCH, SPEC)
  assert jax.tree.structure(template) == jax.tree.structure(state)
  chex.assert_trees_all_equal_shapes_and_dtypes(template, state)
