"""Shape buckets of the `composed` model: trials with different blocks in one padded program.

DESIGN.md §4 ("cohorts that fill"), the block-spec part of `padded`. A composed
trial's architecture is its block spec (`model.blocks`, `sfjax.models.block_spec`).
Its bucket key (`bucket_blocks`) is the canonical spec with

  * the tower's `dims` masked when non-empty (its hidden layers pad as a named
    model's MLP: zero units, identity layers; `padded._is_hidden_kernel`);
  * `dense.linear` masked (a superset's DenseLinear that is zero and frozen adds 0);
  * each cross block's `layers` masked (a zero cross layer is the identity);
  * with `combine == "parallel"`, every interaction block but `first_order` dropped
    (each adds its own term to the logit, so a superset holds any set of them;
    `first_order` gives rows their last column, so it stays).

In stacked combine the blocks feed the tower, so their list stays (only cross layers
and the tower's sizes are masked). A spec with one block entry twice (an entry's
identity: its type and parameters, cross `layers` left out) or an already gated
spec is not maskable: its key is its full spec.

The superset (`superset_blocks`) of a parallel bucket holds the union of the trials'
entries in canonical order (`block_spec.BLOCK_TYPES` order, then parameter JSON),
each cross entry with the most layers, the widest and deepest tower, a DenseLinear
when any trial has one, and, when some trial lacks some of its blocks, the flag
`gated` (`ComposedModel.gates`): a trial's padded state has gate 1 on its own
blocks and 0 on the others, frozen by the dense mask, so the others' outputs and
every gradient through them are exactly 0 (`gate_row`). A trial's block i lies at
the superset's `block_index(...)[i]`; `rename_path` moves its parameter paths
(params and optimizer states alike) there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sfjax.models import block_spec

_MASKED = "masked"
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
  return not spec.get("gated", False) and len(set(ids)) == len(ids)


def bucket_blocks(text: str) -> str:
  """The bucket key text of spec JSON `text` (see the module docstring); not a valid spec."""
  spec = block_spec.spec_from_json(text)
  if not _maskable(spec):
    return block_spec.spec_to_json(spec)
  blocks = [{**b, "layers": _MASKED} if b["type"] == "cross" else b for b in spec["interactions"]]
  if spec["combine"] == "parallel":
    blocks = [b for b in blocks if b["type"] == "first_order"]
  tower = spec["tower"]
  if tower is not None and tower["dims"]:
    tower = {**tower, "dims": _MASKED}
  return _json({**spec, "interactions": blocks, "tower": tower,
                "dense": {**spec["dense"], "linear": _MASKED}})


def superset_blocks(texts: Sequence[str]) -> str:
  """The canonical spec JSON of the smallest model holding each spec of one bucket.

  Raises:
    ValueError: `texts` is empty or spans several buckets.
  """
  if not texts:
    raise ValueError("superset_blocks: no specs")
  if len({bucket_blocks(t) for t in texts}) != 1:
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
  if first["combine"] == "parallel":
    entries = {_entry_id(b): b for spec in specs for b in spec["interactions"]}
    blocks = sorted(entries.values(), key=_order)
  else:  # stacked: one block list (the key), in its order (the tower reads it so)
    blocks = first["interactions"]
  blocks = [{**b, "layers": layers[_entry_id(b)]} if b["type"] == "cross" else b for b in blocks]
  sup = {**first, "interactions": blocks,
         "dense": {**first["dense"], "linear": any(s["dense"]["linear"] for s in specs)}}
  dims = [s["tower"]["dims"] for s in specs if s["tower"] is not None]
  if first["tower"] is not None and first["tower"]["dims"]:
    sup["tower"] = {**first["tower"],
                    "dims": [max(max(d) for d in dims)] * max(len(d) for d in dims)}
  ids = {_entry_id(b) for b in blocks}
  if first["combine"] == "parallel" and any(
      {_entry_id(b) for b in s["interactions"]} != ids for s in specs):
    sup["gated"] = True
  return block_spec.spec_to_json(sup)


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
