"""Whole-file checksums: the size and CRC-32 that shard, checkpoint and export manifests record."""

from __future__ import annotations

import zlib

_READ_BLOCK = 1 << 24  # 16 MiB: bounded memory for files of any size


def file_digest(path: str) -> dict[str, int]:
  """`{"bytes": size, "crc32": CRC-32}` of the file at `path`, read in 16 MiB blocks."""
  crc, size = 0, 0
  with open(path, "rb") as f:
    while block := f.read(_READ_BLOCK):
      crc, size = zlib.crc32(block, crc), size + len(block)
  return {"bytes": size, "crc32": crc}
