"""`Predictor`: a serving bundle loaded for scoring, with jax and numpy only (issue #23).

  p = Predictor.load(BUNDLE)                     # every file verified, each batch size compiled
  p.predict([line_or_dict, ...]) -> [n] float32  # probabilities
  p.predict_ids(ids [n, F], dense [n, Nd])       # already mapped (local per-field rows)

No model class, no flax and no training config is imported: the forward is the bundle's
`jax.export` (deserialized and compiled once per batch size at load, never per request),
the rows come from a `row_source.RowSource`. A request of n examples is padded to the
smallest compiled size >= n; n above the largest is split into chunks of that size.
Logits equal the trainer's eval logits on the same examples (fp32 tables: <= 1e-6).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from sfjax.serving import manifest as manifest_lib
from sfjax.serving import row_source
from sfjax.serving.features import Features, RecordParser

DEFAULT_BATCH_SIZES = (1, 8, 64, 512, 4096)


def _sigmoid(x: np.ndarray) -> np.ndarray:
  """Stable logistic of float32 logits, as float32."""
  x = np.asarray(x, np.float64)
  e = np.exp(-np.abs(x))
  return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)


class Predictor:
  """A loaded bundle: parse records, gather rows, run the compiled forward.

  Build with `Predictor.load`. Attributes: `manifest` (the bundle's manifest.json),
  `batch_sizes` (the compiled sizes, ascending), `rows` (the `RowSource`), `path`.
  """

  def __init__(self, path: str, manifest: dict[str, Any], forward, params: list,
               rows: row_source.RowSource, batch_sizes: Sequence[int]):
    self.path, self.manifest, self.rows = path, manifest, rows
    self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
    features = manifest["features"]
    self.num_fields, self.num_dense = len(features), len(manifest["dense"]["names"])
    self.width = int(manifest["tables"][0]["dim"])
    self.field_rows = np.asarray([f["rows"] for f in features], np.int64)  # [F]
    self.offsets = np.asarray([f["offset"] for f in features], np.int64)  # [F]
    self._parser = RecordParser(manifest, path)
    self._params = [jax.device_put(p) for p in params]
    self._compiled = {b: self._compile(forward, b) for b in self.batch_sizes}

  @classmethod
  def load(cls, path: str, *, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
           rows: str = "memory", cache_rows: int = 0, cache_policy: str = "lru") -> Predictor:
    """Loads and verifies the bundle at `path` and compiles the forward for `batch_sizes`.

    Args:
      path: the bundle directory.
      batch_sizes: compiled batch sizes (each >= 1).
      rows: "memory" (table decoded to float32 in RAM), "mmap" (`row_source.MmapRows`) or
        "cache" (a device row cache over the mmap files, `row_cache.CachedRows`: a table
        larger than RAM; `predictor.rows.stats()` gives its hit rate and bytes moved).
      cache_rows: "cache": rows held on the device (0: 4 x largest batch x fields).
      cache_policy: "cache": "lru" or "lfu".

    Raises:
      manifest.BundleError: naming a missing, truncated or altered file.
    """
    path = os.fspath(path)
    if not batch_sizes or any(int(b) < 1 for b in batch_sizes):
      raise ValueError(f"batch_sizes must be positive integers, got {tuple(batch_sizes)}")
    manifest = manifest_lib.verify_bundle(path)
    with open(os.path.join(path, manifest["forward"]["file"]), "rb") as f:
      forward = jax.export.deserialize(bytearray(f.read()))
    params = [np.load(os.path.join(path, p["file"])) for p in manifest["forward"]["params"]]
    table = row_source.open_rows(path, manifest["tables"][0], rows, cache_rows=cache_rows,
                                 unique_capacity=max(batch_sizes) * len(manifest["features"]),
                                 policy=cache_policy)
    return cls(path, manifest, forward, params, table, batch_sizes)

  def _compile(self, forward, batch: int):
    """The forward compiled for `batch` examples."""
    emb = jax.ShapeDtypeStruct((batch, self.num_fields, self.width), np.float32)
    dense = jax.ShapeDtypeStruct((batch, self.num_dense), np.float32)
    return jax.jit(forward.call).lower(self._params, emb, dense).compile()

  def parse_records(self, records: Sequence[Mapping[str, Any] | str]) -> Features:
    """Records (dicts of raw feature values, or raw Criteo / Avazu lines) -> Features.

    Raises:
      RecordError: naming the record index and the field (missing, wrong type, bad line).
    """
    if isinstance(records, (str, bytes, Mapping)):
      raise TypeError("records must be a sequence of records, not a single record")
    return self._parser(records)

  def map_values(self, values: np.ndarray, dense: np.ndarray) -> Features:
    """Parsed raw values [n, F] bytes (a training reader's `RawChunk.values`) and their
    transformed dense [n, Nd] -> Features, with the bundle's mapping."""
    if self._parser.mapping is None:
      raise ValueError(f"{self.path}: this bundle's run had no raw values (data.format "
                       "without a text mapping); give row ids instead")
    return Features(self._parser.mapping(values), np.asarray(dense, np.float32))

  def logits_features(self, features: Features) -> np.ndarray:
    """[n] float32 logits of mapped features (ids [n, F] local rows, dense [n, Nd])."""
    ids, dense = self._check(features)
    n, top = ids.shape[0], self.batch_sizes[-1]
    out = np.empty((n,), np.float32)
    for lo in range(0, n, top):
      hi = min(n, lo + top)
      out[lo:hi] = self._run(ids[lo:hi], dense[lo:hi])
    return out

  def _run(self, ids: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """Logits of m <= max batch examples, padded to the smallest compiled size >= m."""
    m = ids.shape[0]
    size = next(b for b in self.batch_sizes if b >= m)
    rows = np.zeros((size, self.num_fields), np.int64)
    rows[:m] = ids + self.offsets[None, :]
    padded = np.zeros((size, self.num_dense), np.float32)
    padded[:m] = dense
    emb = self.rows.gather(rows.reshape(-1)).reshape(size, self.num_fields, self.width)
    return np.asarray(self._compiled[size](self._params, emb, padded))[:m]

  def _check(self, features: Features) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 [n, F], dense float32 [n, Nd]) of `features`, shapes and ranges checked."""
    ids, dense = np.asarray(features.ids), np.asarray(features.dense, np.float32)
    if ids.ndim != 2 or ids.shape[1] != self.num_fields or ids.dtype.kind not in "iu":
      raise ValueError(f"ids: expected integer [n, {self.num_fields}], got {ids.dtype} "
                       f"{ids.shape}")
    if dense.shape != (ids.shape[0], self.num_dense):
      raise ValueError(f"dense: expected [{ids.shape[0]}, {self.num_dense}], got {dense.shape}")
    ids = ids.astype(np.int64)
    bad = (ids < 0) | (ids >= self.field_rows[None, :])
    if bad.any():
      i, f = map(int, np.argwhere(bad)[0])
      raise ValueError(f"ids[{i}, {f}] = {ids[i, f]}: field "
                       f"{self.manifest['features'][f]['name']!r} has rows "
                       f"[0, {self.field_rows[f]})")
    return ids, dense

  def predict_features(self, features: Features) -> np.ndarray:
    """[n] float32 click probabilities of mapped features."""
    return _sigmoid(self.logits_features(features))

  def predict_ids(self, ids, dense) -> np.ndarray:
    """[n] float32 probabilities of local rows `ids` [n, F] and dense features [n, Nd]."""
    return self.predict_features(Features(np.asarray(ids), np.asarray(dense, np.float32)))

  def predict(self, records: Sequence[Mapping[str, Any] | str]) -> np.ndarray:
    """[n] float32 probabilities of raw records (`parse_records`, then `predict_features`)."""
    return self.predict_features(self.parse_records(records))
