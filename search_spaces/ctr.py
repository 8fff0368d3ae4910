"""The CTR search space, composed from the sub-spaces of the model's parts.

    space = ctr_space()                         # every model family
    space = ctr_space(families=("fm", "dcnv2"))  # a sub-family search
    baseline = default_config(space)             # the trainer's default model
    runner_keys = runner_config(config)          # what `sfjax.cohorts.arch.split_config` reads
    pbt_space = fixed_arch_space(arch_part(baseline))  # one architecture's hyperparameters

Each searchable part declares its own sub-space, and `ctr_space` nests them under
their config prefixes with conditions (VEGA's search-space language, arXiv
2011.01507): the MLP keys are active only for models that have an MLP, the
interaction keys only for their family (cross network: dcnv2; self-attention:
autoint; CIN: xdeepfm). Keys are the trainer config's own paths (`model.*`,
`embedding.*`, `optimizer.*`; `sfjax/train/defaults.py`), so a point of the space is
a trial config (`sfjax.cohorts.arch`), which applies to a trainer config by path.

Regularisers are gated: `optimizer.use_weight_decay` / `embedding.use_l2` (search-only
Bools, not trainer fields) switch on a log-uniform strength, so "no regulariser" (the
trainer's default, 0.0, which no log-scale parameter contains) is part of the space.
`runner_config` turns the gates into explicit zeros and drops them.

Bags (issue #22): `ctr_space(poolings={"tags": "mean"})` adds `features.tags.pooling`
in {sum, mean, sqrtn} (a dynamic hyperparameter: trials that differ only in it share a
cohort, `sfjax.cohorts.table_choices.bag_pooling`); the baseline keeps the data set's pooling, given
beside each name. `ctr_space(table_dims={"item": (4, 8)})` adds `tables.item.dim` in
{0 (the model's dim: the baseline), 4, 8} (dynamic too, `sfjax.cohorts.table_choices.table_dims`: rows
stay `model.embed_dim` wide, whose choices narrower than a searched dim are dropped). The
per-field embedding dims of the `composed` model's field groups over a layout's pooled
fields are `search_spaces.blocks`. DIN (target attention over a
sequence feature) is a family when named (`families="deepfm,din"`; its activation unit
under `model.din_attention.depth/width`, its interest's pooling `model.din_pooling` in
{sum, mean, softmax}); the default families leave it out, because
it needs a data set with a sequence feature.

Ranges are sized for CPU trials (widths <= 256 plus the baseline's 400, depth <= 3,
embed_dim in {4, 8, 16}).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sfjax.automl.space import (
  Bool,
  Categorical,
  Condition,
  Config,
  Fixed,
  Float,
  Int,
  Space,
  SpaceError,
)
from sfjax.cohorts import check_not_renamed, dim_key, dimmed_table, pooled_feature, pooling_key
from sfjax.core import POOLINGS, ConfigError, named_entries
from sfjax.ctr_search import CTRSearchSpace
from sfjax.data import parse_poolings
from sfjax.embedding import ROW_OPTIMIZER_NAMES
from sfjax.models import DIN_POOLINGS, MODEL_NAMES, SEQUENCE_MODEL_NAMES, model_hparams
from sfjax.train import ctr_defaults

# Derived from the registries: a registered model or row optimizer is searchable.
FAMILIES = MODEL_NAMES
# Sequence models (DIN, issue #22) need a data set with a sequence feature: searched only
# when named (`ctr_space(families="deepfm,din")`), never by default.
SEQUENCE_FAMILIES = SEQUENCE_MODEL_NAMES
MLP_FAMILIES = tuple(name for name in FAMILIES + SEQUENCE_FAMILIES
                     if "mlp_dims" in model_hparams(name))
MLP_WIDTHS = (32, 64, 128, 256, 400)  # 400: the baseline's (the trainer default's) width
EMBEDDING_OPTIMIZERS = ROW_OPTIMIZER_NAMES
# Gate key -> the log-scale key it switches on; off means an explicit 0.0.
# The gates are search-only Bools: the trainer has no such fields.
GATES = {"optimizer.use_weight_decay": "optimizer.weight_decay",
         "embedding.use_l2": "embedding.l2"}


def mlp_space(max_depth: int = 3, widths: Sequence[int] = MLP_WIDTHS) -> Space:
  """The MLP tower: `depth` hidden layers of equal `width` (keys relative to the MLP)."""
  return Space({"depth": Int(1, max_depth), "width": Categorical(tuple(widths))})


def cross_space() -> Space:
  """DCNv2's cross network: layers, and rank of the cross matrices (0 = full rank)."""
  return Space({"cross_layers": Int(1, 3), "cross_rank": Categorical((0, 4, 8, 16))})


def attention_space() -> Space:
  """AutoInt's multi-head self-attention over fields: layers, heads, per-head width."""
  return Space({"attention_layers": Int(1, 3), "attention_heads": Categorical((1, 2, 4)),
                "attention_dim": Categorical((8, 16, 32))})


def cin_space() -> Space:
  """xDeepFM's compressed interaction network: `depth` layers of `width` feature maps."""
  return Space({"depth": Int(1, 3), "width": Categorical((16, 32, 64))})


def din_space() -> Space:
  """DIN (keys relative to `model`): its activation unit, `din_attention.depth` PReLU layers
  of `din_attention.width` over `[h, t, h - t, h * t]`, and `din_pooling`, the interest
  as the paper's weighted sum, a weighted mean or a softmax-weighted mix
  (`sfjax.models.DIN_POOLINGS`)."""
  return Space({"din_attention.depth": Int(1, 2),
                "din_attention.width": Categorical((16, 32, 80)),
                "din_pooling": Categorical(DIN_POOLINGS)})


# family -> (prefix under which its interaction sub-space lives, the sub-space factory)
INTERACTIONS = {"dcnv2": ("model", cross_space), "autoint": ("model", attention_space),
                "xdeepfm": ("model.cin", cin_space),
                "din": ("model", din_space)}


def embedding_hparam_space() -> Space:
  """The embedding rows' dynamic hyperparameters: learning rate, (gated) L2, init scale."""
  return Space(
      {"embedding.learning_rate": Float(1e-3, 0.5, log=True),
       "embedding.use_l2": Bool(),
       "embedding.l2": Float(1e-7, 1e-3, log=True),
       "embedding.init_stddev": Float(1e-3, 0.1, log=True)},
  ).with_conditions(_gate("embedding.use_l2"))


def embedding_space(embed_dims: Sequence[int] = (4, 8, 16)) -> Space:
  """The embedding tables: row width, row-wise optimizer and its hyperparameters.

  `embedding.l2` (log) is active only when `embedding.use_l2`.
  """
  return Space.compose(
      Space({"model.embed_dim": Categorical(tuple(embed_dims)),
             "embedding.optimizer": Categorical(EMBEDDING_OPTIMIZERS)}),
      embedding_hparam_space())


def optim_space() -> Space:
  """The dense parameters' optimizer: learning rate and (gated) weight decay, both log."""
  return Space(
      {"optimizer.learning_rate": Float(1e-4, 1e-2, log=True),
       "optimizer.use_weight_decay": Bool(),
       "optimizer.weight_decay": Float(1e-6, 1e-2, log=True)},
  ).with_conditions(_gate("optimizer.use_weight_decay"))


def hparam_space() -> Space:
  """Every dynamic hyperparameter (what a vmapped cohort stacks and PBT explores)."""
  return Space.compose(embedding_hparam_space(), optim_space())


def fixed_arch_space(arch_config: Mapping[str, Any]) -> Space:
  """`hparam_space()` around one architecture: its static keys become `Fixed` parameters.

  Args:
    arch_config: the static keys (`model.*`, `embedding.optimizer`) and values.

  Raises:
    SpaceError: `arch_config` holds a dynamic key.
    ConfigError: `arch_config` holds a key of the old `optim.*` vocabulary (naming
      its new path).
  """
  check_not_renamed(arch_config, "fixed architecture")
  dynamic = set(hparam_space().keys) | set(GATES.values())
  clash = sorted(set(arch_config) & dynamic)
  if clash:
    raise SpaceError(f"fixed_arch_space: {clash} are hyperparameters, not architecture keys")
  return Space.compose(Space({k: Fixed(v) for k, v in arch_config.items()}), hparam_space())


def arch_part(config: Mapping[str, Any]) -> dict[str, Any]:
  """The static (architecture) keys of a point of `ctr_space`."""
  dynamic = set(hparam_space().keys)
  return {k: v for k, v in config.items() if k not in dynamic}


def pooling_space(poolings: Mapping[str, str]) -> Space:
  """`features.<bag>.pooling` in {sum, mean, sqrtn} for each named bag (issue #22), its
  baseline pooling (the data set's) the first choice.

  Raises:
    SpaceError: a baseline pooling that is not one of them.
  """
  for name, pooling in poolings.items():
    if pooling not in POOLINGS:
      raise SpaceError(f"space.poolings: {name}: baseline pooling must be one of "
                       f"{', '.join(POOLINGS)}, got {pooling!r}")
  # The baseline's pooling first: `default_config` reads it there.
  return Space({pooling_key(name): Categorical((pooling,) + tuple(p for p in POOLINGS
                                                                  if p != pooling))
                for name, pooling in poolings.items()})


def table_dim_space(table_dims: Mapping[str, Sequence[int]]) -> Space:
  """`tables.<table>.dim` for each named table (issue #22): 0 (the model's dim, every
  latent column: the baseline, first) or one of its given dims.

  A dynamic hyperparameter (`sfjax.cohorts.table_choices.table_dims`): trials that differ only in their
  dims share a cohort; rows stay `model.embed_dim` wide.

  Raises:
    SpaceError: a table without dims, or a dim below 1.
  """
  out = {}
  for name, dims in table_dims.items():
    dims = tuple(sorted({int(d) for d in dims}))
    if not dims or dims[0] < 1:
      raise SpaceError(f"space.table_dims: {name}: expected dims >= 1, got {list(dims)}")
    out[dim_key(name)] = Categorical((0,) + dims)
  return Space(out)


def table_dims_from_config(space_cfg) -> dict[str, tuple[int, ...]]:
  """`space.table_dims` (`'item:4|8,user:2|4'`: each table's dims) as a dict.

  Raises:
    SpaceError: naming `space.table_dims`, for an entry that is not `table:d|d|...` with
      integers >= 1, or a table named twice.
  """
  out: dict[str, tuple[int, ...]] = {}
  try:
    entries = named_entries(space_cfg.get("table_dims", "") or "", "space.table_dims",
                            form="table:d|d|...", kind="table")
  except ConfigError as e:
    raise SpaceError(str(e).replace("config field ", "")) from None
  for name, rest in entries:
    try:
      dims = tuple(int(d) for d in rest.split("|"))
    except ValueError:
      dims = ()
    if not dims or min(dims) < 1:
      raise SpaceError(f"space.table_dims: {name}: {rest!r} is not dims 'd|d|...' "
                       f"(integers >= 1)")
    out[name] = dims
  return out


def baseline_poolings(space: Space) -> dict[str, str]:
  """Pooling key -> the baseline's pooling (the first choice) of each bag `space` searches."""
  return {k: space[k].choices[0] for k in space.keys if pooled_feature(k) is not None}


def poolings_from_config(space_cfg) -> dict[str, str]:
  """`space.poolings` (`bag:baseline` entries, the trainer's `data.pooling` syntax) as a dict.

  Raises:
    SpaceError: naming `space.poolings`, for a bad entry.
  """
  try:
    return parse_poolings(space_cfg.get("poolings", ""))
  except ConfigError as e:
    raise SpaceError(str(e).replace("data.pooling", "space.poolings")) from None


def _wide_enough(embedding: Space, table_dims: Mapping[str, Sequence[int]]) -> Space:
  """`embedding` whose `model.embed_dim` choices are those >= every searched table dim.

  Raises:
    SpaceError: no choice is that wide.
  """
  widest = max(int(d) for dims in table_dims.values() for d in dims)
  choices = tuple(d for d in embedding["model.embed_dim"].choices if d >= widest)
  if not choices:
    raise SpaceError(f"space.table_dims: a dim of {widest} is above every model.embed_dim "
                     f"choice {embedding['model.embed_dim'].choices}")
  return Space({**{k: embedding[k] for k in embedding.keys},
                "model.embed_dim": Categorical(choices)}).with_conditions(*embedding.conditions)


def _gate(gate: str) -> Condition:
  return Condition(GATES[gate], gate, "eq", True)


def ctr_space(families: Sequence[str] | str = FAMILIES,
              mlp_widths: Sequence[int] = MLP_WIDTHS,
              poolings: Mapping[str, str] | None = None,
              table_dims: Mapping[str, Sequence[int]] | None = None) -> Space:
  """The joint architecture + hyperparameter space over `families`.

  Args:
    families: model names (a subset of `FAMILIES` and `SEQUENCE_FAMILIES`, or a
      comma-separated string), the choices of `model.name`.
    mlp_widths: the MLP widths searched (smaller on CPU; the default includes the
      baseline's 400).
    poolings: bag name -> its baseline pooling, for the bags whose pooling is searched
      (`pooling_space`); none by default.
    table_dims: table name -> its dims, for the tables whose embedding dim is searched
      (`table_dim_space`; 0, the model's, is the baseline); none by default. The rows'
      width `model.embed_dim` then takes only choices >= every dim searched.

  Returns:
    `model.name`, the embedding and optimizer sub-spaces, the MLP sub-space under
    `model.mlp` (active for the MLP families present) and each present family's
    interaction sub-space (active only for it). `model.embed_dim` is inactive for
    `lr`, whose rows are a single weight.

  Raises:
    SpaceError: an unknown, repeated or empty family list.
  """
  families = _check_families(families)
  embedding = embedding_space()
  if table_dims:
    embedding = _wide_enough(embedding, table_dims)
  space = Space.compose(Space({"model.name": Categorical(families)}), embedding,
                        optim_space(), *([pooling_space(poolings)] if poolings else []),
                        *([table_dim_space(table_dims)] if table_dims else []))
  if "lr" in families:
    space = space.with_conditions(Condition("model.embed_dim", "model.name", "ne", "lr"))
  with_mlp = tuple(f for f in families if f in MLP_FAMILIES)
  if with_mlp:
    space = space.nest("model.mlp", mlp_space(widths=mlp_widths),
                       when=("model.name", "in", with_mlp))
  for family, (prefix, sub_space) in INTERACTIONS.items():
    if family in families:
      space = space.nest(prefix, sub_space(), when=("model.name", "eq", family))
  return space


def _check_families(families: Sequence[str]) -> tuple[str, ...]:
  if isinstance(families, str):
    families = tuple(f.strip() for f in families.split(",") if f.strip())
  families = tuple(families)
  known = FAMILIES + SEQUENCE_FAMILIES
  unknown = [f for f in families if f not in known]
  if unknown or not families or len(set(families)) != len(families):
    raise SpaceError(f"ctr_space families {families!r}: need distinct names from {known}"
                     + (f"; unknown: {unknown}" if unknown else ""))
  return families


def default_config(space: Space | None = None) -> Config:
  """The baseline: the trainer's default model and optimizers as a point of `space`.

  Args:
    space: the space to validate against (default: `ctr_space()`).

  Returns:
    The default model (DeepFM, 3 x 400 MLP, 16-dim rows, Adagrad 0.05, dense Adam
    1e-3, no regularisers) as a config of `space`, inactive keys left out.

  Raises:
    ConfigError: naming the key whose default lies outside `space` (or is inactive
      there, e.g. a family the space leaves out).
  """
  space = ctr_space() if space is None else space
  c = ctr_defaults()
  mlp_dims = tuple(c.model.mlp_dims)
  cin_dims = tuple(c.model.cin_dims)
  for key, dims in (("model.mlp_dims", mlp_dims), ("model.cin_dims", cin_dims)):
    if not dims or len(set(dims)) != 1:
      raise SpaceError(f"sfjax/train/defaults.py: {key} = {dims} is not `depth` equal "
                       "widths, so the space cannot express it")
  values = {
      "model.name": c.model.name, "model.embed_dim": c.model.embed_dim,
      "model.mlp.depth": len(mlp_dims), "model.mlp.width": mlp_dims[0],
      "model.cross_layers": c.model.cross_layers, "model.cross_rank": c.model.cross_rank,
      "model.attention_layers": c.model.attention_layers,
      "model.attention_heads": c.model.attention_heads,
      "model.attention_dim": c.model.attention_dim,
      "model.cin.depth": len(cin_dims), "model.cin.width": cin_dims[0],
      "embedding.optimizer": c.embedding.optimizer,
      "embedding.learning_rate": c.embedding.learning_rate,
      "embedding.use_l2": c.embedding.l2 > 0, "embedding.l2": c.embedding.l2,
      "embedding.init_stddev": c.embedding.init_stddev,
      "optimizer.learning_rate": c.optimizer.learning_rate,
      "optimizer.use_weight_decay": c.optimizer.weight_decay > 0,
      "optimizer.weight_decay": c.optimizer.weight_decay,
  }
  values.update(baseline_poolings(space))
  values.update({k: 0 for k in space.keys if dimmed_table(k) is not None})  # every column
  active = {}
  for key in _parents_first(space):
    if key in values and space.is_active(key, active):
      active[key] = values[key]
  return space.validate(active)


def _parents_first(space: Space) -> list[str]:
  """Keys ordered so every condition's parent precedes its child."""
  order, seen = [], set()

  def visit(key):
    if key in seen:
      return
    seen.add(key)
    for c in space.conditions:
      if c.child == key:
        visit(c.parent)
    order.append(key)

  for key in space.keys:
    visit(key)
  return order


def runner_config(config: Mapping[str, Any]) -> dict[str, Any]:
  """The trial runner's keys for a point of the space: gates become explicit values.

  A gate that is off sets its strength to 0.0; the gate keys themselves are
  dropped. Every other key passes through unchanged.
  """
  out = {k: v for k, v in config.items() if k not in GATES}
  for gate, key in GATES.items():
    if gate in config and not config[gate]:
      out[key] = 0.0
  return out


def _int_list(field: str, text: Any) -> tuple[int, ...]:
  try:
    values = tuple(int(v) for v in str(text).split(",") if v.strip())
  except ValueError:
    values = ()
  if not values or min(values) < 1:
    raise SpaceError(f"{field}: expected comma-separated positive integers, got {text!r}")
  return values


def space_from_config(space_cfg) -> Space:
  """`ctr_space` of a search config's `space` block (`families`, `mlp_widths`: comma lists;
  `poolings`: `bag:baseline` entries, the trainer's `data.pooling` syntax; `table_dims`:
  `table:d|d` entries)."""
  return ctr_space(space_cfg.families, _int_list("space.mlp_widths", space_cfg.mlp_widths),
                   poolings_from_config(space_cfg), table_dims_from_config(space_cfg))


# What `sfjax.ctr_search.search_loop.run_search` is given (experiments/search.py passes it).
SEARCH_SPACE = CTRSearchSpace(
    from_config=space_from_config, default_config=default_config,
    fixed_arch_space=fixed_arch_space, arch_part=arch_part, runner_config=runner_config,
    zero_allowed=frozenset(GATES.values()))
