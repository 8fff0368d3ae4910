"""Saved trial states: what a promoted trial resumes from (`workdir/states/<trial_id>.npz`).

A state is the host (numpy) `TrainState` a `CohortRunner` returns. The file holds
its leaves in flatten order (`leaf_00000`, ...) and nothing else: the tree
structure comes back from the architecture (`state_template`, an abstract
evaluation of the trial's init), so loading needs no pickle, and a file whose
leaves do not match the architecture's shapes is rejected with its path and the
leaf named.

Writes are atomic (`sfjax.core.atomic.atomic_write`: temporary file, fsync, `os.replace`, directory fsync): a process killed while
saving leaves either the old file or none, never a torn one.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

import jax
import numpy as np

from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import program as trial_program
from sfjax.cohorts.arch import ArchSpec
from sfjax.core.atomic import atomic_write
from sfjax.data.types import DatasetSpec


class StateFileError(ValueError):
  """A saved state that cannot be read or does not fit the architecture; names the file."""


def state_path(directory: str, trial_id: int) -> str:
  """`directory/<trial_id>.npz`."""
  return os.path.join(directory, f"{int(trial_id)}.npz")


def state_template(arch: ArchSpec, spec: DatasetSpec, num_rows: int | None = None,
                   table_starts: tuple[int, ...] | None = None) -> Any:
  """The abstract `TrainState` of `arch` on `spec` (`jax.ShapeDtypeStruct` leaves), with a
  table of `num_rows` rows (default `spec.total_rows`; `TrialData.num_rows`, and
  `TrialData.table_starts` for a compact one)."""
  hparams = arch_lib.resolve_hparams({})
  return jax.eval_shape(lambda: trial_program.init_trial_state(
      arch, spec, hparams, jax.random.key(0), num_rows, table_starts))


def save_state(path: str, state: Any) -> None:
  """Writes the leaves of host pytree `state` to `path` atomically."""
  arrays: dict[str, Any] = {f"leaf_{i:05d}": np.asarray(leaf)
                            for i, leaf in enumerate(jax.tree.leaves(state))}
  atomic_write(path, lambda f: np.savez(f, **arrays))


def load_state(path: str, template: Any) -> Any:
  """Reads a state saved by `save_state` into the structure of `template`.

  Args:
    path: the .npz file.
    template: a pytree with the expected structure, shapes and dtypes
      (`state_template`).

  Returns:
    The host pytree (numpy leaves).

  Raises:
    FileNotFoundError: no file at `path`.
    StateFileError: unreadable file, or leaves that do not match `template`
      (the message names the file and the leaf path).
  """
  with_paths, treedef = jax.tree_util.tree_flatten_with_path(template)
  try:
    with np.load(path, allow_pickle=False) as npz:
      leaves = [npz[name] for name in sorted(npz.files)]
  except FileNotFoundError:
    raise
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise StateFileError(f"{path}: unreadable saved state: {e}") from None
  if len(leaves) != len(with_paths):
    raise StateFileError(f"{path}: holds {len(leaves)} arrays, the architecture's state has "
                         f"{len(with_paths)} leaves")
  for (key_path, expected), leaf in zip(with_paths, leaves, strict=True):
    if leaf.shape != expected.shape or leaf.dtype != expected.dtype:
      raise StateFileError(f"{path}: leaf {jax.tree_util.keystr(key_path)} is "
                           f"{leaf.dtype}{list(leaf.shape)}, the architecture expects "
                           f"{expected.dtype}{list(expected.shape)}")
  return jax.tree.unflatten(treedef, leaves)
