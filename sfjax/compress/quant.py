"""Row-wise quantization of embedding rows: fake-quant for training, codes for storage.

VEGA's Quant-EA (arXiv 2011.01507) applied to a CTR table: each row r is stored
as b-bit signed integer codes and one float32 scale, symmetric per row:

    scale_r = max_c |x_rc| / (2^(b-1) - 1)      (1 for an all-zero row)
    code_rc = round(x_rc / scale_r)              in [-(2^(b-1) - 1), 2^(b-1) - 1]
    x'_rc   = code_rc * scale_r

`fake_quant_rows` computes x' with a straight-through gradient (the fine-tune
sees the quantized table and trains the float one); b = `FLOAT_BITS` (32) means
no quantization. The bits are traced, so one program serves every bit width.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

FLOAT_BITS = 32
# Codes of at most 8 bits are stored as int8; 32 is the float table itself.
ALLOWED_BITS = (2, 3, 4, 5, 6, 7, 8, FLOAT_BITS)
SCALE_BITS = 32  # one float32 scale per quantized row


def check_bit_choices(bit_choices: Sequence[int]) -> tuple[int, ...]:
  """`bit_choices` sorted and deduplicated.

  Raises:
    ValueError: naming `bit_choices` for an empty tuple or a width outside `ALLOWED_BITS`.
  """
  bits = tuple(sorted({int(b) for b in bit_choices}))
  if not bits or any(b not in ALLOWED_BITS for b in bits):
    raise ValueError(f"bit_choices: {tuple(bit_choices)} must be a non-empty subset of "
                     f"{ALLOWED_BITS} ({FLOAT_BITS}: float rows)")
  return bits


def _scale(x: jax.Array, bits) -> jax.Array:
  qmax = jnp.exp2(jnp.asarray(bits, jnp.float32) - 1) - 1
  peak = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
  return jnp.where(peak > 0, peak / qmax, 1.0), qmax


def quantize_rows(x: jax.Array, bits) -> tuple[jax.Array, jax.Array]:
  """(codes [..., E] float of integers, scales [..., 1]) of rows `x [..., E]` at `bits`."""
  scale, qmax = _scale(x, bits)
  return jnp.clip(jnp.round(x / scale), -qmax, qmax), scale


def fake_quant_rows(x: jax.Array, bits) -> jax.Array:
  """`x [..., E]` row-quantized at `bits` (traced; >= 32: unchanged), straight-through."""
  codes, scale = quantize_rows(x, bits)
  quantized = jnp.where(jnp.asarray(bits) >= FLOAT_BITS, x, codes * scale)
  return x + jax.lax.stop_gradient(quantized - x)


def table_codes(values, bits: int) -> tuple[np.ndarray, np.ndarray]:
  """The stored form of a table [V, E] at `bits` < 32: (int8 codes [V, E], float32 scales [V])."""
  if bits >= FLOAT_BITS or bits > 8:
    raise ValueError(f"bits: {bits} has no int8 code form (2..8)")
  codes, scale = jax.jit(quantize_rows)(jnp.asarray(values), bits)
  return np.asarray(codes, np.int8), np.asarray(scale[:, 0], np.float32)


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """The float table [V, E] that int8 `codes` and per-row `scales` [V] stand for."""
  return np.asarray(jax.jit(lambda c, s: c * s[:, None])(
      jnp.asarray(codes, jnp.float32), jnp.asarray(scales)))


def table_bits(num_rows: int, width: int, bits: int) -> int:
  """Bits of a [num_rows, width] table stored at `bits` (codes + a scale per row)."""
  if bits >= FLOAT_BITS:
    return num_rows * width * FLOAT_BITS
  return num_rows * (width * bits + SCALE_BITS)
