"""Shape buckets of the `composed` model: trials with different blocks in one padded program.

DESIGN.md §4 ("cohorts that fill"), the block-spec part of `padded`; issue #26 0(a).
A composed trial's architecture is its block spec (`model.blocks`,
`sfjax.models.block_spec`). Its bucket key (`bucket_blocks`) is the canonical spec with

  * the interaction blocks masked, in either combination: the superset holds the
    union of the trials' entries (a cross entry with the most layers; a zero cross
    layer is the identity). In parallel each block adds its own logit term, gated
    per trial (`gated`, below); stacked blocks feed the tower, and the tower's rows
    of a block a trial lacks are zero, so it adds exactly 0 and takes gradient 0;
  * the tower masked when it has hidden layers (they pad as a named model's MLP:
    zero units, identity layers; `padded._is_hidden_kernel`), its inputs too (the
    superset reads their union; a trial's first-kernel rows move to their places,
    `ColumnLayout`), and in parallel a missing tower (a zero tower adds 0);
  * `dense.linear` and `bias` masked (a superset's DenseLinear or bias that is zero
    and frozen adds 0);
  * the per-group embedding dims masked (and, when the data's field count F is
    known, the group count too: trials of 1, 2 or 3 field groups share a superset
    whose dims are per field, field f's the largest of the trials' dims of f,
    `field_layout.field_dims`; with F unknown the group count stays in the key): the
    superset has each group's (or field's) largest dim and a `[F, E]` column gate
    (`gated_columns`, `column_gate_row`) zeroing each trial's columns past its own
    dims, so they read 0 and take gradient exactly 0; `first_order` (the rows' last
    column) likewise: a trial without it has that column zero, its block gated or
    its tower rows zero. Padded row columns take gradient 0, so element-wise row
    optimizers leave them still, and rowwise_adagrad averages over each lane's own
    row width (`lane_optimizers.ROW_WIDTH_KEY`, set by the cohort runner).

What stays: the combination, the bottom MLP (it adds an interaction vector), a tower
without hidden layers (and its inputs), the group count when F is not given. A spec with one block entry
twice (an entry's identity: its type and parameters, cross `layers` left out) or an
already gated spec is not maskable: its key is its full spec.

The superset (`superset_blocks`) holds the union of the trials' entries in canonical
order (`block_spec.BLOCK_TYPES` order, then parameter JSON), the widest and deepest
tower reading the union of the inputs, a DenseLinear and a bias when any trial has
one, and, in parallel when some trial lacks some of its blocks, the flag `gated`
(`ComposedModel.gates`): a trial's padded state has gate 1 on its own blocks and 0
on the others, frozen by the dense mask, so the others' outputs and every gradient
through them are exactly 0 (`gate_row`). A trial's block i lies at the superset's
`block_index(...)[i]`; `rename_path` moves its parameter paths (params and optimizer
states alike) there. When dims, tower inputs or a stacked block list differ, the
superset gates columns and `ColumnLayout` places the dense axes that follow them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flax import nnx

from sfjax.models import block_spec, field_layout, pair_blocks

_MASKED = "masked"
# `block_spec`'s tower inputs, in the order a superset's tower reads their union.
_TOWER_INPUTS = ("embeddings", "dense", "bottom", "blocks")
_BLOCKS_PATH = re.compile(r"\['blocks'\]\[(\d+)\]")
_TYPE_ORDER = {t: i for i, t in enumerate(block_spec.BLOCK_TYPES)}


def _json(value: Any) -> str:
  return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _entry_id(block: Mapping[str, Any]) -> str:
  """A block entry's identity in a bucket: its type and parameters, cross `layers` left out."""
  return _json({k: v for k, v in block.items() if not (block["type"] == "cross" and k == "layers")})


def _order(block: Mapping[str, Any]) -> tuple[int, str]:
  return _TYPE_ORDER[block["type"]], _entry_id(block)


def _maskable(spec: Mapping[str, Any]) -> bool:
  ids = [_entry_id(b) for b in spec["interactions"]]
  gated = spec.get("gated", False) or spec.get("gated_columns", False)
  return not gated and len(set(ids)) == len(ids)


def _without_dense(spec: dict[str, Any]) -> dict[str, Any]:
  """`spec` as its key sees it on data without dense features: no bottom MLP (it is not
  built when Nd = 0) and no "dense"/"bottom" tower inputs (they read 0 columns)."""
  tower = spec["tower"]
  if tower is not None:
    inputs = [n for n in tower["inputs"] if n not in ("dense", "bottom")]
    tower = {**tower, "inputs": inputs or tower["inputs"]}
  return {**spec, "tower": tower, "dense": {**spec["dense"], "bottom_mlp": None}}


def bucket_blocks(text: str, num_dense: int | None = None, num_fields: int | None = None) -> str:
  """The bucket key text of spec JSON `text` (see the module docstring); not a valid spec.

  `num_dense`: the data's dense
  feature count Nd, when known; with 0 the bottom MLP and the "dense"/"bottom" tower
  inputs leave the key (nothing is built for them). `num_fields`: the data's field
  count F, when known; then the group count leaves the key (`superset_blocks` gives
  trials of different group counts per-field dims).
  """
  spec = block_spec.spec_from_json(text)
  if not _maskable(spec):
    return block_spec.spec_to_json(spec)
  if num_dense == 0:
    spec = _without_dense(spec)
  # The dims are gated; with F unknown, the group count fixes which fields share one.
  rows: Any = {"dims": _MASKED} if num_fields is not None else {
      "groups": len(spec["embedding"]["dims"]), "dims": _MASKED}
  tower = spec["tower"]
  if (tower is not None and tower["dims"]) or (tower is None and spec["combine"] == "parallel"):
    tower = _MASKED  # hidden layers pad; inputs and absent towers are zero rows
  return _json({**spec, "embedding": rows, "interactions": _MASKED, "tower": tower,
                "bias": _MASKED, "dense": {**spec["dense"], "linear": _MASKED}})


def superset_blocks(texts: Sequence[str], num_dense: int | None = None,
                    num_fields: int | None = None) -> str:
  """The canonical spec JSON of the smallest model holding each spec of one bucket
  (`bucket_blocks(..., num_dense=num_dense, num_fields=num_fields)`). Its embedding dims
  are per group when every spec has the same group count, else per field (F =
  `num_fields`): field f's dim the largest of the specs' dims of field f.

  Raises:
    ValueError: `texts` is empty or spans several buckets.
  """
  if not texts:
    raise ValueError("superset_blocks: no specs")
  if len({bucket_blocks(t, num_dense=num_dense, num_fields=num_fields) for t in texts}) != 1:
    raise ValueError("superset_blocks: the specs are in different buckets")
  specs = [block_spec.spec_from_json(t) for t in texts]
  first = specs[0]
  if len({block_spec.spec_to_json(s) for s in specs}) == 1 or not _maskable(first):
    return block_spec.spec_to_json(first)
  layers: dict[str, int] = {}
  for spec in specs:
    for b in spec["interactions"]:
      if b["type"] == "cross":
        layers[_entry_id(b)] = max(layers.get(_entry_id(b), 0), b["layers"])
  entries = {_entry_id(b): b for spec in specs for b in spec["interactions"]}
  blocks = [{**b, "layers": layers[_entry_id(b)]} if b["type"] == "cross" else b
            for b in sorted(entries.values(), key=_order)]
  bottoms = [s["dense"]["bottom_mlp"] for s in specs if s["dense"]["bottom_mlp"] is not None]
  sup = {**first, "interactions": blocks, "bias": any(s["bias"] for s in specs),
         "dense": {"linear": any(s["dense"]["linear"] for s in specs),
                   "bottom_mlp": bottoms[0] if bottoms else None},  # all equal unless Nd = 0
         "embedding": {"dims": _superset_dims([s["embedding"]["dims"] for s in specs],
                                              num_fields)}}
  towers = [s["tower"] for s in specs if s["tower"] is not None]
  if towers:  # the widest, deepest (masked, else all equal), the union of the inputs
    dims = [t["dims"] for t in towers]
    sup["tower"] = {"dims": [max(max(d) for d in dims)] * max(len(d) for d in dims)
                    if dims[0] else [],
                    "inputs": [n for n in _TOWER_INPUTS if any(n in t["inputs"] for t in towers)]}
  ids = [_entry_id(b) for b in blocks]
  if first["combine"] == "parallel" and any(
      {_entry_id(b) for b in s["interactions"]} != set(ids) for s in specs):
    sup["gated"] = True
  # The tower reads stacked blocks in order: another set or order moves its rows.
  if any(s["embedding"] != sup["embedding"] or (s["tower"] is not None and s["tower"]["inputs"]
                                                != sup["tower"]["inputs"]) for s in specs) or (
      first["combine"] == "stacked" and any([_entry_id(b) for b in s["interactions"]] != ids
                                            for s in specs)):
    sup["gated_columns"] = True  # dense axes to remap (`ColumnLayout`); its gates name F
  return block_spec.spec_to_json(sup)


def _superset_dims(dims: Sequence[Sequence[int]], num_fields: int | None) -> list[int]:
  """Per group the largest of `dims` (one list per spec) when their group counts agree, else
  per field (`field_layout.field_dims` over F = `num_fields`) the largest."""
  if len({len(d) for d in dims}) > 1:
    if num_fields is None:  # `bucket_blocks` keeps the group count in the key without F
      raise ValueError("superset_blocks: specs of different field-group counts need num_fields")
    dims = [field_layout.field_dims(d, num_fields) for d in dims]
  return [max(column) for column in zip(*dims, strict=True)]


def spec_width(text: str) -> int:
  """The row width E of spec JSON `text` (its ArchSpec's `embed_dim`)."""
  return block_spec.spec_embedding_width(block_spec.spec_from_json(text))


def block_index(text: str, sup_text: str) -> tuple[int, ...]:
  """Per block of spec `text`, the index of its entry in superset spec `sup_text`.

  Raises:
    ValueError: a block the superset lacks.
  """
  blocks = block_spec.spec_from_json(text)["interactions"]
  sup_ids = [_entry_id(b) for b in block_spec.spec_from_json(sup_text)["interactions"]]
  index = []
  for i, b in enumerate(blocks):
    if _entry_id(b) not in sup_ids:
      raise ValueError(f"padded_blocks: block {i} ({_entry_id(b)}) is not in the superset's "
                       f"blocks {sup_ids}")
    index.append(sup_ids.index(_entry_id(b)))
  return tuple(index)


def gate_row(text: str, sup_text: str) -> np.ndarray | None:
  """`[superset blocks]` float32 gates of a trial (1 on its blocks, else 0); None unless
  the superset is gated."""
  sup = block_spec.spec_from_json(sup_text)
  if not sup.get("gated", False):
    return None
  row = np.zeros((len(sup["interactions"]),), np.float32)
  row[list(block_index(text, sup_text))] = 1.0
  return row


def rename_path(path: str, index: Sequence[int]) -> str:
  """`path` (a params or optimizer-state key string), `['blocks'][i]` -> `['blocks'][index[i]]`.
  """
  return _BLOCKS_PATH.sub(lambda m: f"['blocks'][{index[int(m.group(1))]}]", path)


def column_gate_row(text: str, sup_text: str, num_fields: int) -> np.ndarray | None:
  """`[F, E]` float32 column gates of a trial (1 on each field's own first d_f columns and on
  its first-order column, else 0); None unless the superset gates its columns."""
  sup = block_spec.spec_from_json(sup_text)
  if not sup.get("gated_columns", False):
    return None
  spec = block_spec.spec_from_json(text)
  gates = np.zeros((num_fields, block_spec.spec_embedding_width(sup)), np.float32)
  for f, d in enumerate(field_layout.field_dims(spec["embedding"]["dims"], num_fields)):
    gates[f, :d] = 1.0
  if any(b["type"] == "first_order" for b in spec["interactions"]):
    gates[:, -1] = 1.0
  return gates


_CROSS_LEAF = re.compile(r"\['blocks'\]\[(\d+)\]\['layers'\]\[\d+\]\['(kernel|bias|down|up)'\]")
_HEAD_LEAF = re.compile(r"\['blocks'\]\[(\d+)\]\['head'\]\['kernel'\]")
_TOWER_HIDDEN0 = re.compile(r"\['tower'\]\['hidden'\]\[0\]\['kernel'\]")
_TOWER_OUT = re.compile(r"\['tower'\]\['out'\]\['kernel'\]")
_CROSS_AXES = {"kernel": (0, 1), "bias": (0,), "down": (0,), "up": (1,)}


class ColumnLayout:
  """Where a composed trial's row columns, and the dense axes that follow them or its
  tower's inputs, lie in its column-gated superset's (`gated_columns`).

  Axes remapped: x0 `[sum_f d_f + Nd]` (cross kernels, biases, low-rank down/up, a
  cross block's head), an outer-product head `[D * D]`, and the tower's first kernel,
  whose rows are the trial's inputs in its order (embeddings `[sum_f d_f]`, dense
  `[Nd]`, bottom `[D]`, stacked blocks' outputs `[sum_k out_k]`), each moved to its
  place among the superset's (the union of the inputs, blocks at their superset
  index); rows of inputs and blocks a trial lacks are zero (their outputs then add
  exactly 0 and take gradient 0). Every other axis pads at its end (attention
  projections read `[D]`; the bottom MLP's last layer writes it), as sizes do.
  """

  def __init__(self, text: str, sup_text: str, num_fields: int, sup_params: Mapping[str, Any]):
    """The trial's and the superset's spec JSON, F, and the superset's param shapes
    (path -> shape: they give the dense feature count Nd where anything reads it)."""
    spec, sup = block_spec.spec_from_json(text), block_spec.spec_from_json(sup_text)
    self.dims = field_layout.field_dims(spec["embedding"]["dims"], num_fields)
    self.sup_dims = field_layout.field_dims(sup["embedding"]["dims"], num_fields)
    self.first_order = any(b["type"] == "first_order" for b in spec["interactions"])
    self.blocks, self.sup_blocks = spec["interactions"], sup["interactions"]
    self.index = block_index(text, sup_text)
    self.tower_inputs = tuple(spec["tower"]["inputs"]) if spec["tower"] is not None else ()
    self.sup_inputs = tuple(sup["tower"]["inputs"]) if sup["tower"] is not None else ()
    self.tower_hidden = sup["tower"] is not None and bool(sup["tower"]["dims"])
    self.num_dense = _num_dense(sup_params, sum(self.sup_dims))
    self.bottom = any("['bottom']" in k for k in sup_params)  # a bottom vector z [D]

  @property
  def vector_dims(self) -> tuple[int, int]:
    """(D, the superset's D): the widths of the field vectors."""
    return max(self.dims), max(self.sup_dims)

  def _flat(self) -> np.ndarray:
    """[sum_f d_f]: field f's column j at its offset in the superset's concatenation."""
    offsets = np.concatenate([[0], np.cumsum(self.sup_dims)[:-1]])
    return np.concatenate([o + np.arange(d) for o, d in zip(offsets, self.dims, strict=True)]
                          ).astype(np.int64)

  def _x0(self, size: int) -> np.ndarray:
    num_dense = size - sum(self.dims)
    return np.concatenate([self._flat(), sum(self.sup_dims) + np.arange(num_dense)])

  def _outer(self) -> np.ndarray:
    d, sup_d = self.vector_dims
    return (np.arange(d)[:, None] * sup_d + np.arange(d)[None, :]).reshape(-1)

  def _out_sizes(self, blocks, dims, num_dense: int) -> list[int]:
    shape = pair_blocks.BlockShape(
        num_fields=len(dims), num_vectors=len(dims) + int(self.bottom), vector_dim=max(dims),
        x0_dim=sum(dims) + num_dense,
        has_first_order=any(b["type"] == "first_order" for b in blocks))
    return [_out_features(b, shape) for b in blocks]

  def _tower(self, size: int, sup_size: int) -> np.ndarray:
    """[size]: the tower's first kernel rows of the trial in the superset's (`sup_size`).

    Nd, where no other leaf gives it (then no cross block reads it), is what the
    trial's or the superset's rows leave for their "dense" input.
    """
    d, sup_d = self.vector_dims
    stacked = "blocks" in self.sup_inputs
    nd = self.num_dense or 0
    out = self._out_sizes(self.blocks, self.dims, nd) if stacked else []
    sup_out = self._out_sizes(self.sup_blocks, self.sup_dims, nd) if stacked else []
    own = {"embeddings": sum(self.dims), "bottom": d if self.bottom else 0, "blocks": sum(out)}
    sup_sizes = {"embeddings": sum(self.sup_dims), "bottom": sup_d if self.bottom else 0,
                 "blocks": sum(sup_out)}
    num_dense = self.num_dense
    if num_dense is None:
      num_dense = (size - sum(own[k] for k in self.tower_inputs if k in own)
                   if "dense" in self.tower_inputs else
                   sup_size - sum(sup_sizes[k] for k in self.sup_inputs if k in sup_sizes))
    sup_sizes["dense"] = num_dense
    starts = dict(zip(self.sup_inputs, np.cumsum([0] + [sup_sizes[k] for k in self.sup_inputs]),
                      strict=False))
    block_starts = np.cumsum([0] + sup_out)
    parts = []
    for name in self.tower_inputs:
      if name == "blocks":
        for i, block in enumerate(self.blocks):
          j = self.index[i]
          inner = (self._outer() if block["type"] == "outer_product" else
                   self._x0(out[i]) if block["type"] == "cross" else np.arange(out[i]))
          parts.append(starts[name] + block_starts[j] + inner)
      else:
        index = {"embeddings": self._flat(), "dense": np.arange(num_dense),
                 "bottom": np.arange(own["bottom"])}[name]
        parts.append(starts[name] + index)
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0,), np.int64)

  def leaf_index(self, path: str, shape, sup_shape) -> tuple[np.ndarray, ...]:
    """Per axis, where a trial leaf's indices (its superset path `path`) lie in its
    superset leaf (`np.ix_` them).

    Raises:
      ValueError: naming `path`, when an axis does not follow the columns.
    """
    out = [np.arange(n) for n in shape]
    cross, head = _CROSS_LEAF.search(path), _HEAD_LEAF.search(path)
    types = [b["type"] for b in self.sup_blocks]
    if cross and types[int(cross.group(1))] == "cross":
      for axis in _CROSS_AXES[cross.group(2)]:
        out[axis] = self._x0(shape[axis])
    elif head and types[int(head.group(1))] == "cross":
      out[0] = self._x0(shape[0])
    elif head and types[int(head.group(1))] == "outer_product":
      out[0] = self._outer()
    elif _TOWER_HIDDEN0.search(path) or (_TOWER_OUT.search(path) and not self.tower_hidden):
      out[0] = self._tower(shape[0], sup_shape[0])
    for axis, index in enumerate(out):
      if index.size != shape[axis] or (index.size and index.max() >= sup_shape[axis]):
        raise ValueError(f"padded_blocks: axis {axis} of {path} ({shape[axis]} entries) does not "
                         f"follow the columns {self.dims} in {self.sup_dims}")
    return tuple(out)


def _num_dense(sup_params: Mapping[str, Any], sup_flat: int) -> int | None:
  """Nd from a superset leaf that reads the dense features; None when none does."""
  for path, shape in sup_params.items():
    if "['dense_linear']['kernel']" in path or "['bottom']['hidden'][0]['kernel']" in path:
      return int(shape[0])
    if _CROSS_LEAF.search(path) and path.endswith("['bias'].value"):
      return int(shape[0]) - sup_flat
  return None


def _out_features(block: Mapping[str, Any], shape: pair_blocks.BlockShape) -> int:
  """A stacked block's output width for `shape` (built abstractly: no arrays)."""
  params = {k: v for k, v in block.items() if k != "type"}
  module = nnx.eval_shape(lambda: block_spec.BLOCK_TYPES[block["type"]](
      params, shape, to_logit=False, rngs=nnx.Rngs(0)))
  return int(module.out_features)
