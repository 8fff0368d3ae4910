"""Shape buckets: trials whose architectures differ only in sizes share one padded program.

DESIGN.md §4 ("cohorts that fill"). Two architectures are in one *bucket* when they
differ only in the sizes listed in `_MASKED_HPARAMS`: the MLP tower's widths and
depth (`mlp_dims`) and the number of DCN-V2 cross layers (`cross_layers`), and,
where `padded_layout` can remap it, the latent dimension `embed_dim` (below). The
trials of a bucket run as one vmapped program of the bucket's *superset*
architecture (the largest width, the largest depth, the most cross layers, the
largest embed_dim of the chunk), each trial's parameters embedded in the superset's
shapes:

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
tolerance (summation order); `tests/cohorts/shape_buckets/buckets_test.py` checks it.

Each trial is initialised with its own exact shapes (`trial_program.init_trial_state`
from its seed, on the host) and then padded (`pad_state`), so its initial values
are those of its exact-shape run; results are cut back to the exact shapes
(`unpad_state`), so saved states and promotions never see the padding.

The latent dimension `embed_dim` is masked too for the models and element-wise row
optimizers of `padded_layout` (`padded_layout.embed_maskable`): the superset has
the largest; a trial's row columns, slot blocks and the dense axes that follow the
embedding layout (flattened field vectors, DLRM's z) are remapped by its rules, the
padded columns are zero and their gradients exactly zero.

The `composed` model (a block spec, `model.blocks`) is bucketed by `padded_blocks`
(its docstring has the rules): in either combination its interaction blocks (the
superset holds their union), its tower's sizes and inputs (and in parallel its
presence), its cross layers, `dense.linear`, `bias`, `first_order` and its per-group
embedding dims (and their group count, when F is given) are masked, whatever the row
optimizer (rowwise_adagrad takes each lane's own row width, `lane_optimizers.ROW_WIDTH_KEY`,
and averages over it). Parallel blocks a trial lacks have gate 0
(`ComposedModel.gates`), stacked ones zero tower rows, and columns past a trial's own
dims a column gate 0 (`ComposedModel.column_gates`): their outputs and gradients are
exactly 0. A trial's rows lie in the superset's first columns, its first-order column
on the superset's. `pad_state` and `unpad_state` take the trial's and the superset's
ArchSpec (`arch=`, `sup_arch=`) to move a trial's blocks to their superset indices,
set its gates and remap the dense axes that follow the columns.

Row optimizers (issue #26): `bucket_key(..., merge_optimizers=True)` (what a search
with `study.fill_cohorts` groups by) leaves the row optimizer out of the key; the
superset then names the set of its trials' row optimizers and each lane picks its own
by an index (`lane_optimizers`: slots are the union of the set's, a lane's own
columns placed as for one optimizer, the rest untouched), so a trial of a mixed
program still equals its own run.

What stays in the bucket key (a different value means a different bucket): the
model family, a named model's `embed_dim` for row-wise row optimizers (rowwise_adagrad's
mean over a row changes with padding; a `composed` model's row width is masked), the row
optimizer (unless merged, above) and the dense optimizer, the cross rank and
structure, attention and CIN sizes, a bottom MLP, an MLP of depth 0 (no hidden
layer to hold an identity), and of a composed spec: the combination, the bottom
MLP, the embedding group count without F, a tower without hidden layers, and the whole spec
when one block entry appears twice or the spec is gated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from sfjax.cohorts import lane_optimizers
from sfjax.cohorts.arch import ArchSpec
from sfjax.cohorts.shape_buckets import bucket_blocks as padded_blocks
from sfjax.cohorts.shape_buckets import bucket_layout as padded_layout

# Model keyword arguments a superset can hold, masked per trial.
_MASKED_HPARAMS = ("mlp_dims", "cross_layers")
# The trial config keys those come from (`arch.split_config`): what a cohort's trials
# may differ in while sharing a bucket. Every other static key is the bucket's.
# `model.embed_dim` only for `padded_layout.embed_maskable` models and row optimizers
# (`fixed_config_keys`).
_MASKED_CONFIG_KEYS = ("model.mlp.depth", "model.mlp.width", "model.cross_layers",
                       "model.embed_dim")
_EMBED_KEY = "model.embed_dim"
# The `composed` model's block spec JSON: its sizes and blocks are masked by `padded_blocks`.
_BLOCKS_HPARAM = "blocks"
_MASKED = "masked"


def bucket_key(arch: ArchSpec, merge_optimizers: bool = False,
               num_dense: int | None = None, num_fields: int | None = None) -> ArchSpec:
  """`arch` with its maskable sizes replaced by a placeholder: equal keys share a program.

  An MLP of depth 0 keeps its `()` (it cannot be padded), so it has its own bucket;
  `embed_dim` is masked only where `padded_layout.embed_maskable`; a `composed`
  model's block spec becomes `padded_blocks.bucket_blocks` of it. With
  `merge_optimizers` (a search's `study.fill_cohorts`) the row optimizer is masked
  too: the bucket's program picks each lane's (`lane_optimizers`); a key with it
  is coarser than one without (equal plain keys give equal merged keys). `num_dense`:
  the data's dense feature count, when known (0 drops a composed spec's bottom MLP and
  "dense"/"bottom" tower inputs from its key, `padded_blocks.bucket_blocks`);
  `num_fields`: the data's field count F, when known (a composed spec's field-group
  count then leaves its key).
  """
  hparams = tuple((k, _MASKED if k in _MASKED_HPARAMS and v != () else
                   padded_blocks.bucket_blocks(v, num_dense, num_fields)
                   if k == _BLOCKS_HPARAM else v)
                  for k, v in arch.model_hparams)
  # A composed model's row width follows its spec, whose key (above) holds what fixes it.
  embed_dim = (_MASKED if padded_layout.embed_maskable(arch.model_name, arch.embedding_optimizer)
               or _BLOCKS_HPARAM in dict(arch.model_hparams) else arch.embed_dim)
  # A key's embed_dim may be the "masked" placeholder: keys are only hashed, compared and named.
  optimizer = _MASKED if merge_optimizers else arch.embedding_optimizer
  return dataclasses.replace(arch, model_hparams=hparams, embedding_optimizer=optimizer,
                             embed_dim=embed_dim)  # type: ignore[arg-type]  # see above


def fixed_config_keys(config: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
  """The keys of `keys` to fix to `config`'s values so that new configs share its bucket.

  Architecture-aware asking (`search_round.ask_round`): the static keys of the space
  (`keys`) less the masked ones; `model.embed_dim` stays fixed unless `config`
  names a model and a row optimizer that mask it (`padded_layout.embed_maskable`;
  one it does not name, e.g. a key outside the space, could be anything).
  """
  name, optimizer = config.get("model.name"), config.get("embedding.optimizer")
  free_embed = (name is not None and optimizer is not None
                and padded_layout.embed_maskable(name, optimizer))
  return tuple(k for k in keys if k not in _MASKED_CONFIG_KEYS or (k == _EMBED_KEY and not free_embed))


def superset(archs: Sequence[ArchSpec], num_dense: int | None = None,
             num_fields: int | None = None) -> ArchSpec:
  """The smallest architecture of the bucket of `archs` that holds each of them.

  The bucket is the merged one (`bucket_key(..., merge_optimizers=True)`): trials of
  several row optimizers give a superset whose `embedding_optimizer` serves them all,
  one per lane (`lane_optimizers.lanes_name`); `num_dense`, `num_fields` as `bucket_key`'s.

  Raises:
    ValueError: `archs` is empty or spans several buckets.
  """
  if not archs:
    raise ValueError("superset: no architectures")
  keys = {bucket_key(a, merge_optimizers=True, num_dense=num_dense, num_fields=num_fields)
          for a in archs}
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
  embed_dim = max(a.embed_dim for a in archs)
  if _BLOCKS_HPARAM in hparams:
    hparams[_BLOCKS_HPARAM] = padded_blocks.superset_blocks([h[_BLOCKS_HPARAM] for h in all_hparams],
                                                           num_dense, num_fields)
    embed_dim = padded_blocks.spec_width(hparams[_BLOCKS_HPARAM])
  return dataclasses.replace(archs[0], model_hparams=tuple(sorted(hparams.items())),
                             embed_dim=embed_dim,
                             embedding_optimizer=lane_optimizers.lanes_name(
                                 [a.embedding_optimizer for a in archs]))


def _by_path(tree) -> dict[str, Any]:
  return {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _shapes(tree) -> dict[str, tuple[int, ...]]:
  return {k: tuple(v.shape) if hasattr(v, "shape") else np.shape(v) for k, v in _by_path(tree).items()}


def _is_hidden_kernel(path: str, shape: tuple[int, ...]) -> bool:
  """A kernel of an MLP's hidden layer (`...['hidden'][i]['kernel']...`), square."""
  return "['hidden']" in path and "['kernel']" in path and len(shape) == 2 and shape[0] == shape[1]


class _Layout:
  """Where a trial state's leaves lie in its superset's: the embed-dim layout of
  `padded_layout` (None: same embed_dim, every leaf in the corner), or for a `composed`
  superset the column layout of `padded_blocks`."""

  def __init__(self, exact_state, sup_state, arch: ArchSpec | None = None,
               sup_arch: ArchSpec | None = None):
    """Infers the layout from the two states' shapes (leaves or ShapeDtypeStructs).

    With a `composed` superset and both ArchSpecs: a trial row's field columns lie in
    the superset's first columns and its first-order column on the superset's; dense
    axes follow `padded_blocks.ColumnLayout` when the superset gates columns, else
    every param takes the corner.
    """
    self.sup_params = _shapes(sup_state.params)
    width, sup_width = exact_state.table.values.shape[1], sup_state.table.values.shape[1]
    if width > sup_width:
      raise ValueError(f"pad_state: rows of width {width} do not fit the superset's {sup_width}")
    self.layout: padded_layout.EmbedLayout | None = None
    self.columns_of: padded_blocks.ColumnLayout | None = None
    if sup_arch is not None and arch is not None and _is_composed(sup_arch):
      text, sup_text = (dict(a.model_hparams)[_BLOCKS_HPARAM] for a in (arch, sup_arch))
      gates = next((v for k, v in self.sup_params.items() if k.startswith("['column_gates']")), None)
      rows = None if width == sup_width else padded_layout.EmbedLayout(False, 0, 0, width, sup_width)
      if gates is not None:
        self.columns_of = padded_blocks.ColumnLayout(text, sup_text, gates[0], self.sup_params)
        dim, sup_dim = self.columns_of.vector_dims
        rows = padded_layout.EmbedLayout(self.columns_of.first_order, 0, 0, dim, sup_dim)
    else:
      self.layout = rows = padded_layout.infer_layout(_shapes(exact_state.params),
                                                      self.sup_params, width, sup_width)
    self.slot_index, self.slot_fill = padded_layout.slot_layout(
        rows, width, exact_state.table.opt_slots.shape[1], sup_width,
        sup_state.table.opt_slots.shape[1],
        row_wise=arch is not None and arch.embedding_optimizer == "rowwise_adagrad")
    self.columns = (np.arange(width) if rows is None else rows.table_columns())

  def index(self, path: str, shape, sup_shape):
    """`np.ix_` index of a trial leaf at `path` (state-relative) in its superset leaf."""
    if path in (".values", ".opt_slots"):  # table leaves: rows kept, columns remapped
      if shape[0] != sup_shape[0]:
        raise ValueError(f"pad_state: the table has {shape[0]} rows, the superset's {sup_shape[0]}")
      return np.ix_(np.arange(shape[0]), self.columns if path == ".values" else self.slot_index)
    if self.columns_of is not None:
      return np.ix_(*self.columns_of.leaf_index(path, shape, sup_shape))
    return np.ix_(*padded_layout.leaf_index(self.layout, path, shape, sup_shape, self.sup_params))


def _is_composed(arch: ArchSpec | None) -> bool:
  return arch is not None and _BLOCKS_HPARAM in dict(arch.model_hparams)


def _block_map(arch: ArchSpec | None, sup_arch: ArchSpec | None, sup_params, where: str):
  """(rename: trial path -> superset path, fills: {gates path: the trial's gate row}) of a
  composed trial's blocks in its superset's (`padded_blocks`); identity and none else.

  Raises:
    ValueError: the superset gates its blocks but `arch` or `sup_arch` is missing.
  """
  gates = [k for k in sup_params if k.startswith(("['gates']", "['column_gates']"))]
  text = dict(arch.model_hparams).get(_BLOCKS_HPARAM) if arch is not None else None
  sup_text = dict(sup_arch.model_hparams).get(_BLOCKS_HPARAM) if sup_arch is not None else None
  if text is None or sup_text is None:
    if gates:
      raise ValueError(f"{where}: the superset gates its blocks (a composed bucket): pass "
                       "arch= and sup_arch=, the trial's and the superset's ArchSpec")
    return (lambda key: key), {}
  index = padded_blocks.block_index(text, sup_text)
  fills = {}
  for key in gates:
    row = (padded_blocks.gate_row(text, sup_text) if key.startswith("['gates']") else
           padded_blocks.column_gate_row(text, sup_text, sup_params[key][0]))
    if row is not None:
      fills[key] = row
  return (lambda key: padded_blocks.rename_path(key, index)), fills


def _pad_tree(exact, template, layout: _Layout, missing_params: bool, fills=None,
              rename=lambda key: key):
  """`exact`'s leaves placed in zero arrays shaped like `template`'s (`layout.index`);
  leaves `exact` lacks are zeros, or identities for hidden kernels when
  `missing_params`; `fills` (path -> row) fills a leaf's padded columns; `rename`
  maps a trial path to its superset path (composed blocks).
  Returns (padded tree, 0/1 mask tree: 1 on exact entries)."""
  have = {rename(k): v for k, v in _by_path(exact).items()}
  flat, treedef = jax.tree_util.tree_flatten_with_path(template)
  padded, masks = [], []
  for path, spec in flat:
    key = jax.tree_util.keystr(path)
    shape, dtype = tuple(spec.shape), np.dtype(spec.dtype)
    out, mask = np.zeros(shape, dtype), np.zeros(shape, np.float32)
    if fills and key in fills:
      out[...] = fills[key]
    if key in have:
      leaf = np.asarray(have[key])
      if leaf.ndim != len(shape) or any(a > b for a, b in zip(leaf.shape, shape, strict=True)):
        raise ValueError(f"pad_state: leaf {key} of shape {leaf.shape} does not fit the "
                         f"superset's {shape}")
      index = layout.index(key, leaf.shape, shape)
      out[index], mask[index] = leaf, 1.0
    elif missing_params and _is_hidden_kernel(key, shape):
      out = np.eye(shape[0], dtype=dtype)
    padded.append(out)
    masks.append(mask)
  return jax.tree.unflatten(treedef, padded), jax.tree.unflatten(treedef, masks)


def pad_state(exact_state, template, *, arch: ArchSpec | None = None,
              sup_arch: ArchSpec | None = None) -> tuple[Any, Any]:
  """One trial's host TrainState embedded in its bucket superset's shapes.

  Args:
    exact_state: the trial's TrainState (numpy or jax leaves) with its own shapes.
    template: the superset's abstract TrainState (`trial_states.state_template`).
    arch, sup_arch: the trial's and the superset's ArchSpec; needed for `composed`
      trials whose blocks differ (their blocks move to the superset's indices and
      the superset's gates are set, `padded_blocks`), ignored by other models.

  Returns:
    (padded host TrainState, dense mask: a 0/1 float32 pytree like the params).

  Raises:
    ValueError: naming a leaf that is larger than the superset's, or when the row
      widths differ for a model or row optimizer `padded_layout` cannot remap, or a
      gated superset without `arch` and `sup_arch`.
  """
  layout = _Layout(exact_state, template, arch, sup_arch)
  rename, gate_fills = _block_map(arch, sup_arch, layout.sup_params, "pad_state")
  params, mask = _pad_tree(exact_state.params, template.params, layout, missing_params=True,
                           fills=gate_fills, rename=rename)
  opt_state, _ = _pad_tree(exact_state.opt_state, template.opt_state, layout, missing_params=False,
                           rename=rename)
  table, _ = _pad_tree(exact_state.table, template.table, layout, missing_params=False,
                       fills={".opt_slots": layout.slot_fill})
  return exact_state._replace(step=np.asarray(exact_state.step), params=params,
                              opt_state=opt_state, table=table), mask


def unpad_state(padded_state, template, *, arch: ArchSpec | None = None,
                sup_arch: ArchSpec | None = None):
  """Inverse of `pad_state`: the trial's own entries, in the shapes of `template` (its
  exact-shape abstract TrainState); identity layers, padding and gates are dropped.
  `arch`, `sup_arch`: as `pad_state`'s."""
  layout = _Layout(template, padded_state, arch, sup_arch)
  rename, _ = _block_map(arch, sup_arch, layout.sup_params, "unpad_state")
  out = []
  for part in ("params", "opt_state", "table"):
    have = _by_path(getattr(padded_state, part))
    flat, treedef = jax.tree_util.tree_flatten_with_path(getattr(template, part))
    leaves = []
    for path, spec in flat:
      key = rename(jax.tree_util.keystr(path))
      leaf = np.asarray(have[key])
      leaves.append(leaf[layout.index(key, tuple(spec.shape), leaf.shape)].copy())
    out.append(jax.tree.unflatten(treedef, leaves))
  return template._replace(step=np.asarray(padded_state.step).copy(), params=out[0],
                           opt_state=out[1], table=out[2])
