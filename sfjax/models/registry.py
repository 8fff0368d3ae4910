"""Model registry: names -> NNX model classes, built from `model.*` config keys.

    model = build_model_from_config(cfg.model, num_fields=F, num_dense=Nd, rngs=nnx.Rngs(0))
    width = embedding_width(cfg.model.name, cfg.model.embed_dim)  # embedding row width E
    model = build_model_from_config(cfg.model, ..., layout=spec.layout)  # bags, sequences

Each model takes the keyword hyperparameters it uses (`mlp_dims`, `cross_layers`,
...) and the builder drops those it does not, so one `model` config serves all
models. A key that no model knows is an error (a typo must not pass silently).
A sequence model (DIN) also takes the fields it reads from the data set's feature
layout (`cls.layout_args(layout)`), like the sizes: no config key names them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol

from flax import nnx

from sfjax.core import feature_layout, names
from sfjax.core.errors import ConfigError
from sfjax.core.feature_layout import FeatureLayout
from sfjax.models.autoint import AutoInt
from sfjax.models.behavior import pooling
from sfjax.models.behavior.din import DIN
from sfjax.models.composed import ComposedModel
from sfjax.models.dcnv2 import DCNv2
from sfjax.models.deepfm import DeepFM
from sfjax.models.dlrm import DLRM
from sfjax.models.fm import FM
from sfjax.models.gated_fm import GatedFM
from sfjax.models.group_interactions import GroupInteractions
from sfjax.models.lr import LR
from sfjax.models.validation import as_count
from sfjax.models.wide_deep import WideDeep
from sfjax.models.xdeepfm import XDeepFM


class ModelClass(Protocol):
  """A registered model class: built from keywords, with the row width it reads."""

  def __call__(self, *args: Any, **kwargs: Any) -> nnx.Module:
    """Builds the model from `num_fields`, `embed_dim`, `num_dense`, `rngs` and its hparams."""

  def embedding_width(self, embed_dim: int) -> int:
    """Width E of the embedding rows the model reads, given `model.embed_dim`."""


_MODELS: dict[str, ModelClass] = {
    "lr": LR,
    "fm": FM,
    "deepfm": DeepFM,
    "wide_deep": WideDeep,
    "dcnv2": DCNv2,
    "dlrm": DLRM,
    "autoint": AutoInt,
    "xdeepfm": XDeepFM,
    # The block-composable generator (models/generator.py): `blocks` is the spec's JSON.
    "composed": ComposedModel,
    # Structure-search models (sfjax.structure: AutoFIS, AutoGroup). They carry batch-norm
    # moments or a Gumbel stream (`make_train_step(..., model_variables=True)`): no config's
    # `model.name` names them.
    "gated_fm": GatedFM,
    "group_interactions": GroupInteractions,
    # Sequence models (issue #22): they read a behaviour sequence unpooled, so they need a
    # data set whose feature layout has a `sequence` feature (`cls.layout_args`).
    "din": DIN,
}
STRUCTURE_MODEL_NAMES: tuple[str, ...] = ("gated_fm", "group_interactions")
SEQUENCE_MODEL_NAMES: tuple[str, ...] = ("din",)
# The named models (each also one spec of the generator: `generator.named_model_spec`).
MODEL_NAMES: tuple[str, ...] = tuple(
    n for n in _MODELS
    if n != "composed" and n not in STRUCTURE_MODEL_NAMES and n not in SEQUENCE_MODEL_NAMES)
# The models any data set trains, built without a feature layout: the named models and
# `composed`. What a cohort trial's `model.name` accepts (`sfjax.cohorts.arch`: trials
# build their models without a layout, so no sequence model).
ALL_MODEL_NAMES: tuple[str, ...] = (*MODEL_NAMES, "composed")
# What the trainer's `model.name` accepts (`train.config_check`): those and the sequence
# models (the trainer passes the data set's layout).
TRAIN_MODEL_NAMES: tuple[str, ...] = (*ALL_MODEL_NAMES, *SEQUENCE_MODEL_NAMES)

_SIZE_ARGS = frozenset({"num_fields", "embed_dim", "num_dense", "rngs"})
# Constructor arguments a sequence model takes from the layout (`layout_args`), not a config.
_LAYOUT_ARGS = frozenset({"target_field", "sequence_field"})


def model_class(name: str) -> ModelClass:
  """The NNX class registered as `name`; ValueError naming `model.name` otherwise."""
  return names.lookup(_MODELS, name, "model.name", "model")


def model_parameters(name: str) -> Mapping[str, inspect.Parameter]:
  """The parameters of model `name`'s `__init__` (`self` included), with their defaults.

  Read from `__init__` itself: `inspect.signature(cls)` would show NNX's metaclass
  `__call__(*args, **kwargs)` instead.
  """
  return inspect.signature(inspect.getattr_static(model_class(name), "__init__")).parameters


def model_hparams(name: str) -> tuple[str, ...]:
  """The hyperparameter keys model `name` uses (its keyword arguments besides sizes)."""
  params = model_parameters(name)
  return tuple(p for p in params
               if p != "self" and p not in _SIZE_ARGS and p not in _LAYOUT_ARGS)


HPARAM_KEYS: tuple[str, ...] = tuple(sorted({k for n in _MODELS for k in model_hparams(n)}))


def embedding_width(name: str, embed_dim: int) -> int:
  """Width E of the embedding rows model `name` reads.

  `embed_dim + 1` for models with first-order terms (fm, deepfm, wide_deep,
  xdeepfm: the last column is the field value's weight), 1 for lr (the weight
  only), `embed_dim` otherwise (for `composed`, `model.embed_dim` is the row width
  of its blocks, `generator.spec_embedding_width`).
  """
  cls = model_class(name)
  return cls.embedding_width(as_count(name, "model.embed_dim", embed_dim, low=1))


def build_model(name: str, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
                layout: FeatureLayout | None = None, **hparams: Any) -> nnx.Module:
  """Builds model `name`; hyperparameters it does not use are ignored.

  Args:
    name: one of TRAIN_MODEL_NAMES (or a structure-search model).
    num_fields: F, the number of categorical fields.
    embed_dim: D (`model.embed_dim`); see `embedding_width` for the row width.
    num_dense: Nd, the number of dense features (may be 0).
    rngs: initialisation keys.
    layout: the data set's feature layout, which a sequence model reads the fields it
      attends over from (`layout_args`); required by SEQUENCE_MODEL_NAMES, unused by the
      others. The model is not wrapped (`build_model_from_config` pools).
    **hparams: `model.*` keys (`mlp_dims`, `cross_layers`, `cross_rank`,
      `cross_structure`, `bottom_mlp_dims`, `attention_layers`, `attention_heads`,
      `attention_dim`, `cin_dims`, `blocks`, `din_attention_dims`).

  Returns:
    The NNX module, called as `model(emb [B, F, E], dense [B, Nd]) -> logits [B]`.

  Raises:
    ValueError: unknown name, a key no model uses, or a bad value (a ConfigError
      naming `model.name` for a sequence model without a sequence in `layout`).
  """
  cls = model_class(name)
  unknown = sorted(set(hparams) - set(HPARAM_KEYS))
  if unknown:
    raise ValueError(f"unknown model hyperparameter(s) {', '.join('model.' + k for k in unknown)} "
                     f"(known: {', '.join(HPARAM_KEYS)})")
  used = {k: v for k, v in hparams.items() if k in model_hparams(name)}
  return cls(num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense, rngs=rngs,
             **used, **sequence_args(name, layout))


def build_model_from_config(model_cfg: Mapping[str, Any], *, num_fields: int, num_dense: int,
                            rngs: nnx.Rngs, layout: FeatureLayout | None = None) -> nnx.Module:
  """Builds the model described by the `model` ConfigDict (or a plain mapping).

  Args:
    model_cfg: `name`, `embed_dim` and hyperparameter keys (see `build_model`).
    num_fields: F.
    num_dense: Nd (may be 0).
    rngs: initialisation keys.
    layout: None, or the data set's feature layout (bags, sequences): the model is
      then wrapped in `pooling.PooledInput` and called as
      `model(emb [B, S, E], dense, weights [B, S])`.

  Returns:
    The NNX module.
  """
  cfg = dict(model_cfg.items())
  for key in ("name", "embed_dim"):
    if key not in cfg:
      raise ValueError(f"model config lacks model.{key} (got keys: {', '.join(sorted(cfg))})")
  name, embed_dim = cfg.pop("name"), cfg.pop("embed_dim")
  if layout is not None and num_fields != layout.num_features:
    raise ValueError(f"model of {num_fields} fields for a layout of {layout.num_features} features")
  model = build_model(name, num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense,
                      rngs=rngs, layout=layout, **cfg)
  return model if layout is None else pooling.PooledInput(
      model, layout, latent_dim=table_latent_dim(name, embed_dim, layout))


def latent_dim(name: str, embed_dim: int) -> int | None:
  """D = `embed_dim`, the latent columns leading model `name`'s rows (a first-order weight
  may follow them), for a model that can read a table through fewer of them (per-table
  dims); None for one whose rows are not such columns (lr, composed)."""
  width = embedding_width(name, embed_dim)
  # lr's row is its one weight (whatever embed_dim says); composed sets dims per field group.
  if name in ("lr", "composed") or width not in (embed_dim, embed_dim + 1):
    return None
  return int(embed_dim)


def table_latent_dim(name: str, embed_dim: int, layout: FeatureLayout | None) -> int | None:
  """D, the latent columns leading model `name`'s rows, when `layout` has a table of its
  own `dim` (`TableSpec.dim`); else None.

  Raises:
    ConfigError: naming the table's `dim`, for a model whose rows are not D latent
      columns (plus a first-order weight): lr and composed; or a dim above D.
  """
  dims = [] if layout is None else [t for t in layout.tables if t.dim]
  if layout is None or not dims:
    return None
  if latent_dim(name, embed_dim) is None:
    raise ConfigError(f"config field features.tables.{dims[0].name}.dim: model {name!r} has "
                      f"no per-table embedding dims (its rows are not model.embed_dim latent "
                      f"columns; a composed model sets dims per field group)")
  feature_layout.check_table_dims(layout, embed_dim)
  return int(embed_dim)


def sequence_args(name: str, layout: FeatureLayout | None) -> dict[str, Any]:
  """Layout-derived constructor arguments of a sequence model (none for the others).

  A model class with a `layout_args(layout)` static method gets its result (it raises a
  ConfigError naming `model.name` when `layout` is None or lacks what it reads).
  """
  maker = getattr(model_class(name), "layout_args", None)
  return {} if maker is None else dict(maker(layout))
