"""AutoGroup's model (Liu et al., SIGIR 2020): learned field groups, order-p interactions inside.

For each interaction order p in 2..max_order there are G_p groups; field i
belongs to group j of order p by a binary choice with structure logits π^p_ij [2]
(a field may join several groups or none). Training samples the choice by
Gumbel-softmax with temperature τ and a straight-through hard choice: the forward
pass uses the hard 0/1 membership m^p_ij, gradients flow through the soft sample.
After `model.eval()` the membership is argmax π, without noise. A group's
representation is

  s^p_j = Σ_i m^p_ij w^p_ij e_i                     (w: learned field weights)
  I^p_j = (s^p_j)^p - Σ_i (m^p_ij w^p_ij e_i)^p     (elementwise powers, [E])

(for p = 2 twice the FM interaction of the group's fields), and

  logit = b + Σ_f w_f + dense·v + MLP([I^2_1, ..., I^P_G, dense]).

Rows have width D + 1 (the first-order weight last). The Gumbel noise comes from
the model's own `nnx.Rngs` stream ('gumbel'), whose counter is an `nnx.RngCount`:
the model trains through `make_train_step(..., model_variables=True)`, one fresh
sample per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.models.layers import MLP, DenseLinear
from sfjax.models.validation import (
    as_count,
    as_layer_dims,
    check_inputs,
    check_sizes,
    split_first_order,
)


def _straight_through_membership(logits: jax.Array, key, temperature, train: bool) -> jax.Array:
  """Hard 0/1 memberships [F, G] from structure logits [F, G, 2] (index 1 = member).

  Train: Gumbel-softmax sample y = softmax((π + g) / τ); forward value one_hot(argmax y),
  gradient that of y (straight-through). Eval: one_hot(argmax π), no noise (`key` unused).
  """
  if not train:
    return (jnp.argmax(logits, axis=-1) == 1).astype(jnp.float32)
  gumbel = jax.random.gumbel(key, logits.shape, jnp.float32)
  soft = jax.nn.softmax((logits + gumbel) / temperature, axis=-1)
  hard = jax.nn.one_hot(jnp.argmax(soft, axis=-1), 2, dtype=soft.dtype)
  return (hard + soft - jax.lax.stop_gradient(soft))[..., 1]


def group_interactions(vectors: jax.Array, membership: jax.Array, weights: jax.Array,
                       order: int) -> jax.Array:
  """Order-p interaction vector of each group.

  Args:
    vectors: [B, F, E] field embeddings.
    membership: [F, G] 0/1 (straight-through) memberships.
    weights: [F, G] field weights inside each group.
    order: p >= 2.

  Returns:
    [B, G, E]: (Σ_i m_ig w_ig e_i)^p - Σ_i (m_ig w_ig e_i)^p, elementwise.
  """
  scaled = vectors[:, :, None, :] * (membership * weights)[None, :, :, None]  # [B, F, G, E]
  return scaled.sum(axis=1) ** order - (scaled ** order).sum(axis=1)


def _groups_per_order(max_order: int, num_groups: int | Sequence[int]) -> tuple[int, ...]:
  """G_p for p = 2..max_order: `num_groups` for each, or its max_order - 1 entries.

  Raises:
    ValueError: naming `model.max_order` or `model.num_groups`.
  """
  max_order = as_count("group_interactions", "model.max_order", max_order, low=2)
  if isinstance(num_groups, Sequence) and not isinstance(num_groups, str):
    groups = tuple(num_groups)
    if len(groups) != max_order - 1:
      raise ValueError(f"group_interactions: model.num_groups must have max_order - 1 = "
                       f"{max_order - 1} entries (orders 2..{max_order}), got {num_groups!r}")
  else:
    groups = (num_groups,) * (max_order - 1)
  return tuple(as_count("group_interactions", "model.num_groups", g, low=1) for g in groups)


class GroupInteractions(nnx.Module):
  """The AutoGroup model above (registered as 'group_interactions').

  Attributes:
    orders: the interaction orders (2..max_order).
    structure: per order, [F, G_p, 2] Param structure logits π.
    group_weights: per order, [F, G_p] Param field weights w (start at 1).
    deterministic: False while training (sampled memberships); `model.eval()` sets it.
  """

  @staticmethod
  def embedding_width(embed_dim: int) -> int:
    """D latent columns plus one first-order weight."""
    return embed_dim + 1

  def __init__(self, *, num_fields: int, embed_dim: int, num_dense: int, rngs: nnx.Rngs,
               max_order: int = 3, num_groups: int | Sequence[int] = 4,
               mlp_dims: Sequence[int] = (64,), temperature: float = 1.0):
    """Builds the structure logits (N(0, 0.01)), group weights, tower and Gumbel stream.

    Args:
      num_fields: F.
      embed_dim: D (rows have width D + 1).
      num_dense: Nd (may be 0).
      rngs: initialisation keys (the Gumbel stream's key is drawn from them too).
      max_order: the highest interaction order P >= 2.
      num_groups: G_p, one int for every order or a tuple of P - 1 ints.
      mlp_dims: hidden widths of the tower (`model.mlp_dims`; () = a linear layer).
      temperature: the Gumbel-softmax temperature τ > 0.
    """
    num_fields, embed_dim, num_dense = check_sizes(
        "group_interactions", num_fields=num_fields, embed_dim=embed_dim, num_dense=num_dense)
    groups = _groups_per_order(max_order, num_groups)
    mlp_dims = as_layer_dims("group_interactions", "model.mlp_dims", mlp_dims)
    if not temperature > 0:
      raise ValueError(f"group_interactions: model.temperature must be > 0, got {temperature!r}")
    self.num_fields, self.embed_dim, self.num_dense = num_fields, embed_dim, num_dense
    self.orders = tuple(range(2, len(groups) + 2))
    self.temperature = float(temperature)
    self.deterministic = False
    self.bias = nnx.Param(jnp.zeros((), jnp.float32))
    self.dense_linear = DenseLinear(num_dense, rngs=rngs)
    self.structure = nnx.List([
        nnx.Param(0.01 * jax.random.normal(rngs.params(), (num_fields, g, 2), jnp.float32))
        for g in groups])
    self.group_weights = nnx.List([nnx.Param(jnp.ones((num_fields, g), jnp.float32))
                                   for g in groups])
    self.mlp = MLP(sum(groups) * embed_dim + num_dense, mlp_dims, 1, rngs=rngs)
    self.rngs = nnx.Rngs(gumbel=rngs.params())

  def memberships(self) -> tuple[jax.Array, ...]:
    """Per order, the [F, G_p] hard memberships argmax π (what the search found)."""
    return tuple(_straight_through_membership(s[...], None, self.temperature, False)
                 for s in self.structure)

  def __call__(self, emb: jax.Array, dense: jax.Array) -> jax.Array:
    """Maps `emb: [B, F, D+1]`, `dense: [B, Nd]` to logits `[B]`."""
    check_inputs("group_interactions", emb, dense, num_fields=self.num_fields,
                 width=self.embed_dim + 1, num_dense=self.num_dense)
    vectors, weights = split_first_order(emb)  # [B, F, D], [B, F]
    features = []
    for k, order in enumerate(self.orders):
      key = None if self.deterministic else self.rngs.gumbel()
      member = _straight_through_membership(self.structure[k][...], key, self.temperature,
                                            not self.deterministic)
      inter = group_interactions(vectors, member, self.group_weights[k][...], order)  # [B, G, D]
      features.append(inter.reshape(inter.shape[0], -1))
    tower = self.mlp(jnp.concatenate(features + [dense], axis=1))[:, 0]
    return self.bias[...] + jnp.sum(weights, axis=1) + self.dense_linear(dense) + tower
