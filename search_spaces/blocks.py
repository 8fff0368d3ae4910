"""The block space: generated CTR models composed from the blocks' own sub-spaces.

    space = block_space()                  # architecture (blocks) + hyperparameters
    baseline = default_config(space)       # the trainer's default DeepFM as a point
    dcn = preset_config("dcnv2", space)    # any named model as a point (its preset)
    runner_keys = runner_config(config)    # model.name='composed', model.blocks=<json>, embedding.*, optimizer.*
    run_search(config, workdir, BLOCK_SEARCH_SPACE)

Each block module declares its sub-space next to its code (DESIGN.md §4):
`field_layout.embedding_space` (field groups and their dims), every
`block_spec.BLOCK_TYPES[t].space()` (cross layers and rank, CIN maps, attention
heads, ...), `deep_blocks.tower_space` / `bottom_space`. This module nests them
under the keys `sfjax.models.generator.config_to_spec` reads (`model.<block>.use`
switches a block on, its sub-space is active only then), adds the combination
(`model.combine`: parallel | stacked) and takes the hyperparameter sub-spaces of
`search_spaces/ctr.py` unchanged. A point becomes a trial config through
`runner_config`: the generator's spec as canonical JSON in `model.blocks`.

The eight named models are presets, points of this space (`preset_config`): each point's
spec is the named model's (`generator.named_model_spec`). This is the default CTR space
(`search_spaces/default.py`); a search naming families searches `ctr.py`'s space instead.

Forbidden: a stacked model without a tower, and a stacked model with no block.

Architecture-aware asking (`bucket_fixed_keys`, `BLOCK_SEARCH_SPACE`): a round's
configs share the shape bucket of its first (`sfjax.cohorts.shape_buckets.bucket_blocks`),
so they may differ in the tower's depth and width, the cross layers, the dense
linear term and, in parallel combination, which interaction blocks they use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from search_spaces import ctr
from sfjax.automl.space import Bool, Categorical, Config, Space, SpaceError
from sfjax.cohorts import STATIC_KEYS
from sfjax.ctr_search import CTRSearchSpace
from sfjax.models import (
  BLOCK_TYPES,
  BLOCK_USE_KEY,
  COMBINES,
  COMPOSED_NAME,
  EMBEDDING_DIMS,
  MAX_FIELD_GROUPS,
  MODEL_NAMES,
  SpecError,
  bottom_space,
  config_to_spec,
  embedding_space,
  model_hparams,
  named_model_spec,
  spec_embedding_width,
  spec_to_config,
  spec_to_json,
  tower_space,
)
from sfjax.train import ctr_defaults

BLOCK_KINDS = tuple(BLOCK_TYPES)
TOWER_WIDTHS = ctr.MLP_WIDTHS  # includes the baseline's 400


def _use(prefix: str) -> str:
  return f"{prefix}.{BLOCK_USE_KEY}"


def architecture_space(tower_widths: Sequence[int] = TOWER_WIDTHS,
                       embed_dims: Sequence[int] = EMBEDDING_DIMS,
                       max_groups: int = MAX_FIELD_GROUPS) -> Space:
  """The generated models: embeddings, which blocks, their settings, combination, tower, dense.

  Args:
    tower_widths: the tower widths searched.
    embed_dims: the per-group embedding dimensions searched.
    max_groups: the most field groups (contiguous runs of fields, each its own dim); the
      number of fields F gives every field its own dim. With a feature layout (issue
      #22) the fields are the pooled features, in layout order (a bag is one field).
  """
  space = Space({"model.combine": Categorical(COMBINES),
                 "model.dense.linear": Bool()})
  space = space.nest("model.embedding", embedding_space(tuple(embed_dims), max_groups))
  for kind, cls in BLOCK_TYPES.items():
    prefix = f"model.{kind}"
    space = Space.compose(space, Space({_use(prefix): Bool()}))
    space = space.nest(prefix, cls.space(), when=(_use(prefix), "eq", True))
  for prefix, sub_space in (("model.tower", tower_space(widths=tuple(tower_widths))),
                            ("model.dense.bottom", bottom_space())):
    space = Space.compose(space, Space({_use(prefix): Bool()}))
    space = space.nest(prefix, sub_space, when=(_use(prefix), "eq", True))
  no_block = {_use(f"model.{kind}"): False for kind in BLOCK_KINDS}
  return space.with_forbidden({"model.combine": "stacked", _use("model.tower"): False},
                              {"model.combine": "stacked", **no_block})


def block_space(tower_widths: Sequence[int] = TOWER_WIDTHS,
                embed_dims: Sequence[int] = EMBEDDING_DIMS, max_groups: int = MAX_FIELD_GROUPS,
                poolings: Mapping[str, str] | None = None) -> Space:
  """`architecture_space` plus the row optimizer, the hyperparameters of `ctr.py` and the
  bags' poolings (`ctr.pooling_space`; none by default)."""
  return Space.compose(
      architecture_space(tower_widths, embed_dims, max_groups),
      Space({"embedding.optimizer": Categorical(ctr.EMBEDDING_OPTIMIZERS)}),
      ctr.hparam_space(), *([ctr.pooling_space(poolings)] if poolings else []))


# Named-model hyperparameters a preset takes where the trainer's default is no point of the
# space: DLRM's bottom MLP (64, 16) narrows to its last layer, and the space's bottom MLPs
# have equal widths (`deep_blocks.bottom_space`).
PRESET_HPARAMS: dict[str, dict[str, Any]] = {"dlrm": {"bottom_mlp_dims": (64, 64)}}
PRESETS = MODEL_NAMES  # the named models, each a point of the block space (`preset_config`)


def _trainer_hparams(name: str) -> dict[str, Any]:
  """Model `name`'s hyperparameters at the trainer's defaults (`sfjax/train/defaults.py`)."""
  model = ctr_defaults().model
  return {k: tuple(model[k]) if isinstance(model[k], (tuple, list)) else model[k]
          for k in model_hparams(name)}


def _point_of(space: Space, values: Mapping[str, Any]) -> Config:
  """The active keys of `values` as a validated point of `space` (parents before children)."""
  active: dict[str, Any] = {}
  changed = True
  while changed:  # add keys once their parents are in (conditions form a DAG)
    changed = False
    for key in space.keys:
      if key not in active and key in values and space.is_active(key, active):
        active[key] = values[key]
        changed = True
  return space.validate(active)


def preset_config(name: str, space: Space | None = None, **hparams: Any) -> Config:
  """Named model `name` as a point of the block space: its preset.

  `config_to_spec` of the point is `generator.named_model_spec(name, ...)` exactly, so a
  trial of the preset trains the named model's function (as `model.name=composed`); the
  optimizers and their hyperparameters are the trainer's defaults.

  Args:
    name: one of `PRESETS` (`sfjax.models.MODEL_NAMES`).
    space: the space the point must lie in (default: `block_space()`).
    **hparams: the named model's hyperparameters (`embed_dim`, `mlp_dims`, ...) over the
      trainer's defaults and `PRESET_HPARAMS`.

  Raises:
    SpaceError: an unknown name, or a setting the block space cannot express (naming it).
    ConfigError: naming the key whose value lies outside `space`.
  """
  if name not in PRESETS:
    raise SpaceError(f"preset {name!r}: not a named model (known: {', '.join(PRESETS)})")
  space = block_space() if space is None else space
  given = {**_trainer_hparams(name), **PRESET_HPARAMS.get(name, {}), **hparams}
  embed_dim = given.pop("embed_dim", ctr_defaults().model.embed_dim)
  try:
    spec = named_model_spec(name, embed_dim, **given)
    values = spec_to_config(spec, unused_dim=embed_dim)
  except (SpecError, ValueError) as e:
    raise SpaceError(f"preset {name!r}: {e}") from None
  values.update({k: v for k, v in ctr.default_config().items() if not k.startswith("model.")})
  values.update(ctr.baseline_poolings(space))
  point = _point_of(space, values)
  if config_to_spec(point) != spec:  # a space without one of its blocks' switches
    raise SpaceError(f"preset {name!r}: the space cannot express its blocks")
  return point


def default_config(space: Space | None = None) -> Config:
  """The trainer's default model (DeepFM) and optimizers as a point of `space` (its preset).

  Raises:
    ConfigError: naming the key whose default lies outside `space`.
  """
  return preset_config(ctr_defaults().model.name, space)


def runner_config(config: Mapping[str, Any]) -> dict[str, Any]:
  """The trial runner's keys: `model.name='composed'`, `model.blocks` (canonical JSON),
  `model.embed_dim` (the spec's row width) and the hyperparameters (gates made explicit).

  Raises:
    SpecError: the point is not a valid model (the trial then fails with this reason).
  """
  spec = config_to_spec(config)
  out = ctr.runner_config({k: v for k, v in config.items() if not k.startswith("model.")})
  out.update({"model.name": COMPOSED_NAME, "model.blocks": spec_to_json(spec),
              "model.embed_dim": spec_embedding_width(spec)})
  return out


# What a shape bucket of generated models masks (`padded_blocks.bucket_blocks`): free in a round.
MASKED_KEYS = ("model.tower.depth", "model.tower.width", "model.cross.layers",
               "model.dense.linear")


def bucket_fixed_keys(first: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, ...]:
  """The keys of `keys` to fix to `first`'s values so that new points share its bucket.

  Every `model.*` key and every other static key (`arch.STATIC_KEYS`, e.g. the row
  optimizer) is fixed except `MASKED_KEYS` and, when `first` is parallel, the
  `.use` of the blocks a superset can switch off: those without a sub-space (fm,
  inner_product, outer_product, gated_pairs), and those with one (cross, cin,
  self_attention) that `first` uses (their sub-keys stay fixed to `first`'s values,
  so a point using the block has the same entry; a point not using it has them
  inactive, and a fixing ignores them). A block with a sub-space that `first` does
  not use stays off, which bounds the superset. `first_order` stays fixed: it
  gives the rows their last column.
  """
  free = set(MASKED_KEYS)
  if first.get("model.combine") == "parallel":
    for kind, cls in BLOCK_TYPES.items():
      use = _use(f"model.{kind}")
      if kind != "first_order" and (not cls.space().keys or first.get(use, False)):
        free.add(use)
  return tuple(k for k in keys if k not in free
               and (k.startswith("model.") or k in STATIC_KEYS))


def space_from_config(space_cfg) -> Space:
  """`block_space` of a search config's `space` block (`mlp_widths`: the tower widths;
  `max_field_groups`: the most field groups; `poolings`: the bags searched, `ctr.py`)."""
  widths = ctr._int_list("space.mlp_widths", space_cfg.mlp_widths)  # pylint: disable=protected-access
  groups = space_cfg.get("max_field_groups", MAX_FIELD_GROUPS)
  if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
    raise SpaceError(f"space.max_field_groups: expected an integer >= 1, got {groups!r}")
  if ctr.table_dims_from_config(space_cfg):
    raise SpaceError("space.table_dims: the generated (composed) models set their dims per "
                     "field group (searched already); table dims need named families "
                     "(space.families)")
  return block_space(tower_widths=widths, max_groups=groups,
                     poolings=ctr.poolings_from_config(space_cfg))


# What `sfjax.ctr_search.search_loop.run_search` is given for a search over generated models.
BLOCK_SEARCH_SPACE = CTRSearchSpace(
    from_config=space_from_config, default_config=default_config,
    fixed_arch_space=ctr.fixed_arch_space, arch_part=ctr.arch_part, runner_config=runner_config,
    zero_allowed=frozenset(ctr.GATES.values()), bucket_fixed_keys=bucket_fixed_keys)
