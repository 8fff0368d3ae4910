"""The block spec of a generated CTR model: schema, validation, canonical JSON, pairs.

A spec is a JSON-able dict (what `--config.model.blocks` carries, as JSON text):

    {"embedding": {"dims": [16]},                    # per field-group dims (field_layout)
     "dense": {"linear": true, "bottom_mlp": null},  # dense @ w term; DLRM's bottom MLP
     "bias": false,                                  # a scalar logit bias
     "interactions": [{"type": "first_order"}, {"type": "fm", "pairs": null}],
     "combine": "parallel",                          # parallel | stacked
     "tower": {"dims": [400, 400, 400], "inputs": ["embeddings", "dense"]},  # or null
     "gated": false,                                 # a 0/1 gate per parallel block
     "gated_columns": false}                         # a 0/1 gate per field column

`combine`: "parallel" adds every interaction block's output to the logit (a
bias-free Linear head for feature blocks); "stacked" feeds every block's output
into the tower (its `inputs` then list "blocks"). Tower inputs, concatenated in
the listed order: "embeddings" (field vectors `[B, sum_f d_f]`), "dense" (`[B, Nd]`),
"bottom" (the bottom MLP's vector z `[B, D]`, absent when Nd = 0), "blocks".
The logit is `bias + dense @ w + parallel blocks + tower`.

`gated` (parallel only) multiplies each block's logit term by its own scalar
parameter `gates[i]` (init 1): a shape bucket's superset model
(`sfjax.cohorts.shape_buckets.bucket_blocks`) holds the union of its trials' blocks and
switches off, per trial, those the trial lacks (gate 0, frozen). The canonical
form carries `"gated": true` only when set, so specs without it keep their text.
`gated_columns` (canonical only when set, likewise) multiplies the embedding rows `[B, F, E]`
by a `[F, E]` parameter (init 1): a superset of trials with smaller per-field dims
zeroes, per trial, the columns past its own dims (the same bucket module).

Missing keys take the defaults above (tower: none; tower inputs: ["embeddings",
"dense"] when parallel, ["blocks"] when stacked; block parameters: each block's
`PARAMS`); an unknown key or a bad value raises `SpecError` naming the field and
the key (`model.blocks: interactions[1].layers: ...`). `validate_spec` returns the
canonical form (every key present, pairs sorted), so `spec_to_json` of equal
models is equal text (trial cohorts group by it).
"""

from __future__ import annotations

import itertools
import json
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from sfjax.models import deep_blocks, pair_blocks

BLOCK_TYPES: dict[str, type[pair_blocks.Block]] = {
    cls.type_name: cls for cls in (
        pair_blocks.FirstOrder, pair_blocks.FMBlock, pair_blocks.InnerProduct,
        pair_blocks.OuterProduct, pair_blocks.GatedPairs, deep_blocks.CrossNetwork,
        deep_blocks.CINBlock, deep_blocks.SelfAttention)}
PAIRWISE_TYPES = tuple(t for t, cls in BLOCK_TYPES.items() if cls.pairwise)
COMBINES = ("parallel", "stacked")
_TOWER_INPUTS = ("embeddings", "dense", "bottom", "blocks")
_TOP_KEYS = ("embedding", "dense", "bias", "interactions", "combine", "tower", "gated",
             "gated_columns")
_MAX = 1 << 20  # widths, depths and field indices: far beyond any CTR model


class SpecError(ValueError):
  """A bad block spec; the message names the config field and the key."""


class _Where:
  """Error factory bound to the config field (e.g. `model.blocks`)."""

  def __init__(self, field: str):
    self.field = field

  def fail(self, key: str, msg: str):
    raise SpecError(f"{self.field}: {key}: {msg}")


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _count(w: _Where, key: str, value, low: int) -> int:
  if not _is_int(value) or not low <= value <= _MAX:
    w.fail(key, f"must be an int in [{low}, {_MAX}], got {value!r}")
  return int(value)


def _int_list(w: _Where, key: str, value, low: int, allow_empty: bool) -> list[int]:
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
    w.fail(key, f"must be a list of ints >= {low}, got {value!r}")
  if not value and not allow_empty:
    w.fail(key, "must not be empty")
  return [_count(w, f"{key}[{i}]", v, low) for i, v in enumerate(value)]


def _bool(w: _Where, key: str, value) -> bool:
  if not isinstance(value, bool):
    w.fail(key, f"must be true or false, got {value!r}")
  return value


def _mapping(w: _Where, key: str, value, known: Sequence[str]) -> Mapping:
  if not isinstance(value, Mapping):
    w.fail(key, f"must be an object, got {value!r}")
  unknown = sorted(str(k) for k in value if k not in known)
  if unknown:
    w.fail(key, f"unknown key {unknown[0]!r} (known: {', '.join(known)})")
  return value


def _canonical_pairs(pairs, w: _Where | None = None, key: str = "pairs") -> list[list[int]]:
  """Sorted `[[i, j], ...]` field pairs with 0 <= i < j; SpecError on a bad or repeated pair."""
  w = w or _Where("pairs")
  if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
    w.fail(key, f"must be a list of [i, j] field pairs, got {pairs!r}")
  out = []
  for n, pair in enumerate(pairs):
    if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
      w.fail(f"{key}[{n}]", f"must be a pair [i, j], got {pair!r}")
    i, j = (_count(w, f"{key}[{n}]", v, 0) for v in pair)
    if i >= j:
      w.fail(f"{key}[{n}]", f"needs i < j, got {[i, j]}")
    out.append([i, j])
  out.sort()
  for a, b in itertools.pairwise(out):
    if a == b:
      w.fail(key, f"pair {a} appears twice")
  return out


def _block(w: _Where, key: str, entry) -> dict:
  if not isinstance(entry, Mapping) or "type" not in entry:
    w.fail(key, f"must be an object with a 'type' (one of {', '.join(BLOCK_TYPES)}), got {entry!r}")
  kind = entry["type"]
  if not isinstance(kind, str) or kind not in BLOCK_TYPES:
    w.fail(f"{key}.type", f"unknown block type {kind!r} (known: {', '.join(BLOCK_TYPES)})")
  cls = BLOCK_TYPES[kind]
  _mapping(w, key, entry, ("type", *cls.PARAMS))
  out = {"type": kind}
  for name, (param_kind, default) in cls.PARAMS.items():
    value = entry.get(name, default)
    where = f"{key}.{name}"
    if param_kind == pair_blocks.PAIRS:
      out[name] = None if value is None else _canonical_pairs(value, w, where)
    elif param_kind == pair_blocks.DIMS:
      out[name] = _int_list(w, where, value, 1, allow_empty=False)
    else:
      out[name] = _count(w, where, value, 0 if param_kind == pair_blocks.COUNT0 else 1)
  return out


def validate_spec(spec: Mapping[str, Any], field: str = "model.blocks") -> dict:
  """The canonical form of `spec` (defaults filled in, pairs sorted; `gated` only when true).

  Args:
    spec: a block spec (see the module docstring).
    field: the config field named in errors.

  Raises:
    SpecError: naming `field` and the bad key.
  """
  w = _Where(field)
  _mapping(w, "<spec>", spec, _TOP_KEYS)
  if "embedding" not in spec:
    w.fail("embedding", "missing (e.g. {\"dims\": [16]})")
  emb = _mapping(w, "embedding", spec["embedding"], ("dims",))
  dims = _int_list(w, "embedding.dims", emb.get("dims"), 0, allow_empty=False)
  dense_in = _mapping(w, "dense", spec.get("dense", {}), ("linear", "bottom_mlp"))
  bottom = dense_in.get("bottom_mlp")
  dense = {"linear": _bool(w, "dense.linear", dense_in.get("linear", True)),
           "bottom_mlp": None if bottom is None else _int_list(w, "dense.bottom_mlp", bottom, 1,
                                                                allow_empty=True)}
  raw_blocks = spec.get("interactions", [])
  if isinstance(raw_blocks, (str, bytes)) or not isinstance(raw_blocks, Sequence):
    w.fail("interactions", f"must be a list of blocks, got {raw_blocks!r}")
  blocks = [_block(w, f"interactions[{i}]", b) for i, b in enumerate(raw_blocks)]
  combine = spec.get("combine", "parallel")
  if combine not in COMBINES:
    w.fail("combine", f"must be one of {', '.join(COMBINES)}, got {combine!r}")
  out = {"embedding": {"dims": dims}, "dense": dense,
         "bias": _bool(w, "bias", spec.get("bias", False)), "interactions": blocks,
         "combine": combine, "tower": _tower(w, spec.get("tower"), combine)}
  if _bool(w, "gated", spec.get("gated", False)):
    if combine != "parallel":
      w.fail("gated", "only a parallel model gates its blocks (stacked blocks feed the tower)")
    out["gated"] = True  # only when set: ungated specs keep their canonical text
  if _bool(w, "gated_columns", spec.get("gated_columns", False)):
    out["gated_columns"] = True  # likewise
  _check_consistency(w, out)
  return out


def _tower(w: _Where, tower, combine: str) -> dict | None:
  if tower is None:
    if combine == "stacked":
      w.fail("tower", "a stacked model needs a tower (its blocks feed it)")
    return None
  tower = _mapping(w, "tower", tower, ("dims", "inputs"))
  default_inputs = ["embeddings", "dense"] if combine == "parallel" else ["blocks"]
  inputs = tower.get("inputs", default_inputs)
  if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or not inputs:
    w.fail("tower.inputs", f"must be a non-empty list of {', '.join(_TOWER_INPUTS)}, got {inputs!r}")
  for i, name in enumerate(inputs):
    if name not in _TOWER_INPUTS or name in list(inputs)[:i]:
      w.fail(f"tower.inputs[{i}]", f"must be a distinct one of {', '.join(_TOWER_INPUTS)}, "
             f"got {name!r}")
  if ("blocks" in inputs) != (combine == "stacked"):
    w.fail("tower.inputs", "'blocks' is a tower input exactly when combine is 'stacked'")
  return {"dims": _int_list(w, "tower.dims", tower.get("dims", []), 1, allow_empty=True),
          "inputs": list(inputs)}


def _check_consistency(w: _Where, spec: dict) -> None:
  vector_dim = max(spec["embedding"]["dims"])
  first_order = any(b["type"] == "first_order" for b in spec["interactions"])
  if vector_dim + first_order < 1:
    w.fail("embedding.dims", "all 0 and no first_order block: the rows would be empty")
  for i, b in enumerate(spec["interactions"]):
    if BLOCK_TYPES[b["type"]].needs_vectors and vector_dim < 1:
      w.fail(f"interactions[{i}].type", f"{b['type']} needs field vectors, but embedding.dims "
             "are all 0")
  if spec["dense"]["bottom_mlp"] is not None and vector_dim < 1:
    w.fail("dense.bottom_mlp", "the bottom vector z has width max(embedding.dims) = 0")
  if spec["combine"] == "stacked" and not spec["interactions"]:
    w.fail("interactions", "a stacked model needs at least one block to feed its tower")


def spec_embedding_width(spec: Mapping[str, Any]) -> int:
  """E, the row width the spec's model reads: max dim, plus 1 with a first-order block."""
  spec = validate_spec(spec, "spec")
  first_order = any(b["type"] == "first_order" for b in spec["interactions"])
  return max(spec["embedding"]["dims"]) + int(first_order)


def spec_to_json(spec: Mapping[str, Any]) -> str:
  """Canonical compact JSON (validated, sorted keys): equal models give equal text."""
  return json.dumps(validate_spec(spec, "spec"), sort_keys=True, separators=(",", ":"))


def spec_from_json(text: str, field: str = "model.blocks") -> dict:
  """The validated canonical spec of JSON `text`; SpecError naming `field` otherwise."""
  if not isinstance(text, str):
    raise SpecError(f"{field}: must be JSON text, got {type(text).__name__} {text!r}")
  if not text.strip():
    raise SpecError(f"{field}: empty; expected a JSON block spec (see sfjax/models/block_spec.py)")
  try:
    data = json.loads(text)
  except (json.JSONDecodeError, RecursionError) as e:
    raise SpecError(f"{field}: not valid JSON: {e}") from None
  return validate_spec(data, field)


def as_spec(blocks: str | Mapping[str, Any], field: str = "model.blocks") -> dict:
  """A spec given as JSON text or as a mapping, validated and canonical."""
  return spec_from_json(blocks, field) if isinstance(blocks, str) else validate_spec(blocks, field)


def with_interaction_pairs(spec: Mapping[str, Any], pairs: Sequence[Sequence[int]]) -> dict:
  """`spec` with every pairwise block (fm, inner_product, gated_pairs) restricted to `pairs`.

  Args:
    spec: a block spec.
    pairs: field index pairs (i, j), i < j (e.g. AutoFIS's surviving pairs).

  Returns:
    The canonical spec; other blocks unchanged.
  """
  spec = validate_spec(spec, "spec")
  kept = _canonical_pairs([list(p) for p in pairs], _Where("with_interaction_pairs"))
  blocks = [{**b, "pairs": kept} if b["type"] in PAIRWISE_TYPES else b
            for b in spec["interactions"]]
  return validate_spec({**spec, "interactions": blocks}, "spec")
