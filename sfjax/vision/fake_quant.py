"""Fake quantization with a straight-through gradient (Quant-EA's training; Jacob et al. 2018).

`fake_quant(w, bits)` rounds `w` to a symmetric per-tensor grid of
2^(bits-1) - 1 levels each side of zero (scale = max|w| / levels) in the forward
pass and passes the gradient straight through (d out / d w = 1). `bits` may be
traced, so a population of bit-width vectors is vmapped; bits >= 32 is identity.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

FULL_PRECISION = 32


def quantize(w: jax.Array, bits) -> jax.Array:
  """`w` rounded to the symmetric `bits`-bit grid of its own range (no gradient trick)."""
  levels = 2.0 ** (jnp.asarray(bits, jnp.float32) - 1.0) - 1.0
  scale = jnp.max(jnp.abs(w)) / levels
  scale = jnp.where(scale > 0, scale, 1.0)
  q = jnp.clip(jnp.round(w / scale), -levels, levels) * scale
  return jnp.where(jnp.asarray(bits) >= FULL_PRECISION, w, q)


def fake_quant(w: jax.Array, bits) -> jax.Array:
  """`quantize(w, bits)` forward, identity backward (straight-through estimator)."""
  return w + jax.lax.stop_gradient(quantize(w, bits) - w)
