"""A CTR model assembled from a block spec (`block_spec`): the generator's module.

    model = ComposedModel(num_fields=F, embed_dim=E, num_dense=Nd, rngs=rngs, blocks=spec)
    logits = model(emb, dense)  # emb [B, F, E], dense [B, Nd] -> [B]

Registered as model `composed` with one hyperparameter, `blocks` (the spec as JSON
text, `--config.model.blocks`). For this model `model.embed_dim` is the row width E
itself, which must equal `block_spec.spec_embedding_width(spec)` (the table has one
row width; a field of dimension d reads the first d columns of its row).

Parameters (attribute names, which tests map named models' parameters onto):
`dense_linear` (DenseLinear or None), `bias` (scalar or None), `bottom` (the
dense bottom MLP to D, ReLU after every layer, as DLRM's; None without one or
when Nd = 0), `blocks` (the interaction blocks, in spec order), `gates` (`[num
blocks]`, init 1, only for a `gated` spec: parallel block i adds `gates[i] *
block_i(inputs)`; 1 is exact, 0 makes the block's output and every gradient
through it exactly 0, which shape buckets use to switch off a trial's absent
blocks), `column_gates` (`[F, E]`, init 1, only for a `gated_columns` spec: the
rows are multiplied by it first, so a 0 column reads as 0 and takes gradient 0;
shape buckets switch off the columns past a trial's own field dims), `tower`
(MLP to 1 or None).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models import block_spec
from sfjax.models.field_layout import BlockInputs, FieldLayout, field_dims
from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.pair_blocks import BlockShape
from sfjax.models.validation import check_inputs, check_sizes

NAME = "composed"


class ComposedModel(nnx.Module):
  """The model a block spec describes (see the module and `block_spec` docstrings)."""

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """For `composed`, `model.embed_dim` is the row width E (the spec's width)."""
    return embed_dim

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               blocks: str | Mapping[str, Any] = ""):
    """Builds every block of the spec.

    Args:
      num_fields: F.
      embed_dim: E, the row width; must equal `spec_embedding_width(blocks)`.
      num_dense: Nd (may be 0).
      rngs: initialisation keys.
      blocks: the spec, as JSON text (`model.blocks`) or a mapping.

    Raises:
      ValueError: a bad spec (`block_spec.SpecError`, naming the key), a width
        that differs from the spec's, a pair outside the fields, an empty tower input.
    """
    num_fields, embed_dim, num_dense = check_sizes(
        NAME, num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    spec = block_spec.as_spec(blocks)
    width = block_spec.spec_embedding_width(spec)
    if embed_dim != width:
      raise ValueError(f"{NAME}: model.embed_dim must be the blocks' row width {width} "
                       f"(max embedding dim + first-order column), got {embed_dim}")
    first_order = any(b["type"] == "first_order" for b in spec["interactions"])
    self.layout = FieldLayout(field_dims(spec["embedding"]["dims"], num_fields), first_order)
    self.num_fields, self.num_dense, self.width = num_fields, num_dense, width
    vector_dim = self.layout.vector_dim
    dense = spec["dense"]
    self.dense_linear = DenseLinear(num_dense, rngs=rngs) if dense["linear"] else None
    self.bias = nnx.Param(jnp.zeros((), jnp.float32)) if spec["bias"] else None
    has_bottom = dense["bottom_mlp"] is not None and num_dense > 0
    self.bottom = (MLP(num_dense, (*dense["bottom_mlp"], vector_dim), None, rngs=rngs)
                   if has_bottom else None)
    shape = BlockShape(num_fields=num_fields, num_vectors=num_fields + int(has_bottom),
                       vector_dim=vector_dim, x0_dim=self.layout.flat_dim + num_dense,
                       has_first_order=first_order)
    to_logit = spec["combine"] == "parallel"
    self.blocks = nnx.List([
        block_spec.BLOCK_TYPES[b["type"]]({k: v for k, v in b.items() if k != "type"}, shape,
                                          to_logit=to_logit, rngs=rngs)
        for b in spec["interactions"]])
    self.gates = (nnx.Param(jnp.ones((len(self.blocks),), jnp.float32))
                  if spec.get("gated", False) else None)
    self.column_gates = (nnx.Param(jnp.ones((num_fields, width), jnp.float32))
                         if spec.get("gated_columns", False) else None)
    self.tower_inputs = tuple(spec["tower"]["inputs"]) if spec["tower"] is not None else ()
    self.tower = self._build_tower(spec["tower"], has_bottom, rngs)

  def _build_tower(self, tower: dict | None, has_bottom: bool, rngs: nnx.Rngs) -> MLP | None:
    if tower is None:
      return None
    sizes = {"embeddings": self.layout.flat_dim, "dense": self.num_dense,
             "bottom": self.layout.vector_dim if has_bottom else 0,
             "blocks": sum(b.out_features for b in self.blocks)}
    tower_in = sum(sizes[name] for name in self.tower_inputs)
    if tower_in < 1:
      raise ValueError(f"{NAME}: the tower's inputs {list(self.tower_inputs)} are empty here "
                       f"(num_dense={self.num_dense})")
    return MLP(tower_in, tower["dims"], 1, rngs=rngs)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, E]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs(NAME, emb, dense, num_fields=self.num_fields, width=self.width,
                 num_dense=self.num_dense)
    if self.column_gates is not None:
      emb = emb * self.column_gates[...]  # [B, F, E] * [F, E]
    vectors = self.layout.vectors(emb)  # [B, F, D]
    flat = self.layout.flat(emb)  # [B, sum_f d_f]
    z = self.bottom(dense) if self.bottom is not None else None  # [B, D]
    inputs = BlockInputs(
        vectors=vectors if z is None else jnp.concatenate([z[:, None, :], vectors], axis=1),
        x0=jnp.concatenate([flat, dense], axis=1),
        weights=self.layout.weights(emb) if self.layout.first_order else None)
    logit = jnp.zeros((emb.shape[0],), emb.dtype)
    if self.bias is not None:
      logit = logit + self.bias[...]
    if self.dense_linear is not None:
      logit = logit + self.dense_linear(dense)
    outputs = [block(inputs) for block in self.blocks]  # [B] (parallel) or [B, k] (stacked)
    if self.gates is not None:  # parallel only (block_spec.validate_spec)
      gates = self.gates[...]  # [num blocks]
      outputs = [gates[i] * out for i, out in enumerate(outputs)]
    stacked = "blocks" in self.tower_inputs
    if not stacked:
      logit = sum(outputs, logit)
    if self.tower is None:
      return logit
    sources = {"embeddings": flat, "dense": dense, "bottom": z,
               "blocks": jnp.concatenate(outputs, axis=1) if stacked else None}
    parts = [x for x in (sources[name] for name in self.tower_inputs) if x is not None]
    return logit + self.tower(jnp.concatenate(parts, axis=1))[:, 0]
