"""Symmetric quantization: the one fake-quant (straight-through) and the stored codes.

VEGA's Quant-EA (arXiv 2011.01507; fake quantization as Jacob et al. 2018). A
tensor x is rounded to b-bit signed integer codes and one float32 scale per
quantization group, symmetric: a group is the whole tensor (`axis=None`, a CNN
layer's weights, `sfjax.vision.cnn`) or each row along `axis` (a CTR table's
rows, `fake_quant_rows`):

    scale   = max |x| / (2^(b-1) - 1)     over the group (1 for an all-zero group)
    code    = round(x / scale)             in [-(2^(b-1) - 1), 2^(b-1) - 1]
    x'      = code * scale

`fake_quant` computes x' with a straight-through gradient (the fine-tune sees the
quantized values and trains the float ones); b >= `FLOAT_BITS` (32) means no
quantization. The bits may be traced, so one program serves every bit width and
a population of bit widths is one `jax.vmap`.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

FLOAT_BITS = 32
# Codes of at most 8 bits are stored as int8; 32 is the float table itself.
_ALLOWED_BITS = (2, 3, 4, 5, 6, 7, 8, FLOAT_BITS)
_SCALE_BITS = 32  # one float32 scale per quantized row


def check_bit_choices(bit_choices: Sequence[int]) -> tuple[int, ...]:
  """`bit_choices` sorted and deduplicated.

  Raises:
    ValueError: naming `bit_choices` for an empty tuple or a width outside `_ALLOWED_BITS`.
  """
  bits = tuple(sorted({int(b) for b in bit_choices}))
  if not bits or any(b not in _ALLOWED_BITS for b in bits):
    raise ValueError(f"bit_choices: {tuple(bit_choices)} must be a non-empty subset of "
                     f"{_ALLOWED_BITS} ({FLOAT_BITS}: float rows)")
  return bits


def _quantize_codes(x: jax.Array, bits, axis: int | None = -1) -> tuple[jax.Array, jax.Array]:
  """(codes, scales) of `x` at `bits`: codes float integers like `x`, one scale per group.

  Args:
    x: any float array.
    bits: b >= 2 (a Python int or a traced scalar).
    axis: None: one group (the whole tensor, scale []); else each slice along `axis` is
      a group (scales keep `axis` with size 1, e.g. [V, 1] for rows [V, E]).
  """
  qmax = 2.0 ** (jnp.asarray(bits, jnp.float32) - 1.0) - 1.0  # exact; jnp.exp2 is not on CPU
  peak = jnp.max(jnp.abs(x), axis=axis, keepdims=axis is not None)
  scale = jnp.where(peak > 0, peak / qmax, 1.0)
  return jnp.clip(jnp.round(x / scale), -qmax, qmax), scale


def _quantize(x: jax.Array, bits, axis: int | None = None) -> jax.Array:
  """`x` rounded to its symmetric `bits` grid (no gradient trick); bits >= 32: `x` itself."""
  codes, scale = _quantize_codes(x, bits, axis)
  return jnp.where(jnp.asarray(bits) >= FLOAT_BITS, x, codes * scale)


def fake_quant(x: jax.Array, bits, axis: int | None = None) -> jax.Array:
  """`_quantize(x, bits, axis)` forward, identity backward (straight-through estimator)."""
  return x + jax.lax.stop_gradient(_quantize(x, bits, axis) - x)


def fake_quant_rows(x: jax.Array, bits) -> jax.Array:
  """`x [..., E]` quantized per row (its last axis) at `bits`, straight-through."""
  return fake_quant(x, bits, axis=-1)


def table_codes(values, bits: int) -> tuple[np.ndarray, np.ndarray]:
  """The stored form of a table [V, E] at `bits` < 32: (int8 codes [V, E], float32 scales [V])."""
  if bits >= FLOAT_BITS or bits > 8:
    raise ValueError(f"bits: {bits} has no int8 code form (2..8)")
  codes, scale = jax.jit(_quantize_codes)(jnp.asarray(values), bits)
  return np.asarray(codes, np.int8), np.asarray(scale[:, 0], np.float32)


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """The float table [V, E] that int8 `codes` and per-row `scales` [V] stand for."""
  return np.asarray(jax.jit(lambda c, s: c * s[:, None])(
      jnp.asarray(codes, jnp.float32), jnp.asarray(scales)))


def table_bits(num_rows: int, width: int, bits: int) -> int:
  """Bits of a [num_rows, width] table stored at `bits` (codes + a scale per row)."""
  if bits >= FLOAT_BITS:
    return num_rows * width * FLOAT_BITS
  return num_rows * (width * bits + _SCALE_BITS)
