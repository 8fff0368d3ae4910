"""A CTR trial config split into a static `ArchSpec` and dynamic hyperparameters.

DESIGN.md §4: everything that changes shapes or the compiled graph (model name,
sizes, row-optimizer kind) is static and hashable, so trials with equal
`ArchSpec`s share one compiled program; learning rates, weight decay, the
embedding L2 and the initial embedding scale are dynamic: stacked `[W]` arrays
that `jax.vmap` runs over (`sfjax.cohorts.cohort_runner`).

Config keys (dotted, as in `sfjax.automl.space.Config`) are the trainer config's own
paths (`sfjax/train/defaults.py`), so a trial config applies to a trainer config by
path; only the layer sizes are derived (`depth` x `width` -> a tuple of widths):

  static   model.name, model.embed_dim, model.mlp.depth, model.mlp.width
           (-> model.mlp_dims = (width,) * depth), model.cin.depth, model.cin.width
           (-> model.cin_dims), model.bottom_mlp.depth, model.bottom_mlp.width
           (-> model.bottom_mlp_dims), model.cross_layers, model.cross_rank,
           model.cross_structure, model.attention_layers, model.attention_heads,
           model.attention_dim, model.blocks (the `composed` model's block spec JSON),
           embedding.optimizer, optimizer.name
  dynamic  embedding.learning_rate, embedding.l2, embedding.init_stddev,
           optimizer.learning_rate, optimizer.weight_decay, and
           features.<bag>.pooling (sum | mean | sqrtn, kept as its code) for a multi_hot
           feature of the data set's layout (`sfjax.cohorts.table_choices.bag_pooling`, issue #22), and
           tables.<table>.dim (an integer <= model.embed_dim) for a table of the layout
           (`sfjax.cohorts.table_choices.table_dims`; refused for models without per-table dims)

A key of the old trial vocabulary (`optim.embedding_lr`, ...) is a ConfigError naming
its trainer path. Absent keys take the trainer's defaults. Only the model
hyperparameters the named model uses enter `ArchSpec.model_hparams`, so two
configs that differ in a key their model ignores share a cohort (likewise `lr`
ignores `model.embed_dim`, recorded as 1; `composed` takes its row width from
`model.blocks`, kept as canonical JSON so equal specs share a cohort).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from sfjax import models
from sfjax.cohorts.table_choices import bag_pooling, table_dims
from sfjax.core.errors import ConfigError
from sfjax.data.types import DatasetSpec
from sfjax.embedding import row_optimizers
from sfjax.models import generator
from sfjax.train import defaults as ctr_defaults_lib
from sfjax.train import optimizers

_CTR = ctr_defaults_lib.ctr_defaults()

# (depth key, width key) -> model keyword argument holding a tuple of layer widths.
_LAYER_KEYS = {
    "mlp_dims": ("model.mlp.depth", "model.mlp.width"),
    "cin_dims": ("model.cin.depth", "model.cin.width"),
    "bottom_mlp_dims": ("model.bottom_mlp.depth", "model.bottom_mlp.width"),
    "din_attention_dims": ("model.din_attention.depth", "model.din_attention.width"),
}
# Scalar model keyword arguments taken as they are: key -> (type, lowest value).
# Model keyword arguments that change only how the train step lays its work out, not the
# architecture or its results (`model.split_input`, issue #27): trials keep the default.
_STEP_LAYOUT_ARGS = frozenset({"split_input"})
_SCALAR_MODEL_KEYS: dict[str, int | None] = {  # kwarg -> lowest value of an int; None: a str
    "cross_layers": 0, "cross_rank": 0, "cross_structure": None,
    "attention_layers": 1, "attention_heads": 1, "attention_dim": 1, "blocks": None,
    "din_pooling": None,
}
_INT_LOW = {"model.embed_dim": 1, **{k: 0 for k, _ in _LAYER_KEYS.values()},
            **{k: 1 for _, k in _LAYER_KEYS.values()}}
_EMBEDDING_OPTIMIZERS = row_optimizers.ROW_OPTIMIZER_NAMES
DENSE_OPTIMIZERS = optimizers.DENSE_OPTIMIZER_NAMES

_EMBEDDING_OPTIMIZER_KEY, _DENSE_OPTIMIZER_KEY = "embedding.optimizer", "optimizer.name"


def _trainer_default(path: str) -> Any:
  """The trainer's default (`sfjax/train/defaults.py`) at dotted `path`."""
  node = _CTR
  for part in path.split("."):
    node = node[part]
  return node


# Dynamic keys -> (the trainer's default, lowest allowed value, whether the lowest is allowed).
DYNAMIC_DEFAULTS: dict[str, tuple[float, float, bool]] = {
    path: (float(_trainer_default(path)), 0.0, low_ok) for path, low_ok in (
        ("embedding.init_stddev", True), ("embedding.l2", True),
        ("embedding.learning_rate", False), ("optimizer.learning_rate", False),
        ("optimizer.weight_decay", True))}
DYNAMIC_KEYS: tuple[str, ...] = tuple(sorted(DYNAMIC_DEFAULTS))
STATIC_KEYS: tuple[str, ...] = tuple(sorted(
    {"model.name", "model.embed_dim", _EMBEDDING_OPTIMIZER_KEY, _DENSE_OPTIMIZER_KEY}
    | {k for pair in _LAYER_KEYS.values() for k in pair}
    | {f"model.{k}" for k in _SCALAR_MODEL_KEYS}))
# The old trial vocabulary -> its trainer path; used only to name the new key in an error.
# The two gates are the search spaces' Bools (`search_spaces/ctr.py`), not trainer fields.
_RENAMED_KEYS = {
    "optim.embedding_lr": "embedding.learning_rate", "optim.dense_lr": "optimizer.learning_rate",
    "optim.weight_decay": "optimizer.weight_decay", "optim.embedding_l2": "embedding.l2",
    "optim.init_stddev": "embedding.init_stddev", "optim.embedding_optimizer": "embedding.optimizer",
    "optim.dense_optimizer": "optimizer.name", "optim.use_weight_decay": "optimizer.use_weight_decay",
    "optim.use_embedding_l2": "embedding.use_l2"}


def check_not_renamed(keys: Iterable[str], where: str) -> None:
  """Refuses a key of the old trial vocabulary (`optim.*`) among `keys`.

  Args:
    keys: trial config or search space keys.
    where: what holds them, for the message (e.g. 'search space').

  Raises:
    ConfigError: naming the first old key and its trainer config path, e.g.
      `config field optim.dense_lr (trial config): renamed to optimizer.learning_rate`.
  """
  for key in keys:
    if key in _RENAMED_KEYS:
      raise ConfigError(f"config field {key} ({where}): renamed to {_RENAMED_KEYS[key]} "
                        "(trial keys are the trainer config's paths)")


@dataclasses.dataclass(frozen=True)
class ArchSpec:
  """Everything that fixes a trial's compiled program (hashable).

  Attributes:
    model_name: a registered model (`sfjax.models.ALL_MODEL_NAMES`).
    embed_dim: D (`model.embed_dim`).
    model_hparams: sorted ((keyword, value), ...) of the model's own keyword
      arguments, defaults filled in (layer widths as tuples).
    embedding_optimizer: row optimizer kind (`embedding.optimizer`, a name of
      `row_optimizers.ROW_OPTIMIZERS`).
    dense_optimizer: optax optimizer kind of the dense parameters (`optimizer.name`):
      adam | adamw | sgd | adagrad.
  """

  model_name: str
  embed_dim: int
  model_hparams: tuple[tuple[str, Any], ...]
  embedding_optimizer: str
  dense_optimizer: str = "adam"

  @property
  def embedding_width(self) -> int:
    """E, the width of the embedding rows this model reads."""
    return models.embedding_width(self.model_name, self.embed_dim)

  def build_model(self, spec: DatasetSpec, rngs: nnx.Rngs) -> nnx.Module:
    """The NNX model for data set `spec` (keys drawn from `rngs`).

    With a feature layout (`spec.layout`, issue #22) the model is the trainer's: the
    named model over the F pooled fields behind `models.pooling.PooledInput`, called
    as `model(emb [B, S, E], dense, weights [B, S])`.
    """
    return models.build_model_from_config(
        {"name": self.model_name, "embed_dim": self.embed_dim, **dict(self.model_hparams)},
        num_fields=spec.num_fields, num_dense=spec.num_dense, rngs=rngs, layout=spec.layout)

  def describe(self) -> str:
    """A short human-readable name, e.g. `deepfm/d4/mlp_dims=(16,)/adagrad+adam`."""
    parts = [self.model_name, f"d{self.embed_dim}"]
    # A block spec is long JSON: named by a short digest of its canonical text.
    parts += [f"{k}={v}" if k != "blocks" else f"blocks#{_digest(v)}"
              for k, v in self.model_hparams]
    return "/".join(parts + [f"{self.embedding_optimizer}+{self.dense_optimizer}"])


def _fail(key: str, reason: str):
  raise ValueError(f"config key {key!r}: {reason}")


def _as_int(key: str, value: Any, low: int) -> int:
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low:
    _fail(key, f"must be an integer >= {low}, got {value!r}")
  return int(value)


def _as_choice(key: str, value: Any, known: Sequence[str]) -> str:
  if value not in known:
    _fail(key, f"unknown value {value!r} (known: {', '.join(known)})")
  return str(value)


def dynamic_value(key: str, value: Any) -> float:
  """`value` of dynamic key `key` as a checked float.

  Raises:
    ValueError: naming `key`, for an unknown key, a non-number or a value out of range.
  """
  if bag_pooling.pooled_feature(key) is not None:
    return bag_pooling.pooling_code(key, value)
  if table_dims.dimmed_table(key) is not None:
    return table_dims.dim_value(key, value)
  if key not in DYNAMIC_DEFAULTS:
    check_not_renamed([key], "trial config")
    _fail(key, f"is not a dynamic hyperparameter (known: {', '.join(DYNAMIC_KEYS)})")
  _, low, low_ok = DYNAMIC_DEFAULTS[key]
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
    _fail(key, f"must be a number, got {value!r}")
  number = float(value)
  if not math.isfinite(number) or number < low or (number == low and not low_ok):
    _fail(key, f"must be a finite number {'>=' if low_ok else '>'} {low}, got {value!r}")
  return number


def resolve_hparams(hparams: Mapping[str, Any]) -> dict[str, float]:
  """Dynamic hyperparameters with every `DYNAMIC_KEYS` entry present (defaults filled); a
  bag's pooling key and a table's dim key are kept only when given (their defaults are
  the data set's)."""
  out = {k: d for k, (d, _, _) in DYNAMIC_DEFAULTS.items()}
  for key, value in hparams.items():
    out[key] = dynamic_value(key, value)
  return out


def _layers(config: Mapping[str, Any], kwarg: str) -> tuple[int, ...]:
  depth_key, width_key = _LAYER_KEYS[kwarg]
  default = tuple(getattr(_CTR.model, kwarg))
  if depth_key not in config and width_key not in config:
    return default
  depth = _as_int(depth_key, config.get(depth_key, len(default)), _INT_LOW[depth_key])
  width = _as_int(width_key, config.get(width_key, default[0] if default else 1), _INT_LOW[width_key])
  return (width,) * depth


def _digest(text: str) -> str:
  return hashlib.sha1(text.encode()).hexdigest()[:8]


def _composed_blocks(text: str) -> tuple[str, int]:
  """(canonical spec JSON, row width E) of `model.blocks`; ValueError naming the key."""
  try:
    spec = generator.spec_from_json(text, "model.blocks")
  except generator.SpecError as e:
    _fail("model.blocks", str(e))
  return generator.spec_to_json(spec), generator.spec_embedding_width(spec)


def split_config(config: Mapping[str, Any]) -> tuple[ArchSpec, dict[str, float]]:
  """Splits a trial config into its `ArchSpec` and its dynamic hyperparameters.

  Args:
    config: dotted key -> value (a `Config` or any mapping); see the module
      docstring for the keys.

  Returns:
    (arch, hparams): hparams maps every `DYNAMIC_KEYS` entry to a float.

  Raises:
    ValueError: naming the key, for an unknown key or a bad value (a ConfigError
      naming the new path for a key of the old `optim.*` vocabulary).
  """
  check_not_renamed(config, "trial config")
  for key in config:
    if key not in STATIC_KEYS and not _is_dynamic(key):
      _fail(key, f"unknown key (static: {', '.join(STATIC_KEYS)}; dynamic: "
                 f"{', '.join(DYNAMIC_KEYS)}, features.<bag>.pooling, tables.<table>.dim)")
  name = _as_choice("model.name", config.get("model.name", _CTR.model.name),
                    (*models.ALL_MODEL_NAMES, *models.SEQUENCE_MODEL_NAMES))
  embed_dim = _as_int("model.embed_dim", config.get("model.embed_dim", _CTR.model.embed_dim), 1)
  if name == "lr":  # LR reads one weight per row whatever embed_dim says: one cohort for all.
    embed_dim = 1
  used = models.model_hparams(name)
  hparams: dict[str, Any] = {}
  for kwarg in used:
    if kwarg in _STEP_LAYOUT_ARGS:
      continue
    if kwarg in _LAYER_KEYS:
      hparams[kwarg] = _layers(config, kwarg)
    elif kwarg in _SCALAR_MODEL_KEYS:
      key = f"model.{kwarg}"
      low = _SCALAR_MODEL_KEYS[kwarg]
      value = config.get(key, getattr(_CTR.model, kwarg))
      if low is not None:
        value = _as_int(key, value, low)
      elif not isinstance(value, str):
        _fail(key, f"must be a string, got {value!r}")
      hparams[kwarg] = value
    else:
      raise ValueError(f"model {name!r} takes hyperparameter {kwarg!r}, which "
                       "sfjax/cohorts/arch.py does not map from any config key")
  if "blocks" in hparams:
    hparams["blocks"], embed_dim = _composed_blocks(hparams["blocks"])
  table_dims.check_dims(config, name, models.latent_dim(name, embed_dim))
  arch = ArchSpec(
      model_name=name, embed_dim=embed_dim, model_hparams=tuple(sorted(hparams.items())),
      embedding_optimizer=_as_choice(_EMBEDDING_OPTIMIZER_KEY, config.get(
          _EMBEDDING_OPTIMIZER_KEY, _CTR.embedding.optimizer), _EMBEDDING_OPTIMIZERS),
      dense_optimizer=_as_choice(_DENSE_OPTIMIZER_KEY, config.get(
          _DENSE_OPTIMIZER_KEY, _CTR.optimizer.name), DENSE_OPTIMIZERS))
  return arch, resolve_hparams({k: v for k, v in config.items() if _is_dynamic(k)})


def _is_dynamic(key: str) -> bool:
  return (key in DYNAMIC_DEFAULTS or bag_pooling.pooled_feature(key) is not None
          or table_dims.dimmed_table(key) is not None)


def group_by_arch(configs: Sequence[Mapping[str, Any]]) -> dict[ArchSpec, list[int]]:
  """Indices of `configs` grouped by `ArchSpec`, in first-seen order (stable)."""
  groups: dict[ArchSpec, list[int]] = {}
  for index, config in enumerate(configs):
    groups.setdefault(split_config(config)[0], []).append(index)
  return groups


def count_params(arch: ArchSpec, spec: DatasetSpec) -> int:
  """Dense model parameters plus embedding table entries (rows * width E).

  Row-optimizer slots are not counted: they are training state, not the model.
  """
  abstract = nnx.eval_shape(lambda: arch.build_model(spec, nnx.Rngs(0)))
  dense = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nnx.state(abstract)))
  return dense + spec.total_rows * arch.embedding_width
