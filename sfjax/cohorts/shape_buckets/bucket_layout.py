"""Embedding-layout remaps: a trial of latent dim d inside a shape bucket's superset of dim D.

DESIGN.md §4 ("cohorts that fill"), the `model.embed_dim` part of `padded`. A trial
whose model reads rows of width e = d + fo (fo = 1 for a first-order column, the
last one: fm, deepfm, wide_deep, xdeepfm) runs in a superset of width E = D + fo:

  * table rows: columns [0, d) -> [0, d), the first-order column d -> D, the other
    columns zero (`table_columns`). Every model reads a zero column as nothing:
    FM and dot products of zero columns are zero, CIN and attention work column
    by column, and the dense weights that read those positions are zero and frozen
    (below), so the gradient of a padded column is exactly zero.
  * row-optimizer slots: one block per E columns (adagrad 1, adam m|v and ftrl z|n
    2, sgd 0), each block mapped like the values. A padded slot column holds a value
    that keeps it still under a zero gradient: adagrad's accumulator the trainer's
    initial accumulator (> 0: 0 would give 0/0), adam's and ftrl's blocks 0. Only
    element-wise row optimizers qualify (`_EMBED_MASKABLE_ROW_OPTIMIZERS`):
    rowwise_adagrad's mean over a row's columns changes with the padding.
  * dense parameters whose axes follow the embedding layout take an index remap,
    not end-padding (`_axis_segments`, keyed by parameter path patterns). An axis is
    a sequence of segments:
      FLAT  the flattened fields and dense features `[F*d + Nd]`: field f's column j
            at f*d + j -> f*D + j, dense feature k at F*d + k -> F*D + k;
      VEC   one field vector `[d]` -> its first d of D positions;
      REST  what follows (e.g. MLP units), in order, after the superset's segments.
    Rules, per model:
      deepfm, wide_deep, xdeepfm, autoint, dcnv2: the MLP's first kernel (hidden[0],
        or `out` for an MLP of depth 0) reads FLAT on axis 0 (dcnv2: x or x0, both
        FLAT);
      dcnv2: cross kernels FLAT x FLAT, cross biases FLAT, low-rank `down` FLAT on
        axis 0 and `up` on axis 1; the parallel head reads (FLAT, REST) = (cross
        output, MLP units), or (FLAT, FLAT) when its MLP has no hidden layer (x0);
      dlrm: the top MLP's first kernel reads (VEC, REST) = (z, dot products) when
        there is a bottom MLP (dots of zero columns add nothing); the bottom MLP's
        last layer (width d) is end-padded, which is VEC;
      autoint: the first interacting layer's projections read a field vector on axis
        0: end-padding is VEC already; attention heads do not see d;
      xdeepfm: CIN kernels are over fields and sum over the columns: no remap;
      fm, lr: no dense parameter sees d (lr's rows are always width 1).
    Any other axis is end-padded (the corner), as `padded` does for sizes.

The sizes (fo, F, Nd, d, D) come from the shapes of the trial's and the superset's
states (`infer_layout`), so `padded.pad_state` needs nothing but the two.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from sfjax.cohorts.lane_optimizers import lane_names
from sfjax.train import defaults as ctr_defaults_lib

# Models whose `model.embed_dim` a superset can hold (their rules are above); `composed`
# is not among them (its blocks give each field group its own width).
_EMBED_MASKABLE_MODELS = ("lr", "fm", "deepfm", "wide_deep", "dcnv2", "xdeepfm", "autoint", "dlrm")
# Element-wise row optimizers: a padded column never changes a real one's update.
_EMBED_MASKABLE_ROW_OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")
FLAT, VEC, REST = "flat", "vec", "rest"
_ADAGRAD_FILL = float(ctr_defaults_lib.ctr_defaults().embedding.adagrad_initial_accumulator)


def rows_paddable(embedding_optimizer: str) -> bool:
  """Whether rows of this row optimizer (of each of a program's set, `lane_optimizers.lanes_name`)
  may take zero padded columns: an element-wise one leaves a column of zero gradient still."""
  return all(name in _EMBED_MASKABLE_ROW_OPTIMIZERS for name in lane_names(embedding_optimizer))


def embed_maskable(model_name: str, embedding_optimizer: str) -> bool:
  """Whether trials of this model and row optimizer may differ in `embed_dim` in one bucket
  (a program's set of row optimizers, `lane_optimizers.lanes_name`: when each may)."""
  return model_name in _EMBED_MASKABLE_MODELS and rows_paddable(embedding_optimizer)


class EmbedLayout(NamedTuple):
  """Sizes of one trial's embedding layout inside its superset's.

  Attributes:
    first_order: whether rows end with a first-order column (e = d + 1).
    num_fields: F (0 where no rule needs it).
    num_dense: Nd (0 where no rule needs it).
    dim: the trial's d.
    sup_dim: the superset's D (>= d).
  """

  first_order: bool
  num_fields: int
  num_dense: int
  dim: int
  sup_dim: int

  def table_columns(self) -> np.ndarray:
    """[e] int: where each of the trial's row columns lies in the superset's row."""
    cols = np.arange(self.dim)
    return np.append(cols, self.sup_dim) if self.first_order else cols

  def segment_size(self, kind: str, sup: bool) -> int:
    """Length of a FLAT or VEC segment in the trial's (`sup=False`) or superset's layout."""
    d = self.sup_dim if sup else self.dim
    if kind == FLAT:
      return self.num_fields * d + self.num_dense
    if kind == VEC:
      return d
    raise ValueError(f"padded_layout: segment {kind!r} has no fixed size")

  def segment_index(self, kind: str) -> np.ndarray:
    """[trial's segment length] int: positions in the superset's segment."""
    if kind == VEC:
      return np.arange(self.dim)
    f, j = np.divmod(np.arange(self.num_fields * self.dim), self.dim)
    dense = self.num_fields * self.sup_dim + np.arange(self.num_dense)
    return np.concatenate([f * self.sup_dim + j, dense])


def _module_names(paths) -> set[str]:
  """The top-level parameter modules named in `paths` (`['mlp']...` -> 'mlp').

  A model behind a feature layout (`models.pooling.PooledInput`) holds them under
  `['inner']`: its modules are the inner model's.
  """
  return {m.group(1) for p in paths if (m := re.match(r"(?:\['inner'\])?\['([^']+)'\]", p))}


def _has(paths, fragment: str) -> bool:
  return any(fragment in p for p in paths)


def _axis_segments(path: str, param_paths) -> dict[int, tuple[str, ...]]:
  """The layout rules: which axes of the parameter at `path` follow the embedding layout.

  Args:
    path: a parameter's path relative to the params tree (e.g.
      "['mlp']['hidden'][0]['kernel'].value"); an optimizer-state path that ends
      with one matches too.
    param_paths: every parameter path of the (superset's) params tree: the rules
      of an MLP's `out` kernel and of dcnv2's head depend on whether the MLP has
      hidden layers, dlrm's top MLP on whether there is a bottom MLP.

  Returns:
    axis -> segments; axes not named are end-padded.
  """
  mlp_hidden = _has(param_paths, "['mlp']['hidden']")
  if re.search(r"\['mlp'\]\['hidden'\]\[0\]\['kernel'\]", path):
    return {0: (FLAT,)}
  if re.search(r"\['mlp'\]\['out'\]\['kernel'\]", path) and not mlp_hidden:
    return {0: (FLAT,)}
  if _has(param_paths, "['bottom']") and (
      re.search(r"\['top'\]\['hidden'\]\[0\]\['kernel'\]", path)
      or (re.search(r"\['top'\]\['out'\]\['kernel'\]", path)
          and not _has(param_paths, "['top']['hidden']"))):
    return {0: (VEC, REST)}
  cross = re.search(r"\['cross'\]\[\d+\]\['(kernel|bias|down|up)'\]", path)
  if cross:
    cross_rules: dict[str, dict[int, tuple[str, ...]]] = {
        "kernel": {0: (FLAT,), 1: (FLAT,)}, "bias": {0: (FLAT,)}, "down": {0: (FLAT,)},
        "up": {1: (FLAT,)}}
    return cross_rules[cross.group(1)]
  if re.search(r"\['head'\]\['kernel'\]", path):
    return {0: (FLAT, REST) if mlp_hidden else (FLAT, FLAT)}
  return {}


def _axis_index(layout: EmbedLayout, segments: tuple[str, ...], size: int, sup_size: int,
                where: str) -> np.ndarray:
  """[size] int: where each index of a trial's axis lies on the superset's axis.

  Raises:
    ValueError: naming `where`, when the sizes do not follow the segments.
  """
  parts, offset, used = [], 0, 0
  for kind in segments:
    if kind == REST:  # the last segment: the remaining entries, in order
      parts.append(offset + np.arange(max(size - used, 0)))
      used = size
    else:
      parts.append(offset + layout.segment_index(kind))
      offset += layout.segment_size(kind, True)
      used += layout.segment_size(kind, False)
  index = np.concatenate(parts)
  if used != size or index.size != size or (index.size and index.max() >= sup_size):
    raise ValueError(f"padded_layout: axis of {where} with {size} entries does not follow "
                     f"{segments} in {layout} (superset: {sup_size})")
  return index


def leaf_index(layout: EmbedLayout | None, path: str, shape, sup_shape, param_paths
               ) -> tuple[np.ndarray, ...]:
  """Per axis, where a trial leaf's indices lie in its superset leaf (`np.ix_` them).

  `layout` None (same d) or an axis no rule names: the corner (0..n-1). `path` is
  the leaf's full path; the rules match the params-relative part at its end.
  """
  if layout is None:
    return tuple(np.arange(n) for n in shape)
  rules = _axis_segments(path, param_paths)
  return tuple(_axis_index(layout, rules[a], n, sup_shape[a], path) if a in rules else np.arange(n)
               for a, n in enumerate(shape))


def slot_layout(layout: EmbedLayout | None, width: int, slot_width: int, sup_width: int,
                sup_slot_width: int, row_wise: bool = False) -> tuple[np.ndarray, np.ndarray]:
  """(slot column index [S_e] into the superset's [S_E], fill row [S_E] of padded columns).

  `row_wise`: the trial's row optimizer keeps one slot per row (rowwise_adagrad, S = 1
  whatever the width): it lies in the superset's first slot column.

  Raises:
    ValueError: the slots are not whole blocks of the row width (a row-wise optimizer
      not flagged `row_wise`).
  """
  cols = np.arange(width) if layout is None else layout.table_columns()
  if layout is None or row_wise:
    return np.arange(slot_width), np.zeros((sup_slot_width,), np.float32)
  blocks = slot_width // width
  # A superset of several row optimizers has more slot columns than this trial's blocks
  # (`lane_optimizers`): its blocks come first, the rest is never read by its optimizer.
  if slot_width != blocks * width or sup_slot_width < blocks * sup_width or blocks > 2:
    raise ValueError(f"padded_layout: slots of width {slot_width} for rows of width {width} "
                     f"(superset {sup_slot_width} for {sup_width}) are not element-wise: "
                     f"model.embed_dim is part of the bucket for this row optimizer")
  index = np.concatenate([b * sup_width + cols for b in range(blocks)]) if blocks else np.arange(0)
  fill = np.full((sup_slot_width,), _ADAGRAD_FILL if blocks == 1 else 0.0, np.float32)
  return index.astype(np.int64), fill


def infer_layout(params: Mapping[str, Any], sup_params: Mapping[str, Any], width: int,
                 sup_width: int) -> EmbedLayout | None:
  """The trial's `EmbedLayout` from its and its superset's shapes; None when e == E.

  Args:
    params, sup_params: params-relative path -> shape (tuple) of the trial and the
      superset.
    width, sup_width: e and E, the row widths.

  The dense feature count Nd is `dense_linear`'s length (dlrm: the bottom MLP's
  input); F = (N - n) / (E - e) of a FLAT axis (n, N: trial and superset lengths),
  d = (n - Nd) / F, fo = e - d. dlrm rows have no first-order column; fm's have.

  Raises:
    ValueError: the shapes fit no rule (a model outside `_EMBED_MASKABLE_MODELS`).
  """
  if width == sup_width:
    return None
  names = _module_names(sup_params)

  def shape(tree, fragment):
    return next((s for p, s in tree.items() if fragment in p), None)

  if "top" in names:  # dlrm: the bottom MLP's last layer has width d
    bottom = sorted((p, s) for p, s in params.items() if "['bottom']" in p and "['kernel']" in p)
    num_dense = bottom[0][1][0] if bottom else 0
    return EmbedLayout(False, 0, num_dense, width, sup_width)
  num_dense = shape(params, "['dense_linear']['kernel']")
  probes = (("['mlp']['hidden'][0]['kernel']", 1), ("['cross'][0]['bias']", 1),
            ("['mlp']['out']['kernel']", 1), ("['head']['kernel']", 2))
  for fragment, copies in probes:
    if fragment == "['mlp']['out']['kernel']" and _has(sup_params, "['mlp']['hidden']"):
      continue
    if fragment == "['head']['kernel']" and _has(sup_params, "['mlp']['hidden']"):
      continue
    n, big = shape(params, fragment), shape(sup_params, fragment)
    if n is None or big is None or num_dense is None:
      continue
    n, big, nd = n[0] // copies, big[0] // copies, num_dense[0]
    fields, rem = divmod(big - n, sup_width - width)
    dim = (n - nd) // fields if fields > 0 else -1
    first_order = width - dim
    if rem or fields < 1 or fields * dim + nd != n or first_order not in (0, 1) or dim < 1:
      raise ValueError(f"padded_layout: {fragment} of {n} entries (superset {big}) does not "
                       f"follow rows of width {width} (superset {sup_width})")
    return EmbedLayout(bool(first_order), fields, nd, dim, sup_width - width + dim)
  if names <= {"bias", "dense_linear"}:  # fm: no dense parameter sees d
    return EmbedLayout(True, 0, 0, width - 1, sup_width - 1)
  raise ValueError(f"padded_layout: no embed_dim layout rule fits a model with modules "
                   f"{sorted(names)} (rows of width {width} in a superset of {sup_width})")
