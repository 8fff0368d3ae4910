"""Row sources: RAM and mmap read the same rows; int8 and fp16 decode within their error."""

import numpy as np
import pytest

from sfjax.serving import row_source


def _write_table(tmp_path, values, dtype, chunk_rows=4):
  chunks = []
  for lo in range(0, values.shape[0], chunk_rows):
    part = values[lo:lo + chunk_rows]
    entry = {"rows": [lo, lo + part.shape[0]], "values": f"rows_{lo}.npy"}
    if dtype == "int8":
      part, scales = row_source.quantize_int8(part)
      entry["scales"] = f"scales_{lo}.npy"
      np.save(tmp_path / entry["scales"], scales)
    np.save(tmp_path / entry["values"], part.astype(dtype))
    chunks.append(entry)
  return {"rows": values.shape[0], "dim": values.shape[1], "chunk_rows": chunk_rows,
          "chunks": chunks}


@pytest.mark.parametrize("dtype,tol", [("float32", 0.0), ("float16", 1e-3), ("int8", 1 / 254)])
def test_memory_and_mmap_sources_gather_the_stored_rows(dtype, tol, tmp_path):
  values = np.random.default_rng(0).normal(size=(10, 5)).astype(np.float32)
  values[3] = 0.0  # an all-zero row quantizes to zeros
  table = _write_table(tmp_path, values, dtype)
  rows = np.asarray([9, 0, 3, 3, 4, 7], np.int64)
  memory = row_source.open_rows(str(tmp_path), table, "memory").gather(rows)
  mapped = row_source.open_rows(str(tmp_path), table, "mmap").gather(rows)
  assert memory.dtype == mapped.dtype == np.float32 and memory.shape == (6, 5)
  np.testing.assert_array_equal(memory, mapped)
  peak = np.abs(values[rows]).max(axis=1, keepdims=True)
  assert np.all(np.abs(memory - values[rows]) <= tol * np.maximum(peak, 1e-30) + 1e-7)
  assert not memory[2].any()
  padded = np.asarray([9, -1, 3, -1], np.int64)  # -1: padding (bags, sequences) reads zeros
  for kind in ("memory", "mmap"):
    got = row_source.open_rows(str(tmp_path), table, kind).gather(padded)
    np.testing.assert_array_equal(got[[0, 2]], memory[[0, 2]])
    assert not got[[1, 3]].any()
  with pytest.raises(ValueError, match="rows must be 'memory', 'mmap' or 'cache'"):
    row_source.open_rows(str(tmp_path), table, "disk")


def test_int8_quantization_is_per_row_symmetric():
  values = np.asarray([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [254.0, 1.0, -127.0]], np.float32)
  q, scales = row_source.quantize_int8(values)
  np.testing.assert_allclose(scales, [2 / 127, 1.0, 2.0])
  np.testing.assert_array_equal(q, [[64, -127, 32], [0, 0, 0], [127, 0, -64]])  # 0.5 rounds to 0
  np.testing.assert_allclose(row_source.decode_rows(q, scales), values, atol=scales.max() / 2)
