"""Pooling a feature layout's id columns into the fields a CTR model reads (issue #22).

The step looks up every id column, `emb = uniq_rows[vids]` `[B, S, E]`, and hands the
per-id weights `[B, S]` beside it (0 in padding columns). `PooledInput` wraps any CTR
model: each feature's columns pool to one field, so the model sees `[B, F, E]` as if
every feature were one-hot:

  sum     sum_i w_i e_i
  mean    sum_i w_i e_i / sum_i w_i           (0 for an empty bag)
  sqrtn   sum_i w_i e_i / sqrt(sum_i w_i^2)   (0 for an empty bag)

(TorchRec's `EmbeddingBagCollection` poolings, with per-sample weights.) A one-hot
feature is its column. A sequence feature pools by mean for an ordinary model; a
model with `reads_sequences = True` (DIN) also receives each sequence unpooled,
`sequences = ((values [B, L, E], mask [B, L]), ...)`, in layout order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from sfjax.core.feature_layout import FeatureLayout, live_columns


def pool_bag(values: jax.Array, weights: jax.Array, pooling: str) -> jax.Array:
  """Pools one feature's columns: `values [B, L, E]`, `weights [B, L]` -> `[B, E]`."""
  total = jnp.sum(values * weights[..., None], axis=1)  # [B, E]
  if pooling == "sum":
    return total
  if pooling == "mean":
    norm = jnp.sum(weights, axis=1)
  elif pooling == "sqrtn":
    norm = jnp.sqrt(jnp.sum(weights * weights, axis=1))
  else:
    raise ValueError(f"unknown pooling {pooling!r}")
  safe = jnp.where(norm > 0, norm, 1.0)  # an empty bag pools to 0 (and a finite gradient)
  return total / safe[:, None]


def pool_features(layout: FeatureLayout, emb: jax.Array, weights: jax.Array) -> jax.Array:
  """`emb [B, S, E]`, `weights [B, S]` -> one field per feature `[B, F, E]`."""
  fields = []
  for f, spec in enumerate(layout.features):
    cols = layout.columns(f)
    if spec.capacity == 1 and spec.kind == "one_hot":
      fields.append(emb[:, cols.start] * weights[:, cols.start, None])
      continue
    pooling = "mean" if spec.kind == "sequence" else spec.pooling
    fields.append(pool_bag(emb[:, cols], weights[:, cols], pooling))
  return jnp.stack(fields, axis=1)


def sequence_inputs(layout: FeatureLayout, emb: jax.Array, weights: jax.Array
                    ) -> tuple[tuple[jax.Array, jax.Array], ...]:
  """Each sequence feature unpooled: `((values [B, L, E], mask [B, L]), ...)`."""
  out = []
  for f in layout.sequence_features():
    cols = layout.columns(f)
    out.append((emb[:, cols], (weights[:, cols] != 0).astype(emb.dtype)))
  return tuple(out)


class PooledInput(nnx.Module):
  """A CTR model behind a feature layout: `model(emb [B, S, E], dense, weights [B, S])`.

  Attributes:
    layout: the static feature layout.
    inner: the wrapped model, built for F = `layout.num_features` fields.
    latent_dim: D, the latent columns that lead each row (tables of a smaller `dim` read
      only their first `dim`, `feature_layout.live_columns`); None: every column is read.
  """

  def __init__(self, inner: nnx.Module, layout: FeatureLayout, latent_dim: int | None = None):
    """Wraps `inner` (built for `layout.num_features` fields); `latent_dim`: see above."""
    self.layout = layout
    self.inner = inner
    self.latent_dim = latent_dim

  def __call__(self, emb: jax.Array, dense: jax.Array, weights: jax.Array) -> jax.Array:
    """Pools `emb [B, S, E]` by `weights [B, S]` and runs the inner model -> logits `[B]`."""
    if emb.shape[1] != self.layout.num_columns:
      raise ValueError(f"pooled input: {emb.shape[1]} id columns, the layout has "
                       f"{self.layout.num_columns}")
    live = (None if self.latent_dim is None
            else live_columns(self.layout, self.latent_dim, emb.shape[2]))
    if live is not None:  # a table's columns past its dim read as 0 (no gradient)
      emb = emb * jnp.asarray(live, emb.dtype)[None]
    fields = pool_features(self.layout, emb, weights)
    if getattr(self.inner, "reads_sequences", False):
      return self.inner(fields, dense, sequences=sequence_inputs(self.layout, emb, weights))
    return self.inner(fields, dense)
