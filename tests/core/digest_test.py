"""Tests for sfjax/core/digest.py: size and CRC-32 of whole files."""

import zlib

from sfjax.core import digest


def test_digest_equals_zlib_over_the_whole_file(tmp_path, monkeypatch):
  data = bytes(range(256)) * 1000
  path = tmp_path / "f.bin"
  path.write_bytes(data)
  expected = {"bytes": len(data), "crc32": zlib.crc32(data)}
  assert digest.file_digest(str(path)) == expected
  monkeypatch.setattr(digest, "_READ_BLOCK", 1000)  # many blocks: the CRC carries across them
  assert digest.file_digest(str(path)) == expected


def test_empty_file(tmp_path):
  path = tmp_path / "empty"
  path.write_bytes(b"")
  assert digest.file_digest(str(path)) == {"bytes": 0, "crc32": 0}
