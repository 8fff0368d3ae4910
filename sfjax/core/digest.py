"""Size and CRC-32 digests: the one checksum that shard, checkpoint and export manifests record.

Every manifest entry is `{"bytes": size, "crc32": CRC-32}` of a file's exact bytes, with
zlib's CRC-32 (IEEE 802.3, initial value 0), so a digest computed here equals one any
`zlib.crc32` computed, and files written before this module existed still verify.
Whole files are read in 16 MiB blocks (bounded memory); writers fold their bytes in as
they go (`DigestWriter`), so a file is never read back just to be checksummed.
"""

from __future__ import annotations

import zlib
from typing import IO

_READ_BLOCK = 1 << 24  # 16 MiB: bounded memory for files of any size

Digest = dict[str, int]  # {"bytes": size, "crc32": CRC-32}


def crc32(data, crc: int = 0) -> int:
  """CRC-32 of the bytes-like `data`, continuing the running value `crc` (0 to start)."""
  return zlib.crc32(data, crc)


def bytes_digest(data) -> Digest:
  """`{"bytes": size, "crc32": CRC-32}` of the bytes-like `data` held in memory."""
  view = memoryview(data).cast("B")
  return {"bytes": view.nbytes, "crc32": zlib.crc32(view)}


def file_digest(path: str) -> Digest:
  """`{"bytes": size, "crc32": CRC-32}` of the file at `path`, read in 16 MiB blocks."""
  crc, size = 0, 0
  with open(path, "rb") as f:
    while block := f.read(_READ_BLOCK):
      crc, size = zlib.crc32(block, crc), size + len(block)
  return {"bytes": size, "crc32": crc}


def mismatch(got: Digest, want: Digest) -> str | None:
  """None when `got` has `want`'s size and CRC-32; else why not, e.g.
  `"size 100 vs 120, crc32 17 vs 42"` (for an error message that names the file)."""
  if got["bytes"] == want["bytes"] and got["crc32"] == want["crc32"]:
    return None
  return f"size {got['bytes']} vs {want['bytes']}, crc32 {got['crc32']} vs {want['crc32']}"


class DigestWriter:
  """A write-only file wrapper that counts the bytes written and folds them into a CRC-32.

  Args:
    f: the binary file written through (e.g. by `np.lib.format` or `np.save`).
  """

  def __init__(self, f: IO[bytes]):
    self.f, self.crc, self.bytes = f, 0, 0

  def write(self, data) -> int:
    """Writes `data` (bytes-like) to the file; returns what the file's `write` returns."""
    view = memoryview(data).cast("B")
    self.crc = zlib.crc32(view, self.crc)
    self.bytes += view.nbytes
    return self.f.write(view)

  def digest(self) -> Digest:
    """`{"bytes", "crc32"}` of everything written so far."""
    return {"bytes": self.bytes, "crc32": self.crc}
