"""Shape buckets: trials whose architectures differ only in sizes share one padded program.

DESIGN.md §4 ("cohorts that fill"). Two architectures are in one *bucket* when they
differ only in the sizes listed in `MASKED_HPARAMS`: the MLP tower's widths and
depth (`mlp_dims`) and the number of DCN-V2 cross layers (`cross_layers`). The
trials of a bucket run as one vmapped program of the bucket's *superset*
architecture (the largest width, the largest depth, the most cross layers of the
chunk), each trial's parameters embedded in the superset's shapes:

  * a hidden unit a trial does not have: zero incoming weights and bias, zero
    outgoing weights (ReLU(0) = 0, so it adds nothing to any sum);
  * a hidden layer past the trial's depth: an identity kernel and zero bias (its
    input is a ReLU output, >= 0, so ReLU(I x) = x exactly);
  * a cross layer past the trial's count: zero weights (`x0 * (0 x + 0) + x = x`).

A 0/1 *dense mask* (1 on the trial's own entries) multiplies the gradients and the
updates of the dense parameters (`step.make_train_step(dense_mask=...)`), so the
padding never moves, whatever the optimizer (AdamW's decay included), and every
real entry takes exactly the step it takes in the trial's own exact-shape program.
Results therefore equal running each trial alone with its own shapes, to float
tolerance (summation order); `tests/ctr_search/padded_test.py` checks it.

Each trial is initialised with its own exact shapes (`trial_program.init_trial_state`
from its seed, on the host) and then padded (`pad_state`), so its initial values
are those of its exact-shape run; results are cut back to the exact shapes
(`unpad_state`), so saved states and promotions never see the padding.

What stays in the bucket key (a different value means a different bucket): the
model family, the row width (`embed_dim`: flattened field layouts and row-wise
optimizers read it), the row and dense optimizers, the cross rank and structure,
attention and CIN sizes, a bottom MLP, a composed model's block spec, and an MLP of
depth 0 (no hidden layer to hold an identity).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from sfjax.ctr_search.arch import ArchSpec

# Model keyword arguments a superset can hold, masked per trial.
MASKED_HPARAMS = ("mlp_dims", "cross_layers")
# The trial config keys those come from (`arch.split_config`): what a cohort's trials
# may differ in while sharing a bucket. Every other static key is the bucket's.
MASKED_CONFIG_KEYS = ("model.mlp.depth", "model.mlp.width", "model.cross_layers")
_MASKED = "masked"


def bucket_key(arch: ArchSpec) -> ArchSpec:
  """`arch` with its maskable sizes replaced by a placeholder: equal keys share a program.

  An MLP of depth 0 keeps its `()` (it cannot be padded), so it has its own bucket.
  """
  hparams = tuple((k, _MASKED if k in MASKED_HPARAMS and v != () else v)
                  for k, v in arch.model_hparams)
  return dataclasses.replace(arch, model_hparams=hparams)


def superset(archs: Sequence[ArchSpec]) -> ArchSpec:
  """The smallest architecture of the bucket of `archs` that holds each of them.

  Raises:
    ValueError: `archs` is empty or spans several buckets.
  """
  if not archs:
    raise ValueError("superset: no architectures")
  keys = {bucket_key(a) for a in archs}
  if len(keys) != 1:
    raise ValueError(f"superset: architectures of {len(keys)} buckets: "
                     f"{sorted(a.describe() for a in set(archs))}")
  hparams = dict(archs[0].model_hparams)
  all_hparams = [dict(a.model_hparams) for a in archs]
  if hparams.get("mlp_dims"):
    dims = [h["mlp_dims"] for h in all_hparams]
    hparams["mlp_dims"] = (max(max(d) for d in dims),) * max(len(d) for d in dims)
  if "cross_layers" in hparams:
    hparams["cross_layers"] = max(h["cross_layers"] for h in all_hparams)
  return dataclasses.replace(archs[0], model_hparams=tuple(sorted(hparams.items())))


def _by_path(tree) -> dict[str, Any]:
  return {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _is_hidden_kernel(path: str, shape: tuple[int, ...]) -> bool:
  """A kernel of an MLP's hidden layer (`...['hidden'][i]['kernel']...`), square."""
  return "['hidden']" in path and "['kernel']" in path and len(shape) == 2 and shape[0] == shape[1]


def _pad_tree(exact, template, missing_params: bool):
  """`exact`'s leaves in the corner of zero arrays shaped like `template`'s; leaves
  `exact` lacks are zeros, or identities for hidden kernels when `missing_params`.
  Returns (padded tree, 0/1 mask tree: 1 on exact entries)."""
  have = _by_path(exact)
  flat, treedef = jax.tree_util.tree_flatten_with_path(template)
  padded, masks = [], []
  for path, spec in flat:
    key = jax.tree_util.keystr(path)
    shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
    out, mask = np.zeros(shape, dtype), np.zeros(shape, np.float32)
    if key in have:
      leaf = np.asarray(have[key])
      if leaf.ndim != len(shape) or any(a > b for a, b in zip(leaf.shape, shape)):
        raise ValueError(f"pad_state: leaf {key} of shape {leaf.shape} does not fit the "
                         f"superset's {shape}")
      corner = tuple(slice(0, n) for n in leaf.shape)
      out[corner], mask[corner] = leaf, 1.0
    elif missing_params and _is_hidden_kernel(key, shape):
      out = np.eye(shape[0], dtype=dtype)
    padded.append(out)
    masks.append(mask)
  return jax.tree.unflatten(treedef, padded), jax.tree.unflatten(treedef, masks)


def pad_state(exact_state, template) -> tuple[Any, Any]:
  """One trial's host TrainState embedded in its bucket superset's shapes.

  Args:
    exact_state: the trial's TrainState (numpy or jax leaves) with its own shapes.
    template: the superset's abstract TrainState (`trial_states.state_template`).

  Returns:
    (padded host TrainState, dense mask: a 0/1 float32 pytree like the params).

  Raises:
    ValueError: naming a leaf that is larger than the superset's.
  """
  params, mask = _pad_tree(exact_state.params, template.params, missing_params=True)
  opt_state, _ = _pad_tree(exact_state.opt_state, template.opt_state, missing_params=False)
  table = jax.tree.map(np.asarray, exact_state.table)
  if jax.tree.map(np.shape, table) != jax.tree.map(lambda s: tuple(s.shape), template.table):
    raise ValueError("pad_state: the table's shape differs from the superset's (the row "
                     "width is part of the bucket)")
  return exact_state._replace(step=np.asarray(exact_state.step), params=params,
                              opt_state=opt_state, table=table), mask


def unpad_state(padded_state, template):
  """Inverse of `pad_state`: the trial's own entries, in the shapes of `template` (its
  exact-shape abstract TrainState); identity layers and padding are dropped."""
  have = _by_path(padded_state)
  flat, treedef = jax.tree_util.tree_flatten_with_path(template)
  leaves = []
  for path, spec in flat:
    leaf = np.asarray(have[jax.tree_util.keystr(path)])
    leaves.append(leaf[tuple(slice(0, n) for n in spec.shape)].copy())
  return jax.tree.unflatten(treedef, leaves)
