"""Checks shared by the CTR models: sizes, layer-width tuples and call inputs.

Every model is called as `model(emb, dense) -> logits` with `emb: [B, F, E]` and
`dense: [B, Nd]`. Shapes are static under `jax.jit`, so these checks run once at
trace time and cost nothing per step; a wrong shape fails with the model's name
and the expected layout instead of a broadcasting error deep inside a layer.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import jax
import numpy as np


def _is_int(value) -> bool:
  """True for Python and numpy integers (a sampled width may be np.int64), not bools."""
  return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_sizes(model_name: str, *, num_fields: int, embed_dim: int,
                num_dense: int) -> tuple[int, int, int]:
  """Returns (num_fields, embed_dim, num_dense) as Python ints.

  Raises:
    ValueError: unless num_fields >= 1, embed_dim >= 1 and num_dense >= 0.
  """
  return (as_count(model_name, "num_fields", num_fields, low=1),
          as_count(model_name, "model.embed_dim", embed_dim, low=1),
          as_count(model_name, "num_dense", num_dense, low=0))


def as_layer_dims(model_name: str, key: str, dims: Sequence[int], *,
                  allow_empty: bool = True) -> tuple[int, ...]:
  """Validates a tuple of layer widths (e.g. `model.mlp_dims`) and returns it as ints.

  Args:
    model_name: model name for the error message.
    key: config key for the error message, e.g. "model.mlp_dims".
    dims: a sequence of positive ints (a list from a JSON/CLI override is fine).
    allow_empty: whether `()` is accepted.

  Returns:
    The widths as a tuple of Python ints.
  """
  if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence):
    raise ValueError(f"{model_name}: {key} must be a sequence of positive ints, got {dims!r}")
  if any(not _is_int(d) or d < 1 for d in dims):
    raise ValueError(f"{model_name}: {key} must be a sequence of positive ints, got {dims!r}")
  if not dims and not allow_empty:
    raise ValueError(f"{model_name}: {key} must name at least one layer, got {dims!r}")
  return tuple(int(d) for d in dims)


def as_count(model_name: str, key: str, value: int, *, low: int) -> int:
  """Validates an int hyperparameter (e.g. `model.cross_layers`) that must be >= low."""
  if not _is_int(value) or value < low:
    raise ValueError(f"{model_name}: {key} must be an int >= {low}, got {value!r}")
  return int(value)


def check_inputs(model_name: str, emb: jax.Array, dense: jax.Array, *, num_fields: int,
                 width: int, num_dense: int) -> None:
  """Checks `emb: [B, num_fields, width]` and `dense: [B, num_dense]` (trace time).

  Raises:
    ValueError: naming the model, the expected layout and the shapes received.
  """
  if emb.ndim != 3 or tuple(emb.shape[1:]) != (num_fields, width):
    raise ValueError(f"{model_name}: emb must be [B, {num_fields}, {width}] (fields x embedding "
                     f"width), got shape {tuple(emb.shape)}")
  if dense.ndim != 2 or tuple(dense.shape) != (emb.shape[0], num_dense):
    raise ValueError(f"{model_name}: dense must be [{emb.shape[0]}, {num_dense}] (batch x dense "
                     f"features), got shape {tuple(dense.shape)}")


def split_first_order(emb: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Splits `[B, F, D+1]` rows into D-dim vectors and first-order weights.

  Convention (see `registry.embedding_width`): the last column of a row is the
  field value's first-order weight, the leading D columns its latent vector.

  Args:
    emb: [B, F, D+1] gathered embedding rows.

  Returns:
    (vectors [B, F, D], weights [B, F]).
  """
  return emb[..., :-1], emb[..., -1]
