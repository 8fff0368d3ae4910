"""The block-composable CTR model generator (VEGA-style; DESIGN.md §4).

    spec = named_model_spec("deepfm", embed_dim=16, mlp_dims=(400, 400, 400))
    model = build_from_spec(spec, num_fields=F, num_dense=Nd, rngs=nnx.Rngs(0))
    text = spec_to_json(spec)            # what --config.model.blocks carries (model `composed`)
    spec = with_interaction_pairs(spec, [(0, 3), (2, 5)])   # e.g. AutoFIS's kept pairs
    spec = config_to_spec(point)          # a point of the block space (search_spaces/blocks.py)

Every named model (`MODEL_NAMES`) is one spec: `named_model_spec` gives it, and the
generated model has the named model's parameters (up to their names) and computes
the same function (tests/models/generator_test.py).

Keys of a point of the block space (`config_to_spec`), each block's own sub-space
nested under its prefix:
  model.embedding.*            field_layout.embedding_space (groups and their dims)
  model.<block type>.use       Bool, one per `BLOCK_TYPES` entry, then its `space()` keys
  model.combine                parallel | stacked
  model.tower.use              Bool; model.tower.{depth, width} (deep_blocks.tower_space)
  model.dense.linear           Bool, the `dense @ w` term
  model.dense.bottom.use       Bool; model.dense.bottom.{depth, width} (deep_blocks.bottom_space)
The scalar bias is there exactly when there is no tower (the tower's output bias
plays its part otherwise, as in the named models). Keys outside `model.` are ignored.
A point whose model reads no field vectors (only a first-order block, no tower over the
embeddings, no cross network, no bottom MLP) stores none: its embedding dims are [0]
whatever the groups say, so LR is a point (rows of one weight, as the named model's).
`spec_to_config` is the inverse: the point of a spec the space can express (the named
models' presets, `search_spaces/blocks.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flax import nnx

from sfjax.models import deep_blocks, field_layout, pair_blocks, registry
from sfjax.models.block_spec import (
  BLOCK_TYPES,
  COMBINES,
  PAIRWISE_TYPES,
  SpecError,
  spec_embedding_width,
  spec_from_json,
  spec_to_json,
  validate_spec,
  with_interaction_pairs,
)
from sfjax.models.composed import NAME as COMPOSED_NAME
from sfjax.models.composed import ComposedModel

__all__ = [
    "BLOCK_TYPES", "COMBINES", "COMPOSED_NAME", "PAIRWISE_TYPES", "SpecError", "BLOCK_USE_KEY",
    "build_from_spec", "config_to_spec", "named_model_spec", "spec_embedding_width",
    "spec_to_config",
    "spec_from_json", "spec_to_json", "validate_spec", "with_interaction_pairs",
]

BLOCK_USE_KEY = "use"  # the Bool key switching a block on: model.<block>.use


def _hparams(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
  """The named model's keyword hyperparameters: its defaults, overridden by `given`."""
  params = registry.model_parameters(name)
  unknown = sorted(set(given) - set(registry.HPARAM_KEYS))
  if unknown:
    raise ValueError(f"named_model_spec: unknown model hyperparameter(s) {unknown} "
                     f"(known: {', '.join(registry.HPARAM_KEYS)})")
  used = registry.model_hparams(name)
  return {k: given.get(k, params[k].default) for k in used}


def _deep_tower(dims) -> dict:
  """A tower spec: an MLP of hidden widths `dims` over the embeddings and dense features."""
  return {"dims": list(dims), "inputs": ["embeddings", "dense"]}


def named_model_spec(name: str, embed_dim: int, **hparams: Any) -> dict:
  """The block spec that is exactly the named model.

  Args:
    name: one of `sfjax.models.MODEL_NAMES` except `composed`.
    embed_dim: D (`model.embed_dim`); ignored by `lr`, whose rows are one weight.
    **hparams: the model's keyword hyperparameters as `build_model` takes them;
      keys other models use are ignored, unknown keys raise.

  Returns:
    The canonical spec (`build_from_spec` builds the named model's function).

  Raises:
    ValueError: an unknown name or hyperparameter.
  """
  if name not in registry.MODEL_NAMES:
    raise ValueError(f"named_model_spec: model.name {name!r} is not a named model "
                     f"(known: {', '.join(registry.MODEL_NAMES)})")
  hp = _hparams(name, hparams)
  wide = [{"type": "first_order"}]
  spec: dict[str, Any] = {"embedding": {"dims": [embed_dim]}, "interactions": [],
                          "dense": {"linear": True, "bottom_mlp": None}}
  if name == "lr":
    spec.update(embedding={"dims": [0]}, bias=True, interactions=wide)
  elif name == "fm":
    spec.update(bias=True, interactions=wide + [{"type": "fm"}])
  elif name == "deepfm":
    spec.update(interactions=wide + [{"type": "fm"}], tower=_deep_tower(hp["mlp_dims"]))
  elif name == "wide_deep":
    spec.update(interactions=wide, tower=_deep_tower(hp["mlp_dims"]))
  elif name == "dcnv2":
    cross = {"type": "cross", "layers": hp["cross_layers"], "rank": hp["cross_rank"]}
    stacked = hp["cross_structure"] == "stacked"
    spec.update(interactions=[cross], combine="stacked" if stacked else "parallel",
                tower={"dims": list(hp["mlp_dims"]), "inputs": ["blocks"]} if stacked
                else _deep_tower(hp["mlp_dims"]))
  elif name == "xdeepfm":
    spec.update(interactions=wide + [{"type": "cin", "layer_dims": list(hp["cin_dims"])}],
                tower=_deep_tower(hp["mlp_dims"]))
  elif name == "autoint":
    spec.update(interactions=[{"type": "self_attention", "layers": hp["attention_layers"],
                               "heads": hp["attention_heads"], "head_dim": hp["attention_dim"]}],
                tower=_deep_tower(hp["mlp_dims"]))
  elif name == "dlrm":
    spec.update(dense={"linear": False, "bottom_mlp": list(hp["bottom_mlp_dims"])},
                interactions=[{"type": "inner_product"}], combine="stacked",
                tower={"dims": list(hp["mlp_dims"]), "inputs": ["bottom", "blocks"]})
  else:
    raise ValueError(f"named_model_spec: model {name!r} has no block spec yet; add it here")
  return validate_spec(spec, f"named_model_spec({name!r})")


def build_from_spec(spec: Mapping[str, Any], num_fields: int, num_dense: int,
                    rngs: nnx.Rngs) -> nnx.Module:
  """The generated model, called as `model(emb [B, F, E], dense [B, Nd]) -> logits [B]`.

  E is `spec_embedding_width(spec)`.
  """
  return ComposedModel(num_fields=num_fields, embed_dim=spec_embedding_width(spec),
                       num_dense=num_dense, rngs=rngs, blocks=spec)


def _section(config: Mapping[str, Any], prefix: str) -> dict[str, Any]:
  head = prefix + "."
  return {k[len(head):]: v for k, v in config.items() if k.startswith(head)}


def config_to_spec(config: Mapping[str, Any]) -> dict:
  """The spec of a point of the block space (dotted keys; see the module docstring).

  Raises:
    SpecError: an unknown `model.*` key, a missing one, or a point whose spec is invalid.
  """
  model = _section(config, "model")
  known = ("embedding.", "dense.", "tower.", "combine") + tuple(f"{t}." for t in BLOCK_TYPES)
  for key in model:
    if not key.startswith(known):
      raise SpecError(f"config_to_spec: unknown key 'model.{key}' (known prefixes: "
                      f"{', '.join('model.' + k for k in known)})")
  try:
    embedding = field_layout.embedding_spec_from_config(_section(model, "embedding"))
    blocks = []
    for kind, cls in BLOCK_TYPES.items():
      section = _section(model, kind)
      if section.get(BLOCK_USE_KEY, False):
        blocks.append({"type": kind, **cls.spec_from_config(section)})
    combine = model.get("combine", "parallel")
    bottom = _section(model, "dense.bottom")
    has_bottom = bool(bottom.get(BLOCK_USE_KEY, False))
    tower = None
    tower_section = _section(model, "tower")
    if tower_section.get(BLOCK_USE_KEY, False):
      extra = ["bottom"] if has_bottom else []
      inputs = (["embeddings", "dense"] + extra if combine == "parallel"
                else extra + ["blocks"])
      tower = {"dims": deep_blocks.layer_dims_from_config(tower_section), "inputs": inputs}
    if any(b["type"] == "first_order" for b in blocks) and not _reads_vectors(
        blocks, tower, has_bottom):
      embedding = {"dims": [0]}  # nothing reads a field vector: rows of one weight (LR)
    spec = {"embedding": embedding, "interactions": blocks, "combine": combine, "tower": tower,
            "bias": tower is None,
            "dense": {"linear": bool(model.get("dense.linear", True)),
                      "bottom_mlp": deep_blocks.layer_dims_from_config(bottom)
                                    if has_bottom else None}}
  except KeyError as e:
    raise SpecError(f"config_to_spec: a point lacks key {e.args[0]!r} of an active section "
                    "(model.embedding, model.<block>, model.tower or model.dense.bottom)") from None
  return validate_spec(spec, "config_to_spec")


def _reads_vectors(blocks, tower: Mapping[str, Any] | None, has_bottom: bool) -> bool:
  """Whether a model with these blocks, tower and bottom MLP reads any field vector."""
  return (has_bottom or (tower is not None and "embeddings" in tower["inputs"])
          or any(BLOCK_TYPES[b["type"]].needs_vectors or b["type"] == "cross" for b in blocks))


def _layers_section(dims, key: str) -> dict[str, Any]:
  """`{depth, width}` of equal-width layers `dims` (`deep_blocks.layer_dims_from_config`)."""
  if len(set(dims)) > 1:
    raise SpecError(f"spec_to_config: {key} {list(dims)} are not equal widths (the block "
                    "space's layers are `depth` x `width`)")
  return {"depth": len(dims), "width": dims[0] if dims else 16}  # width of no layer: inert


def _block_section(block: Mapping[str, Any]) -> dict[str, Any]:
  """A block's keys in the space (relative), checked by the block's own `spec_from_config`."""
  cls = BLOCK_TYPES[block["type"]]
  section: dict[str, Any] = {}
  for name, (kind, _) in cls.PARAMS.items():
    if kind == pair_blocks.PAIRS:
      if block[name] is not None:
        raise SpecError(f"spec_to_config: {block['type']}.{name}: the block space searches "
                        "no explicit field pairs")
    elif kind == pair_blocks.DIMS:
      section.update(_layers_section(block[name], f"{block['type']}.{name}"))
    else:
      section[name] = block[name]
  params = {k: v for k, v in block.items() if k != "type"}
  if cls.spec_from_config(section) != {k: v for k, v in params.items() if v is not None}:
    raise SpecError(f"spec_to_config: {block['type']} {params} is not a point of its sub-space")
  return section


def spec_to_config(spec: Mapping[str, Any], unused_dim: int) -> dict[str, Any]:
  """The block-space point (dotted `model.*` keys) whose `config_to_spec` is `spec`.

  Args:
    spec: a block spec (validated here).
    unused_dim: the group dim given to a spec whose model reads no vectors (dims [0],
      e.g. LR): `config_to_spec` ignores it.

  Returns:
    `model.*` keys only; which of them a space holds (and their ranges) is the space's.

  Raises:
    SpecError: the spec is not expressible in the block space (explicit pairs, gates,
      unequal layer widths, a repeated block type, custom tower inputs).
  """
  spec = validate_spec(spec, "spec_to_config")
  dims = spec["embedding"]["dims"]
  if dims == [0]:
    dims = [unused_dim]
  out: dict[str, Any] = {"model.embedding.num_groups": len(dims),
                         **{f"model.embedding.group{k}.dim": d for k, d in enumerate(dims)},
                         "model.combine": spec["combine"],
                         "model.dense.linear": spec["dense"]["linear"]}
  types = [b["type"] for b in spec["interactions"]]
  for kind in BLOCK_TYPES:
    out[f"model.{kind}.{BLOCK_USE_KEY}"] = kind in types
  for block in spec["interactions"]:
    out.update({f"model.{block['type']}.{k}": v for k, v in _block_section(block).items()})
  for prefix, dims_of in (("model.tower", spec["tower"] and spec["tower"]["dims"]),
                          ("model.dense.bottom", spec["dense"]["bottom_mlp"])):
    out[f"{prefix}.{BLOCK_USE_KEY}"] = dims_of is not None
    if dims_of is not None:
      out.update({f"{prefix}.{k}": v for k, v in _layers_section(dims_of, prefix).items()})
  if config_to_spec(out) != spec:
    raise SpecError(f"spec_to_config: {spec_to_json(spec)} is not a point of the block space "
                    "(gates, a repeated block type, block order or tower inputs differ)")
  return out
