"""Half-width rows: dtype names, .npy storage, and rounding (nearest and stochastic)."""

import io

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from sfjax.core.errors import ConfigError
from sfjax.embedding import row_dtype as rd

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_names_map_to_dtypes_and_unknown_names_the_field():
  assert rd.row_dtype("bfloat16") == BF16
  assert rd.row_dtype(np.float16) == np.dtype(np.float16)
  assert rd.dtype_name(BF16) == "bfloat16" and not rd.is_half(np.float32) and rd.is_half(BF16)
  with pytest.raises(ConfigError, match=r"config field embedding\.dtype: unknown row dtype "
                                        r"'bf16' \(known: float32, bfloat16, float16\)"):
    rd.row_dtype("bf16")
  with pytest.raises(ConfigError, match="HostTableSpec.dtype"):
    rd.row_dtype("int8", "HostTableSpec.dtype")


@pytest.mark.parametrize("name", rd.ROW_DTYPE_NAMES)
def test_npy_storage_round_trips_bit_exactly(name):
  dtype = rd.row_dtype(name)
  rows = (np.arange(12, dtype=np.float32).reshape(3, 4) / 7).astype(dtype)
  buf = io.BytesIO()
  np.save(buf, rows.view(rd.storage_dtype(dtype)))
  buf.seek(0)
  stored = np.load(buf)
  assert stored.dtype == (np.uint16 if name == "bfloat16" else dtype)
  back = rd.from_storage(stored, dtype)
  assert back.dtype == dtype
  np.testing.assert_array_equal(back.view(np.uint8), rows.view(np.uint8))


def test_nearest_rounding_is_a_cast_and_float32_is_untouched():
  x = jnp.asarray([[0.1, -0.3, 1.0 + 2.0 ** -10]], jnp.float32)
  assert rd.round_rows(x, np.float32) is x
  got = rd.round_rows(x, BF16)
  assert got.dtype == BF16
  np.testing.assert_array_equal(np.asarray(got), np.asarray(x).astype(BF16))


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour(name):
  dtype = rd.row_dtype(name)
  # 1 + 0.3 ulp (bf16: ulp 2^-7 at 1; fp16: 2^-10) and a negative value, 4096 copies.
  ulp = 2.0 ** (-7 if name == "bfloat16" else -10)
  x = jnp.asarray(np.tile([[1.0 + 0.3 * ulp, -(1.0 + 0.75 * ulp)]], (4096, 1)), jnp.float32)
  out = np.asarray(jax.jit(rd.stochastic_round, static_argnums=1)(x, dtype, 7)).astype(np.float32)
  lo, hi = np.float32(1.0), np.float32(1.0 + ulp)
  assert set(np.unique(out[:, 0])) == {lo, hi}  # only the two neighbours
  assert set(np.unique(out[:, 1])) == {-lo, -hi}
  np.testing.assert_allclose(out.mean(axis=0), np.asarray(x[0]), atol=0.03 * ulp)  # unbiased
  nearest = np.asarray(x.astype(dtype)).astype(np.float32)
  assert abs(nearest[:, 0].mean() - float(x[0, 0])) > 0.25 * ulp  # round-to-nearest is not


def test_stochastic_rounding_is_a_function_of_step_and_keeps_exact_values():
  sround = jax.jit(lambda v, step: rd.stochastic_round(v, BF16, step))
  x = np.linspace(-1, 1, 64, dtype=np.float32) * 1.001
  exact = x.astype(BF16).astype(np.float32)
  values = np.concatenate([x, exact, [np.inf, -np.inf]]).astype(np.float32)
  a, b, c = (np.asarray(sround(values, step)) for step in (3, 3, 4))
  np.testing.assert_array_equal(a, b)  # deterministic
  assert not np.array_equal(a[:64], c[:64])  # another step, other noise
  np.testing.assert_array_equal(a[64:128], exact.astype(BF16))  # exact values stay
  assert np.all(np.isinf(a[128:].astype(np.float32)))
