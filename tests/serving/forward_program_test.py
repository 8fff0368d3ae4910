"""forward_program: the gather-and-forward program equals the forward on host-gathered rows
bit for bit, its packed input round-trips, and compiler options are parsed and applied."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sfjax.serving import forward_program as programs

FIELDS, WIDTH, DENSE = 3, 4, 2


def _exported():
  """A small forward with the bundle's signature, batch symbolic: a dot of the flattened
  rows and the dense, a field sum (FM-like), and a ReLU layer."""

  def forward(leaves, emb, dense):  # emb [B, F, E], dense [B, Nd]
    w, v = leaves
    flat = jnp.concatenate([emb.reshape(emb.shape[0], -1), dense], axis=1)
    return jnp.maximum(flat @ w, 0.0).sum(axis=1) + emb.sum(axis=1) @ v

  (b,) = jax.export.symbolic_shape("b")
  args = ([jax.ShapeDtypeStruct((FIELDS * WIDTH + DENSE, 5), np.float32),
           jax.ShapeDtypeStruct((WIDTH,), np.float32)],
          jax.ShapeDtypeStruct((b, FIELDS, WIDTH), np.float32),
          jax.ShapeDtypeStruct((b, DENSE), np.float32))
  return jax.export.export(jax.jit(forward))(*args)


@pytest.fixture(scope="module")
def parts():
  """(exported forward, params, table [V, E], offsets [F], ids [8, F], dense [8, Nd])."""
  rng = np.random.default_rng(0)
  params = [jax.device_put(rng.normal(size=(FIELDS * WIDTH + DENSE, 5)).astype(np.float32)),
            jax.device_put(rng.normal(size=(WIDTH,)).astype(np.float32))]
  rows = np.asarray([5, 7, 11])  # per field
  table = rng.normal(size=(rows.sum(), WIDTH)).astype(np.float32)
  offsets = np.concatenate([[0], np.cumsum(rows)[:-1]])
  ids = rng.integers(0, rows, size=(8, FIELDS))
  dense = rng.normal(size=(8, DENSE)).astype(np.float32)
  return _exported(), params, table, offsets, ids, dense


def test_gather_forward_equals_the_forward_on_host_rows_bit_for_bit(parts):
  forward, params, table, offsets, ids, dense = parts
  alone = programs.compile_gathered_forward(forward, params, 8, FIELDS, WIDTH, DENSE)
  emb = table[(ids + offsets[None, :]).reshape(-1)].reshape(8, FIELDS, WIDTH)
  want = np.asarray(alone(params, emb, dense))
  gathered = programs.compile_gather_forward(forward, params, jax.device_put(table), offsets,
                                             8, DENSE)
  packed = np.zeros((8, FIELDS + DENSE), np.float32)
  ids_view, dense_view = programs.packed_views(packed, FIELDS)
  ids_view[:], dense_view[:] = ids, dense
  got = np.asarray(gathered(params, jax.device_put(table), packed))
  np.testing.assert_array_equal(got, want)
  ref = np.maximum(np.concatenate([emb.reshape(8, -1), dense], 1) @ np.asarray(params[0]), 0)
  np.testing.assert_allclose(got, ref.sum(1) + emb.sum(1) @ np.asarray(params[1]), rtol=1e-5)


def test_device_gather_pads_and_reuses_its_buffers(parts):
  """A full batch, then fewer examples in the same buffer, then a smaller size: each
  equals the forward on host-gathered rows, padded with row 0."""
  forward, params, table, offsets, ids, dense = parts
  device = programs.DeviceGather(forward, params, table, offsets, (2, 8), DENSE)
  assert set(device.programs) == {2, 8}
  alone = {b: programs.compile_gathered_forward(forward, params, b, FIELDS, WIDTH, DENSE) for b in (2, 8)}

  def want(m, size):
    padded_ids = np.zeros((size, FIELDS), np.int64)
    padded_dense = np.zeros((size, DENSE), np.float32)
    padded_ids[:m], padded_dense[:m] = ids[:m], dense[:m]
    emb = table[(padded_ids + offsets[None, :]).reshape(-1)].reshape(size, FIELDS, WIDTH)
    return np.asarray(alone[size](params, emb, padded_dense))[:m]

  for m, size in ((8, 8), (3, 8), (2, 2), (1, 2)):
    np.testing.assert_array_equal(device(params, ids[:m], dense[:m], size), want(m, size))


def test_packed_views_hold_the_ids_bits_then_the_dense():
  packed = np.zeros((2, 5), np.float32)
  ids_view, dense_view = programs.packed_views(packed, 3)
  ids_view[:] = [[1, 2, 3], [2**31 - 1, 0, 7]]
  dense_view[:] = [[0.5, -1.0], [2.0, 3.0]]
  np.testing.assert_array_equal(packed[:, :3].view(np.int32), [[1, 2, 3], [2**31 - 1, 0, 7]])
  np.testing.assert_array_equal(packed[:, 3:], [[0.5, -1.0], [2.0, 3.0]])
  assert ids_view.dtype == np.int32 and ids_view.base is not None  # views, not copies


def test_a_table_beyond_int32_rows_is_refused(parts):
  forward, params, _, offsets, _, _ = parts
  huge = jax.ShapeDtypeStruct((2**31, WIDTH), np.float32)
  with pytest.raises(ValueError, match="table: 2147483648 rows exceed int32"):
    programs.compile_gather_forward(forward, params, huge, offsets, 8, DENSE)


def test_table_fits_in_int32_rows_and_half_the_devices_memory():
  assert programs.table_fits(10, 10 << 30, None)  # CPU: no limit reported
  assert programs.table_fits(10, 4 << 30, {"bytes_limit": 8 << 30})
  assert not programs.table_fits(10, (4 << 30) + 1, {"bytes_limit": 8 << 30})
  assert not programs.table_fits(2**31, 1, None)  # row ids beyond int32


def test_compiler_options_reach_the_compile(parts):
  forward, params, *_ = parts
  with pytest.raises(Exception, match="xla_cpu_no_such_option"):
    programs.compile_gathered_forward(forward, params, 8, FIELDS, WIDTH, DENSE,
                             options={"xla_cpu_no_such_option": True})


def test_parse_compiler_options():
  assert programs.parse_compiler_options("") == {}
  assert programs.parse_compiler_options(
      "xla_cpu_use_onednn=true, --xla_cpu_prefer_vector_width=512,xla_x=False,xla_y=abc,"
      "xla_z=") == {"xla_cpu_use_onednn": True, "xla_cpu_prefer_vector_width": 512,
                    "xla_x": False, "xla_y": "abc", "xla_z": ""}
  for bad in ("xla_cpu_use_onednn", "use_onednn=true", "=1"):
    with pytest.raises(ValueError, match=f"compiler_options: {bad!r} is not xla_"):
      programs.parse_compiler_options(bad)
