"""Deep interaction blocks: cross network (DCN-V2), CIN (xDeepFM), self-attention (AutoInt).

Blocks of a generated model (see `pair_blocks.Block` for the call convention and
the logit/tower routing). Each reuses the named model's layer, so a generated
DCN-V2 / xDeepFM / AutoInt holds the very same parameters, and declares its own
sub-space (`space()`) and its mapping from a point of it (`spec_from_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

from sfjax.automl.space import Categorical, Int, Space
from sfjax.models.autoint import InteractingLayer
from sfjax.models.dcnv2 import CrossLayer
from sfjax.models.field_layout import BlockInputs
from sfjax.models.pair_blocks import COUNT0, COUNT1, DIMS, Block, BlockShape
from sfjax.models.xdeepfm import CIN


class CrossNetwork(Block):
  """DCN-V2 cross layers on `x0 = [field vectors, dense]`; output `x_L: [B, d]`."""

  type_name = "cross"
  PARAMS = {"layers": (COUNT0, 3), "rank": (COUNT0, 0)}
  needs_vectors = False

  @staticmethod
  def space() -> Space:
    """`layers` in [1, 3]; `rank` 0 (full) or a low rank."""
    return Space({"layers": Int(1, 3), "rank": Categorical((0, 4, 8, 16))})

  @classmethod
  def spec_from_config(cls, section: Mapping[str, Any]) -> dict:
    """{'layers', 'rank'} from the point's keys of the same names."""
    return {"layers": int(section["layers"]), "rank": int(section["rank"])}

  def __init__(self, params: Mapping[str, Any], shape: BlockShape, *, to_logit: bool,
               rngs: nnx.Rngs):
    """Builds `layers` cross layers of width d = x0_dim (see `dcnv2.CrossLayer`)."""
    if shape.x0_dim < 1:
      raise ValueError("cross: x0 = [field vectors, dense] is empty")
    self.layers = nnx.List([CrossLayer(shape.x0_dim, params["rank"], rngs=rngs)
                            for _ in range(params["layers"])])
    self.out_features = shape.x0_dim
    self._init_head(to_logit, rngs)

  def features(self, inputs: BlockInputs) -> jax.Array:
    """`x_{l+1} = x0 * (W_l x_l + b_l) + x_l`, `[B, d]`."""
    x = inputs.x0
    for layer in self.layers:
      x = layer(inputs.x0, x)
    return x


class CINBlock(Block):
  """Compressed Interaction Network over the interaction vectors; `[B, sum_k H_k]`."""

  type_name = "cin"
  PARAMS = {"layer_dims": (DIMS, [64, 64])}

  @staticmethod
  def space() -> Space:
    """`depth` layers of `width` feature maps."""
    return Space({"depth": Int(1, 3), "width": Categorical((16, 32, 64))})

  @classmethod
  def spec_from_config(cls, section: Mapping[str, Any]) -> dict:
    """{'layer_dims': [width] * depth}."""
    return {"layer_dims": [int(section["width"])] * int(section["depth"])}

  def __init__(self, params, shape, *, to_logit, rngs):
    """Builds `xdeepfm.CIN` over the N interaction vectors."""
    self.cin = CIN(shape.num_vectors, tuple(params["layer_dims"]), rngs=rngs)
    self.out_features = self.cin.out_features
    self._init_head(to_logit, rngs)

  def features(self, inputs):
    """Sum-pooled feature maps of every layer, `[B, sum_k H_k]`."""
    return self.cin(inputs.vectors)


class SelfAttention(Block):
  """AutoInt's multi-head self-attention layers over the vectors; `[B, N*H*A]` flattened."""

  type_name = "self_attention"
  PARAMS = {"layers": (COUNT1, 2), "heads": (COUNT1, 2), "head_dim": (COUNT1, 16)}

  @staticmethod
  def space() -> Space:
    """`layers`, `heads`, per-head width `head_dim`."""
    return Space({"layers": Int(1, 3), "heads": Categorical((1, 2, 4)),
                  "head_dim": Categorical((8, 16, 32))})

  @classmethod
  def spec_from_config(cls, section: Mapping[str, Any]) -> dict:
    """{'layers', 'heads', 'head_dim'} from the keys of the same names."""
    return {k: int(section[k]) for k in ("layers", "heads", "head_dim")}

  def __init__(self, params, shape, *, to_logit, rngs):
    """Builds `layers` `autoint.InteractingLayer`s (the first from width D)."""
    width = params["heads"] * params["head_dim"]
    widths = (shape.vector_dim,) + (width,) * params["layers"]
    self.layers = nnx.List([InteractingLayer(a, params["heads"], params["head_dim"], rngs=rngs)
                            for a in widths[:-1]])
    self.out_features = shape.num_vectors * width
    self._init_head(to_logit, rngs)

  def features(self, inputs):
    """The last layer's output `[B, N, H*A]`, flattened."""
    x = inputs.vectors
    for layer in self.layers:
      x = layer(x)
    return x.reshape(x.shape[0], -1)


def tower_space(max_depth: int = 3, widths: tuple[int, ...] = (32, 64, 128, 256, 400)) -> Space:
  """The MLP tower's sub-space: `depth` hidden layers of equal `width` (400: the default's)."""
  return Space({"depth": Int(1, max_depth), "width": Categorical(tuple(widths))})


def bottom_space() -> Space:
  """The dense bottom MLP's sub-space (DLRM): `depth` layers of `width` before the D-wide one."""
  return Space({"depth": Int(0, 2), "width": Categorical((16, 32, 64))})


def layer_dims_from_config(section: Mapping[str, Any]) -> list[int]:
  """`[width] * depth` from a point of `tower_space` / `bottom_space` (relative keys)."""
  return [int(section["width"])] * int(section["depth"])

