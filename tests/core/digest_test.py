"""Tests for sfjax/core/digest.py: size and CRC-32 of buffers, files and written streams."""

import io
import zlib

import numpy as np

from sfjax.core import digest


def test_digest_equals_zlib_over_the_whole_file(tmp_path, monkeypatch):
  data = bytes(range(256)) * 1000
  path = tmp_path / "f.bin"
  path.write_bytes(data)
  expected = {"bytes": len(data), "crc32": zlib.crc32(data)}
  assert digest.file_digest(str(path)) == expected
  assert digest.bytes_digest(data) == expected
  monkeypatch.setattr(digest, "_READ_BLOCK", 1000)  # many blocks: the CRC carries across them
  assert digest.file_digest(str(path)) == expected


def test_empty_file(tmp_path):
  path = tmp_path / "empty"
  path.write_bytes(b"")
  assert digest.file_digest(str(path)) == {"bytes": 0, "crc32": 0}
  assert digest.bytes_digest(b"") == {"bytes": 0, "crc32": 0}


def test_a_running_crc_equals_the_whole():
  data = b"sfjax checkpoint" * 100
  assert digest.crc32(data[500:], digest.crc32(data[:500])) == zlib.crc32(data)
  # A typed buffer counts its bytes, not its elements.
  array = np.arange(10, dtype=np.float32)
  assert digest.bytes_digest(array) == {"bytes": 40, "crc32": zlib.crc32(array.tobytes())}


def test_mismatch_names_size_and_crc():
  good = {"bytes": 3, "crc32": 7}
  assert digest.mismatch(dict(good), good) is None
  assert digest.mismatch({"bytes": 2, "crc32": 7}, good) == "size 2 vs 3, crc32 7 vs 7"
  assert digest.mismatch({"bytes": 3, "crc32": 8}, good) == "size 3 vs 3, crc32 8 vs 7"


def test_writer_digest_equals_the_written_file(tmp_path):
  array = np.arange(12, dtype=np.int64).reshape(3, 4)
  path = tmp_path / "a.npy"
  with open(path, "wb") as f:
    w = digest.DigestWriter(f)
    np.save(w, array)
  assert w.digest() == digest.file_digest(str(path))
  buf = io.BytesIO()
  np.save(buf, array)
  assert w.digest() == digest.bytes_digest(buf.getvalue())
