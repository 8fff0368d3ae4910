"""Half-width embedding rows: the storage dtype of table rows, and rounding into it.

`embedding.dtype` (issue #27, item 3) sets the dtype of the rows a table stores:
`float32` (the default, unchanged), `bfloat16` or `float16`. Rows are half the bytes
on the device, in the device cache, in the host table and on the host<->device path;
optimizer slots stay float32. Updates are computed in float32: a step upcasts the rows
it gathers (`device_table.gather_rows`), the row optimizer updates them in float32, and
the result is rounded back once (`round_rows`): to nearest even, or stochastically
(`embedding.stochastic_rounding`), so that updates smaller than half a unit in the last
place are not lost on average (Gupta et al. 2015, "Deep learning with limited numerical
precision").

Stochastic rounding draws its noise from a counter hash of `(step, position in the
[U, E] block)`, not from a PRNG key carried in the state: a step is a pure function of
its inputs, so two runs, and the device and cache paths (which see the batch's unique
rows in the same order), round alike.

Stored dtype: numpy has no bfloat16 (`ml_dtypes`, a JAX dependency, has), so `.npy` files
hold bfloat16 rows as their uint16 bits; so do device arrays, because XLA:CPU
float-normalizes a bfloat16 scatter: it converts the whole table to float32 and back each
step (470 ms instead of 2 ms on the 2.6M x 17 benchmark table, 2 cores), while a uint16
scatter is native. A step bitcasts only the `[U, E]` rows it gathers or writes
(`to_compute`, `to_stored`); float16 is native everywhere and stored as itself.
`storage_dtype` gives the stored dtype, `from_storage` views stored rows as rows again.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from sfjax.core import names

# embedding.dtype -> the numpy dtype of stored rows.
ROW_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
}
ROW_DTYPE_NAMES: tuple[str, ...] = tuple(ROW_DTYPES)
COMPUTE_DTYPE = np.dtype(np.float32)  # rows are updated (and fed to the model) in float32


def row_dtype(name, field: str = "embedding.dtype") -> np.dtype:
  """The numpy dtype of `name` (one of `ROW_DTYPE_NAMES`, or a dtype of one of them).

  Raises:
    ConfigError: an unknown dtype (the message names `field`).
  """
  if not isinstance(name, str):
    name = np.dtype(name).name
  return names.lookup(ROW_DTYPES, name, field, "row dtype")


def dtype_name(dtype) -> str:
  """'float32' / 'bfloat16' / 'float16' of a row dtype."""
  return np.dtype(dtype).name


def is_half(dtype) -> bool:
  """True for a 2-byte row dtype."""
  return np.dtype(dtype) != COMPUTE_DTYPE


def storage_dtype(dtype) -> np.dtype:
  """The dtype a `.npy` file stores rows of `dtype` in (bfloat16 as its uint16 bits)."""
  dtype = np.dtype(dtype)
  return np.dtype(np.uint16) if dtype == ROW_DTYPES["bfloat16"] else dtype


def from_storage(array: np.ndarray, dtype=None) -> np.ndarray:
  """Stored rows (a `.npy` file's, or a device array's as numpy) viewed as rows of `dtype`
  (no copy); `dtype` None: uint16 is bfloat16, any other dtype is itself."""
  if not isinstance(array, np.ndarray):  # (a np.memmap stays one: its flush matters)
    array = np.asarray(array)
  if dtype is None:
    dtype = ROW_DTYPES["bfloat16"] if array.dtype == np.uint16 else array.dtype
  dtype = np.dtype(dtype)
  return array if array.dtype == dtype else array.view(dtype)


def to_stored_host(rows: np.ndarray) -> np.ndarray:
  """Host rows as the device stores them (bfloat16: a uint16 view, no copy)."""
  rows = np.asarray(rows)
  return rows.view(storage_dtype(rows.dtype))


def to_compute(stored: jax.Array) -> jax.Array:
  """Stored rows `[U, E]` (float32, float16, or uint16 bfloat16 bits) as float32 (exact)."""
  if stored.dtype == jnp.uint16:
    stored = jax.lax.bitcast_convert_type(stored, jnp.bfloat16)
  return stored.astype(COMPUTE_DTYPE)


def to_stored(rows: jax.Array, stored_dtype) -> jax.Array:
  """Rows `[U, E]` (any float dtype, or already stored bits) in `stored_dtype`; float
  values round to nearest even (a no-op for rows already in the row dtype)."""
  stored_dtype = np.dtype(stored_dtype)
  if rows.dtype == stored_dtype:
    return rows
  if stored_dtype == np.uint16:  # bfloat16 bits
    return jax.lax.bitcast_convert_type(rows.astype(jnp.bfloat16), jnp.uint16)
  return rows.astype(stored_dtype)


def _hash_uniform(shape: tuple[int, ...], step) -> jax.Array:
  """Uniform [0, 1) float32 of `shape`, a pure function of (step, element position).

  The `lowbias32` integer hash (C. Wellons) of `position + step * golden`; 24 bits kept.
  """
  size = int(np.prod(shape))
  x = jnp.arange(size, dtype=jnp.uint32) + jnp.asarray(step, jnp.uint32) * jnp.uint32(0x9E3779B9)
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  x = x ^ (x >> 16)
  return ((x >> 8).astype(jnp.float32) * (1.0 / (1 << 24))).reshape(shape)


def stochastic_round(x: jax.Array, dtype, step) -> jax.Array:
  """`x` float32 rounded to `dtype` stochastically: to one of its two neighbours in
  `dtype`, the upper one with probability (x - lower) / (upper - lower), so that
  E[result] = x. Exact values stay; non-finite values round to nearest.

  Args:
    x: [...] float32.
    dtype: the target row dtype.
    step: int32 scalar (may be traced): the noise is a pure function of (step, position).

  Returns:
    [...] `dtype`.
  """
  near = x.astype(dtype)  # one neighbour
  near32 = near.astype(jnp.float32)
  toward = jnp.where(near32 < x, jnp.inf, -jnp.inf).astype(dtype)
  other = jnp.nextafter(near, toward)  # the neighbour on x's other side
  gap = jnp.abs(other.astype(jnp.float32) - near32)
  p_other = jnp.abs(x - near32) / jnp.where(gap > 0, gap, 1.0)
  take_other = _hash_uniform(x.shape, step) < p_other  # p NaN (inf/NaN x): never
  return jnp.where(take_other, other, near)


def round_rows(values: jax.Array, dtype, *, stochastic: bool = False, step=0) -> jax.Array:
  """Updated float32 rows `[U, E]` in the table's `dtype` (a no-op for float32).

  Args:
    values: [U, E] float32 rows.
    dtype: the row dtype.
    stochastic: stochastic rounding (`stochastic_round`) instead of round-to-nearest-even.
    step: the global step keying the stochastic rounding's noise.
  """
  dtype = np.dtype(dtype)
  if dtype == values.dtype:
    return values
  if stochastic:
    return stochastic_round(values.astype(jnp.float32), dtype, step)
  return values.astype(dtype)
