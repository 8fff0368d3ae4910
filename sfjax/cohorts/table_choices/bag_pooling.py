"""The pooling of each bag as a traced per-trial hyperparameter (issue #22, Deliver 7).

A trial config may set `features.<name>.pooling` ('sum' | 'mean' | 'sqrtn') for each
multi_hot feature `<name>` of the data set's layout. The choice is not part of the
trial's `ArchSpec`: it is a dynamic hyperparameter (a code, `POOLING_CODES`), so trials
that differ only in their poolings share one vmapped program (one shape bucket).

Every pooling is a weighted sum with per-bag normalised weights, and the norm depends
on the weights alone (never on the embeddings):

  sum     w_i' = w_i
  mean    w_i' = w_i / sum_j w_j
  sqrtn   w_i' = w_i / sqrt(sum_j w_j^2)        (an empty bag keeps w' = 0)

so a trial's program rescales each bag's batch weights by its code
(`repool_weights`, a `select` over the three norms) and pools every bag by 'sum'
(`summed_spec`: the program's model). The gradient of a row is then exactly the
trainer's for that pooling (w_i' times the field's gradient); the forward differs
from the trainer's `sum(w e) / n` only by float rounding. A bag whose key a trial
does not set takes the data set's own pooling (`default_codes`). Sequences keep
their pooling (mean, or unpooled for DIN); one-hot features have nothing to pool.
The trainer reproduces a trial by `data.pooling` (`trainer_pooling`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data.types import DatasetSpec

POOLING_CODES = {name: float(i) for i, name in enumerate(fl.POOLINGS)}  # sum 0, mean 1, sqrtn 2
_KEY = re.compile(r"^features\.([^.]+)\.pooling$")


def pooling_key(feature: str) -> str:
  """The trial config key of feature `feature`'s pooling: `features.<feature>.pooling`."""
  return f"features.{feature}.pooling"


def pooled_feature(key: str) -> str | None:
  """The feature a pooling key names (`features.tags.pooling` -> 'tags'); None otherwise."""
  match = _KEY.match(str(key))
  return match.group(1) if match else None


def pooling_code(key: str, value: Any) -> float:
  """`value` of pooling key `key` (a pooling name, or its code) as its float code.

  Raises:
    ValueError: naming `key`, for anything but 'sum' | 'mean' | 'sqrtn' or 0 | 1 | 2.
  """
  if isinstance(value, str) and value in POOLING_CODES:
    return POOLING_CODES[value]
  if (not isinstance(value, (str, bool, np.bool_)) and isinstance(value, (int, float, np.number))
      and float(value) in POOLING_CODES.values()):
    return float(value)
  raise ValueError(f"config key {key!r}: must be one of {', '.join(fl.POOLINGS)}, got {value!r}")


def pooling_name(code: float) -> str:
  """The pooling name of code `code`."""
  return fl.POOLINGS[int(code)]


def multi_hot_features(spec: DatasetSpec) -> tuple[int, ...]:
  """Indices of the multi_hot features of `spec`'s layout (none without a layout)."""
  if spec.layout is None:
    return ()
  return tuple(i for i, f in enumerate(spec.layout.features) if f.kind == "multi_hot")


def default_codes(spec: DatasetSpec) -> dict[str, float]:
  """Pooling key -> the data set's own code, for every bag of `spec`."""
  if spec.layout is None:
    return {}
  features = spec.layout.features
  return {pooling_key(features[i].name): POOLING_CODES[features[i].pooling]
          for i in multi_hot_features(spec)}


def check_pooling_keys(spec: DatasetSpec, keys) -> None:
  """Raises ConfigError naming the first pooling key of `keys` that is not a bag of `spec`."""
  bags = default_codes(spec)
  for key in keys:
    if pooled_feature(key) is not None and key not in bags:
      names = ", ".join(str(pooled_feature(k)) for k in bags) or "none"
      raise ConfigError(f"config field {key}: {pooled_feature(key)!r} is not a multi_hot "
                        f"feature of the data set (its bags: {names})")


def summed_spec(spec: DatasetSpec) -> DatasetSpec:
  """`spec` with every bag pooled by 'sum' (the program's model; `repool_weights` norms)."""
  layout = spec.layout
  if layout is None or not multi_hot_features(spec):
    return spec
  features = tuple(dataclasses.replace(f, pooling="sum") if f.kind == "multi_hot" else f
                   for f in layout.features)
  return dataclasses.replace(spec, layout=dataclasses.replace(layout, features=features))


def repool_weights(spec: DatasetSpec, weights: jax.Array, codes: Mapping[str, Any]) -> jax.Array:
  """Per-id weights `[..., S]` with each bag's columns divided by its pooling's norm.

  Args:
    spec: the data set (its layout's bags).
    weights: `[..., S]` per-id weights (0 in padding columns).
    codes: pooling key -> code (a traced scalar, or a number); a bag without a key takes
      the data set's pooling.

  Returns:
    `[..., S]` weights whose 'sum' pooling is each bag's chosen pooling.
  """
  defaults = default_codes(spec)
  layout = spec.layout
  if not defaults or layout is None:
    return weights
  parts, start = [], 0
  for i in multi_hot_features(spec):
    cols = layout.columns(i)
    key = pooling_key(layout.features[i].name)
    if cols.start > start:
      parts.append(weights[..., start:cols.start])
    bag = weights[..., cols]  # [..., L]
    code = jnp.asarray(codes.get(key, defaults[key]))
    norm = jnp.where(code == POOLING_CODES["sum"], 1.0,
                     jnp.where(code == POOLING_CODES["mean"], jnp.sum(bag, axis=-1),
                               jnp.sqrt(jnp.sum(bag * bag, axis=-1))))
    safe = jnp.where(norm > 0, norm, 1.0)  # an empty bag pools to 0, as `pooling.pool_bag`
    parts.append(bag / safe[..., None])
    start = cols.stop
  if start < weights.shape[-1]:
    parts.append(weights[..., start:])
  return jnp.concatenate(parts, axis=-1)


def trainer_pooling(config: Mapping[str, Any]) -> str:
  """The trainer's `data.pooling` of a trial config: `'tags:mean,long0:sqrtn'` ('' if none)."""
  pairs = sorted((pooled_feature(k), pooling_name(pooling_code(k, v)))
                 for k, v in config.items() if pooled_feature(k) is not None)
  return ",".join(f"{name}:{pooling}" for name, pooling in pairs)
