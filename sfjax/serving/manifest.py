"""The serving bundle's manifest: format name and version, file digests, verification.

A bundle is one directory (written by `sfjax.serving.bundle.write_bundle`):

  manifest.json          this module's format; written last, atomically
  forward.bin            `jax.export` of `(dense leaves, emb [B, F, E], dense [B, Nd])
                         -> logits [B]` (serialized StableHLO, B symbolic); a run on a
                         feature layout (manifest `layout`: bags, sequences, shared
                         tables): `(dense leaves, emb [B, S, E], dense, weights [B, S])`
  dense/leaf_<i>.npy     the model's dense parameters, in the exported function's leaf order
  table/rows_<lo>.npy    table rows [lo, lo + n): float32, float16 or int8 [n, E]
  table/scales_<lo>.npy  int8 only: float32 [n] per-row symmetric scales (row = q * scale)
  mapping/...            vocabulary keys (`mapping.kind == "vocabulary"`)

A lazily initialised table (version 2; `sfjax.serving.lazy_table`) stores only its
written rows, `table/written_ids.npy` and `table/written_<i>.npy`, and the rule that
gives every other row (`tables[0]["init"]`).

Every file is listed under `files` with its size and CRC-32 (`sfjax.core.digest`);
`verify_bundle` reads and checks them all before anything is used, so a flipped byte or a
truncated file fails with an error naming the file. Numpy and the standard library only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sfjax.core import digest

FORMAT_NAME = "sfjax.serving_bundle"
FORMAT_VERSION = 1
LAZY_FORMAT_VERSION = 2  # a bundle with a lazily initialised table (`lazy_table`)
READ_VERSIONS = (FORMAT_VERSION, LAZY_FORMAT_VERSION)
MANIFEST_FILE = "manifest.json"
TABLE_DTYPES = ("float32", "float16", "int8")


class BundleError(ValueError):
  """A bundle that cannot be served: missing, corrupt or of another format (names the file)."""


def file_entry(root: str, rel: str) -> dict[str, Any]:
  """`{"file": rel, "bytes", "crc32"}` of the file `root/rel` as written."""
  return {"file": rel, **digest.file_digest(os.path.join(root, rel))}


def read_bundle_manifest(path: str) -> dict[str, Any]:
  """The bundle's manifest.json, its format and version checked (no file digests read).

  Raises:
    BundleError: naming manifest.json (missing, not JSON, another format or version).
  """
  where = os.path.join(path, MANIFEST_FILE)
  try:
    with open(where, encoding="utf-8") as f:
      manifest = json.load(f)
  except FileNotFoundError:
    raise BundleError(f"{where}: no manifest (not a serving bundle, or its export did not "
                      "finish)") from None
  except (OSError, ValueError) as err:
    raise BundleError(f"{where}: unreadable manifest: {err}") from err
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
    raise BundleError(f"{where}: not a serving bundle manifest (format "
                      f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                      f"expected {FORMAT_NAME!r})")
  if manifest.get("version") not in READ_VERSIONS:
    raise BundleError(f"{where}: bundle format version {manifest.get('version')!r}; this sfjax "
                      f"reads versions {', '.join(map(str, READ_VERSIONS))}")
  return manifest


def verify_files(path: str, manifest: dict[str, Any]) -> None:
  """Checks the size and CRC-32 of every file the manifest lists.

  Raises:
    BundleError: naming the first missing, truncated or altered file.
  """
  for entry in manifest["files"]:
    where = os.path.join(path, entry["file"])
    try:
      got = digest.file_digest(where)
    except OSError as err:
      raise BundleError(f"{where}: missing or unreadable bundle file: {err}") from err
    why = digest.mismatch(got, entry)
    if why:
      raise BundleError(f"{where}: bundle file is corrupt or truncated ({why})")


def verify_bundle(path: str) -> dict[str, Any]:
  """The manifest of the bundle at `path` once every file it lists has verified."""
  manifest = read_bundle_manifest(path)
  verify_files(path, manifest)
  return manifest
