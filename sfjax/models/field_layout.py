"""Where a generated model finds each field's vector and weight in the embedding rows.

The trainer's table has one row width E for every field. A generated model gives
each field group its own dimension d (mixed-dimension embeddings): a field of
dimension d uses the first d columns of its row, and when the model has a
first-order block the last column is the field value's weight (the convention of
the named models, `registry.embedding_width`). So

    E = max_f d_f + (1 if first-order else 0).

Fields are split into `len(dims)` contiguous groups (as `numpy.array_split`), so
`dims = [16]` is one dimension for all fields and `len(dims) == F` one per field.
Interaction blocks see the vectors zero-padded to D = max d (an inner product of a
d-dim and a d'-dim vector is the inner product of their common prefix); the tower
sees the unpadded concatenation `[B, sum_f d_f]`.

The sub-space of the embedding block (`embedding_space`) lives here, next to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from sfjax.automl.space import Categorical, Condition, Int, Param, Space

EMBEDDING_DIMS = (4, 8, 16)  # per-group dimensions searched (16: the trainer default's)
MAX_FIELD_GROUPS = 3  # field groups searched by default (F: one dim per field)


def field_dims(group_dims: Sequence[int], num_fields: int) -> tuple[int, ...]:
  """Each field's dimension: fields split into `len(group_dims)` contiguous groups.

  Args:
    group_dims: one dimension (>= 0) per field group.
    num_fields: F.

  Returns:
    (d_0, ..., d_{F-1}); the first groups take the extra fields when F does not divide.
  """
  groups = np.array_split(np.arange(num_fields), len(group_dims))
  out = np.zeros(num_fields, np.int64)
  for fields, dim in zip(groups, group_dims, strict=True):
    out[fields] = dim
  return tuple(int(d) for d in out)


class FieldLayout(NamedTuple):
  """Static description of the embedding rows one generated model reads.

  Attributes:
    dims: (d_0, ..., d_{F-1}) per-field vector dimensions.
    first_order: whether the last column of each row is a first-order weight.
  """

  dims: tuple[int, ...]
  first_order: bool

  @property
  def num_fields(self) -> int:
    """F."""
    return len(self.dims)

  @property
  def vector_dim(self) -> int:
    """D = max_f d_f, the width of the padded field vectors."""
    return max(self.dims)

  @property
  def flat_dim(self) -> int:
    """sum_f d_f, the width of the concatenated field vectors."""
    return sum(self.dims)

  @property
  def width(self) -> int:
    """E, the embedding row width: D plus the first-order column."""
    return self.vector_dim + int(self.first_order)

  def vectors(self, emb: jax.Array) -> jax.Array:
    """Field vectors `[B, F, D]`, columns past a field's own d zeroed."""
    vectors = emb[..., :self.vector_dim]
    if len(set(self.dims)) == 1:
      return vectors
    mask = np.arange(self.vector_dim)[None, :] < np.asarray(self.dims)[:, None]  # [F, D]
    return vectors * jnp.asarray(mask, vectors.dtype)

  def flat(self, emb: jax.Array) -> jax.Array:
    """Concatenated field vectors `[B, sum_f d_f]` (field-major, like a reshape)."""
    if len(set(self.dims)) == 1:
      return emb[..., :self.vector_dim].reshape(emb.shape[0], -1)
    return jnp.concatenate([emb[:, f, :d] for f, d in enumerate(self.dims)], axis=1)

  def weights(self, emb: jax.Array) -> jax.Array:
    """First-order weights `[B, F]` (the last column)."""
    return emb[..., -1]


class BlockInputs(NamedTuple):
  """What every interaction block reads (built once per call by the composed model).

  Attributes:
    vectors: [B, N, D] interaction vectors: the F field vectors, preceded by the
      dense features' bottom-MLP vector z when the model has one (N = F + 1, DLRM).
    x0: [B, sum_f d_f + Nd] the concatenated field vectors and dense features
      (the cross network's input).
    weights: [B, F] first-order weights, or None without a first-order column.
  """

  vectors: jax.Array
  x0: jax.Array
  weights: jax.Array | None


def embedding_space(dims: Sequence[int] = EMBEDDING_DIMS, max_groups: int = MAX_FIELD_GROUPS) -> Space:
  """The embedding block's sub-space: number of field groups and each group's dimension.

  Keys (relative): `num_groups` in [1, max_groups]; `group0.dim` .. always active,
  `group<k>.dim` active when `num_groups > k`.
  """
  params: dict[str, Param] = {"num_groups": Int(1, max_groups)}
  conditions: list[Condition] = []
  for k in range(max_groups):
    params[f"group{k}.dim"] = Categorical(tuple(dims))
    if k:
      conditions.append(Condition(f"group{k}.dim", "num_groups", "in",
                                  tuple(range(k + 1, max_groups + 1))))
  return Space(params, conditions)


def embedding_spec_from_config(section: Mapping[str, Any]) -> dict:
  """The spec's `embedding` entry from a point of `embedding_space` (relative keys)."""
  num_groups = int(section["num_groups"])
  return {"dims": [int(section[f"group{k}.dim"]) for k in range(num_groups)]}
