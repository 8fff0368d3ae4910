"""Shallow interaction blocks: first-order, FM, inner product, outer product, gated pairs.

Every interaction block of a generated model (`composed.ComposedModel`) is an NNX
module built from its spec entry's parameters and a `BlockShape`, called on the
shared `field_layout.BlockInputs`. Routed to the logit (`to_logit`, parallel
combination) it returns `[B]`; routed to the tower (stacked) it returns features
`[B, out_features]`. Blocks whose output already is a logit term (`is_logit`:
first-order, FM, gated pairs) add it as it is; the others get a bias-free
`Linear(out_features, 1)` head, as xDeepFM's CIN and AutoInt's attention do.

The pairwise blocks (FM, inner product, gated pairs) take an optional explicit
list `pairs` of field pairs (i, j), i < j < F (AutoFIS hands its surviving pairs
over this way); None means every pair of the interaction vectors. With a dense
bottom vector z (DLRM) the vectors are [z, v_0, .., v_{F-1}]: explicit pairs
index the fields, and z takes part only in the default all-pairs set.

Each block declares its own sub-space (`space()`) and how a point of it becomes
its spec parameters (`spec_from_config`), next to its code (DESIGN.md §4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sfjax.automl.space import Space
from sfjax.models.dlrm import pairwise_dot_interactions
from sfjax.models.field_layout import BlockInputs
from sfjax.models.fm import fm_pairwise

# Kinds of block parameters (validated by `block_spec`): name -> (kind, default).
PAIRS = "pairs"  # None or a list of [i, j] field pairs, i < j
COUNT0 = "count0"  # int >= 0
COUNT1 = "count1"  # int >= 1
DIMS = "dims"  # non-empty list of ints >= 1


class BlockShape(NamedTuple):
  """Static sizes a block is built for.

  Attributes:
    num_fields: F.
    num_vectors: N, the interaction vectors (F, or F + 1 with a bottom vector).
    vector_dim: D, the width of each interaction vector.
    x0_dim: width of `BlockInputs.x0` (sum_f d_f + Nd).
    has_first_order: whether `BlockInputs.weights` exists.
  """

  num_fields: int
  num_vectors: int
  vector_dim: int
  x0_dim: int
  has_first_order: bool

  @property
  def offset(self) -> int:
    """Index of field 0 among the interaction vectors (1 behind a bottom vector)."""
    return self.num_vectors - self.num_fields


class Block(nnx.Module):
  """Base of the interaction blocks (see the module docstring).

  Subclasses set `type_name`, `PARAMS`, `is_logit`, `pairwise`, `needs_vectors`,
  build their layers in `__init__` (calling `_init_head` last) and compute
  `features(inputs) -> [B, out_features]`.
  """

  type_name: ClassVar[str] = ""
  PARAMS: ClassVar[dict[str, tuple[str, Any]]] = {}
  is_logit: ClassVar[bool] = False
  pairwise: ClassVar[bool] = False
  needs_vectors: ClassVar[bool] = True
  out_features: int  # Set by each subclass's __init__, before `_init_head`.

  def __init__(self, params: Mapping[str, Any], shape: BlockShape, *, to_logit: bool,
               rngs: nnx.Rngs):
    """Builds the block from its spec parameters (`PARAMS`) for `shape` (each subclass does)."""
    raise NotImplementedError

  @staticmethod
  def space() -> Space:
    """The block's searchable parameters (relative keys); none by default."""
    return Space({})

  @classmethod
  def spec_from_config(cls, section: Mapping[str, Any]) -> dict:
    """Spec parameters from a point of `space()` (relative keys); none by default."""
    del section
    return {}

  def _init_head(self, to_logit: bool, rngs: nnx.Rngs) -> None:
    self.to_logit = to_logit
    needs_head = to_logit and not self.is_logit
    self.head = (nnx.Linear(self.out_features, 1, use_bias=False, rngs=rngs)
                 if needs_head else None)

  def features(self, inputs: BlockInputs) -> jax.Array:
    """The block's output features `[B, out_features]`."""
    raise NotImplementedError

  def __call__(self, inputs: BlockInputs) -> jax.Array:
    """`[B]` logit term when routed to the logit, else `[B, out_features]` features."""
    out = self.features(inputs)
    if not self.to_logit:
      return out
    return out[:, 0] if self.head is None else self.head(out)[:, 0]


def _pair_indices(pairs: Sequence[Sequence[int]] | None, shape: BlockShape,
                  block: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(rows, cols) vector indices of the pairs a block interacts.

  Args:
    pairs: explicit field pairs (i, j), i < j < F, or None for every pair i < j of
      the N interaction vectors.
    shape: the block's sizes.
    block: the block's type, for the error message.

  Raises:
    ValueError: a pair outside the F fields.
  """
  if pairs is None:
    rows, cols = np.triu_indices(shape.num_vectors, k=1)
  else:
    arr = np.asarray(pairs, np.int64).reshape(-1, 2)
    if arr.size and (arr.min() < 0 or arr.max() >= shape.num_fields):
      raise ValueError(f"{block}: pairs must index the {shape.num_fields} fields, got "
                       f"{arr.tolist()}")
    rows, cols = arr[:, 0] + shape.offset, arr[:, 1] + shape.offset
  # Tuples, not arrays: static module attributes (NNX keeps arrays as state).
  return tuple(int(i) for i in rows), tuple(int(j) for j in cols)


def _pair_dots(vectors: jax.Array, rows: Sequence[int], cols: Sequence[int]) -> jax.Array:
  """`[B, P]` inner products <v_rows[p], v_cols[p]> of `vectors: [B, N, D]`."""
  row_index, col_index = np.asarray(rows, np.int32), np.asarray(cols, np.int32)
  return jnp.sum(vectors[:, row_index] * vectors[:, col_index], axis=-1)


class FirstOrder(Block):
  """`sum_f w_f`: the first-order weights (last row column); output `[B, 1]`."""

  type_name = "first_order"
  is_logit = True
  needs_vectors = False

  def __init__(self, params: Mapping[str, Any], shape: BlockShape, *, to_logit: bool,
               rngs: nnx.Rngs):
    """No parameters; `to_logit` routes the sum (see `Block`)."""
    del params
    if not shape.has_first_order:
      raise ValueError("first_order: the rows have no first-order column")
    self.out_features = 1
    self._init_head(to_logit, rngs)

  def features(self, inputs):
    """`[B, 1]` sum of the first-order weights."""
    return jnp.sum(inputs.weights, axis=1, keepdims=True)


class FMBlock(Block):
  """Factorization machine term `sum_{i<j} <v_i, v_j>` (Rendle 2010); output `[B, 1]`."""

  type_name = "fm"
  PARAMS = {"pairs": (PAIRS, None)}
  is_logit = True
  pairwise = True

  def __init__(self, params, shape, *, to_logit, rngs):
    """Args: params {'pairs'}; shape; to_logit; rngs (see `Block`)."""
    self.all_pairs = params["pairs"] is None
    self.rows, self.cols = _pair_indices(params["pairs"], shape, self.type_name)
    self.out_features = 1
    self._init_head(to_logit, rngs)

  def features(self, inputs):
    """`[B, 1]`: O(N*D) sum-square trick over every pair, else the listed pairs' dots."""
    if self.all_pairs:
      return fm_pairwise(inputs.vectors)[:, None]
    return jnp.sum(_pair_dots(inputs.vectors, self.rows, self.cols), axis=1, keepdims=True)


class InnerProduct(Block):
  """Pairwise inner products `[B, P]` (PNN's IPNN, DLRM's dot interaction)."""

  type_name = "inner_product"
  PARAMS = {"pairs": (PAIRS, None)}
  pairwise = True

  def __init__(self, params, shape, *, to_logit, rngs):
    """Args: params {'pairs'}; shape; to_logit; rngs (see `Block`)."""
    self.all_pairs = params["pairs"] is None
    self.rows, self.cols = _pair_indices(params["pairs"], shape, self.type_name)
    self.out_features = len(self.rows)
    if not self.out_features:
      raise ValueError("inner_product: no pair to interact")
    self._init_head(to_logit, rngs)

  def features(self, inputs):
    """`[B, P]`, row-major over (i, j), i < j, for the default pairs (as DLRM)."""
    if self.all_pairs:
      return pairwise_dot_interactions(inputs.vectors)
    return _pair_dots(inputs.vectors, self.rows, self.cols)


class GatedPairs(Block):
  """`sum_p g_p <v_i, v_j>`: one learnable gate per pair (AutoFIS's gated FM), init 1."""

  type_name = "gated_pairs"
  PARAMS = {"pairs": (PAIRS, None)}
  is_logit = True
  pairwise = True

  def __init__(self, params, shape, *, to_logit, rngs):
    """Args: params {'pairs'}; shape; to_logit; rngs (see `Block`)."""
    self.rows, self.cols = _pair_indices(params["pairs"], shape, self.type_name)
    if not len(self.rows):
      raise ValueError("gated_pairs: no pair to interact")
    self.gates = nnx.Param(jnp.ones((len(self.rows),), jnp.float32))
    self.out_features = 1
    self._init_head(to_logit, rngs)

  def features(self, inputs):
    """`[B, 1]` gated sum of the pairs' inner products."""
    dots = _pair_dots(inputs.vectors, self.rows, self.cols)  # [B, P]
    return (dots @ self.gates[...])[:, None]


class OuterProduct(Block):
  """PNN's outer product with sum pooling: `s s^T` flattened, `s = sum_n v_n`; `[B, D*D]`."""

  type_name = "outer_product"

  def __init__(self, params, shape, *, to_logit, rngs):
    """Args: params (none); shape; to_logit; rngs (see `Block`)."""
    del params
    self.out_features = shape.vector_dim * shape.vector_dim
    self._init_head(to_logit, rngs)

  def features(self, inputs):
    """`[B, D*D]` (Qu et al. 2016, the superposition form of OPNN)."""
    s = jnp.sum(inputs.vectors, axis=1)  # [B, D]
    return (s[:, :, None] * s[:, None, :]).reshape(s.shape[0], -1)
