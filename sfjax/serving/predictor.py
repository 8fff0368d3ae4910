"""`Predictor`: a serving bundle loaded for scoring, with jax and numpy only (issue #23).

  p = Predictor.load(BUNDLE)                     # every file verified, each batch size compiled
  p.predict([line_or_dict, ...]) -> [n] float32  # probabilities
  p.predict_ids(ids [n, F], dense [n, Nd])       # already mapped (local per-field rows)
  p.predict_ids(ids [n, S], dense, weights [n, S])  # a feature-layout bundle (-1 padding)

No model class, no flax and no training config is imported: the forward is the bundle's
`jax.export` (deserialized and compiled once per batch size at load, never per request),
the rows come from a `row_source.RowSource`. A request of n examples is padded to the
smallest compiled size >= n; n above the largest is split into chunks of that size.
Logits equal the trainer's eval logits on the same examples (fp32 tables: <= 1e-6).

Where the rows are gathered: with rows="memory" (one id per field) the table is put on
the device once and each batch of a compiled size >= `device_gather_min_batch` runs
`forward_program.DeviceGather`: ids in, logits out, the gather inside the forward's
program (no host gather, and ids [b, F] cross to the device instead of rows [b, F, E]).
Smaller sizes, mmap, cache, feature layouts and `device_table=False` gather on the host
and run `compile_gathered_forward` on the rows. Each is one dispatch per batch, and both give the
same logits bit for bit. `forward_program(b)` is that forward alone (the benchmark's
floor). Measured on 2 busy cores (DeepFM 26 x 100k, dim 16, MLP 400^3, p10 of
interleaved calls): the device gather takes 1-12% less time than the host gather at
batch 64-4096 (4096: the ~2.5 ms numpy gather and the 7 MB copy-in go), 0-10% more at
1-8 (XLA splits its gather over both cores' threads, which a few rows do not repay).

A bundle of a feature-layout run (bags, sequences, shared tables; manifest `layout`)
takes id columns [n, S] local to each column's table, -1 in unused columns, and per-id
weights [n, S]. Its rows go through VSI as in training (`sfjax.embedding.vsi`): the
local ids become global rows (`global_row_ids`, padding kept at -1), are deduplicated
(`dedup_ids`: padding points at the spare entry U), the unique rows are read once from
the row source (padding entries read zeros, in every row mode) and `emb = uniq[vids]`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.embedding import vsi
from sfjax.serving import forward_program as programs
from sfjax.serving import manifest as manifest_lib
from sfjax.serving import row_source
from sfjax.serving.features import Features, RecordParser

DEFAULT_BATCH_SIZES = (1, 8, 64, 512, 4096)


def _manifest_layout(manifest: Mapping[str, Any]) -> fl.FeatureLayout | None:
  """The feature layout a bundle records (`layout`), or None (one one-hot id per field)."""
  return fl.layout_from_json(manifest["layout"]) if manifest.get("layout") else None


def _sigmoid(x: np.ndarray) -> np.ndarray:
  """Stable logistic of float32 logits, as float32: 1 / (1 + e) for x >= 0, e / (1 + e)
  below, e = exp(-|x|) in float64 (one division: a fifth of a one-example predict's
  host time went to this function's ufunc calls)."""
  x = np.asarray(x, np.float64)
  e = np.exp(-np.abs(x))
  return (np.where(x >= 0, 1.0, e) / (1.0 + e)).astype(np.float32)


class Predictor:
  """A loaded bundle: parse records, gather rows, run the compiled forward.

  Build with `Predictor.load`. Attributes: `manifest` (the bundle's manifest.json),
  `batch_sizes` (the compiled sizes, ascending), `rows` (the `RowSource`), `path`,
  `device_table` (True when some batch sizes gather on the device).
  Threads may share it (`DeviceGather` calls take turns on its reused buffers).
  """

  def __init__(self, path: str, manifest: dict[str, Any], forward, params: list,
               rows: row_source.RowSource, batch_sizes: Sequence[int], *,
               device_table: bool = True, device_gather_min_batch: int = 64,
               compiler_options: Mapping[str, Any] | None = None):
    self.path, self.manifest, self.rows = path, manifest, rows
    self.batch_sizes = tuple(sorted({int(b) for b in batch_sizes}))
    features = manifest["features"]
    self.num_fields, self.num_dense = len(features), len(manifest["dense"]["names"])
    self.width = int(manifest["tables"][0]["dim"])
    self.layout = _manifest_layout(manifest)
    if self.layout is None:
      self.field_rows = np.asarray([f["rows"] for f in features], np.int64)  # [F]
      self.offsets = np.asarray([f["offset"] for f in features], np.int64)  # [F]
    else:  # per id column [S]: its table's rows and start
      self.field_rows, self.offsets = self.layout.column_rows, self.layout.column_offsets
    self.num_columns = self.field_rows.shape[0]  # F, or S with a layout
    self._parser = RecordParser(manifest, path)
    self._params = [jax.device_put(p) for p in params]
    self._forward, self._options = forward, dict(compiler_options or {})
    self._compiled: dict[int, Any] = {}  # batch -> compile_gathered_forward (host-gathered emb)
    on_device = [b for b in self.batch_sizes if b >= device_gather_min_batch]
    self._device = (self._device_gather(rows, on_device)
                    if device_table and on_device else None)
    for b in self.batch_sizes:  # every size compiled at load, never per request
      if self._device is None or b not in self._device.programs:
        self.forward_program(b)

  @property
  def device_table(self) -> bool:
    """True when batches of the larger sizes gather their rows on the device."""
    return self._device is not None

  def _device_gather(self, rows: row_source.RowSource,
                     sizes: list[int]) -> programs.DeviceGather | None:
    """The memory table on the device for `sizes` (the host rows then view the device
    buffer: one copy in RAM on CPU), or None where rows are gathered on the host (mmap,
    cache, a feature layout, or a table that does not fit: `programs.table_fits`)."""
    if self.layout is not None or not isinstance(rows, row_source.MemoryRows):
      return None
    if not programs.table_fits(rows.num_rows, rows.values.nbytes,
                               jax.devices()[0].memory_stats()):
      return None
    device = programs.DeviceGather(self._forward, self._params, rows.values, self.offsets,
                                   sizes, self.num_dense, options=self._options)
    rows.values = np.asarray(device.table)  # CPU: a read-only view of the same buffer
    return device

  @classmethod
  def load(cls, path: str, *, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
           rows: str = "memory", cache_rows: int = 0, cache_policy: str = "lru",
           device_table: bool = True, device_gather_min_batch: int = 64,
           compiler_options: Mapping[str, Any] | None = None) -> Predictor:
    """Loads and verifies the bundle at `path` and compiles the forward for `batch_sizes`.

    Args:
      path: the bundle directory.
      batch_sizes: compiled batch sizes (each >= 1).
      rows: "memory" (table decoded to float32 in RAM), "mmap" (`row_source.MmapRows`) or
        "cache" (a device row cache over the mmap files, `row_cache.CachedRows`: a table
        larger than RAM; `predictor.rows.stats()` gives its hit rate and bytes moved).
      cache_rows: "cache": rows held on the device (0: 4 x largest batch x fields).
      cache_policy: "cache": "lru" or "lfu".
      device_table: "memory": hold the table on the device and gather in the forward's
        program; False gathers on the host (a GPU too small for the table).
      device_gather_min_batch: the smallest compiled size that gathers on the device
        (smaller ones gather on the host: see the module docstring).
      compiler_options: XLA options of the forward's compiles
        (`forward_program.parse_compiler_options`); None: XLA's defaults.

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
    layout = _manifest_layout(manifest)
    per_example = len(manifest["features"]) if layout is None else layout.num_columns
    table = row_source.open_rows(  # a layout's gathers add the spare padding entry
        path, manifest["tables"][0], rows, cache_rows=cache_rows, policy=cache_policy,
        unique_capacity=max(batch_sizes) * per_example + (layout is not None))
    return cls(path, manifest, forward, params, table, batch_sizes,
               device_table=device_table, device_gather_min_batch=device_gather_min_batch,
               compiler_options=compiler_options)

  def forward_program(self, batch: int):
    """The bundle's forward alone for `batch` examples (compiled on first use):
    `(params, emb [b, C, E], dense [b, Nd][, weights [b, C]]) -> logits [b]`."""
    if batch not in self._compiled:
      self._compiled[batch] = programs.compile_gathered_forward(
          self._forward, self._params, batch, self.num_columns, self.width, self.num_dense,
          with_weights=self.layout is not None, options=self._options)
    return self._compiled[batch]

  def forward_logits(self, emb, dense, weights=None) -> jax.Array:
    """The forward alone on gathered rows emb [b, C, E] and dense [b, Nd] (b: any size,
    compiled on first use) -> logits [b] on the device, not waited for."""
    extra = () if weights is None else (weights,)
    return self.forward_program(int(emb.shape[0]))(self._params, emb, dense, *extra)

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
    """[n] float32 logits of mapped features (ids [n, F] local rows, dense [n, Nd]; with
    a feature layout ids [n, S] with -1 padding and weights [n, S])."""
    ids, dense, weights = self._check(features)
    n, top = ids.shape[0], self.batch_sizes[-1]
    out = np.empty((n,), np.float32)
    for lo in range(0, n, top):
      hi = min(n, lo + top)
      out[lo:hi] = self._run(ids[lo:hi], dense[lo:hi],
                             None if weights is None else weights[lo:hi])
    return out

  def _run(self, ids: np.ndarray, dense: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Logits of m <= max batch examples, padded to the smallest compiled size >= m."""
    m = ids.shape[0]
    size = next(b for b in self.batch_sizes if b >= m)
    if self._device is not None and size in self._device.programs:
      return self._device(self._params, ids, dense, size)
    padded = np.zeros((size, self.num_dense), np.float32)
    padded[:m] = dense
    if weights is None:
      rows = np.zeros((size, self.num_fields), np.int64)
      rows[:m] = ids + self.offsets[None, :]
      emb = self.rows.gather(rows.reshape(-1)).reshape(size, self.num_fields, self.width)
      return np.asarray(self._compiled[size](self._params, emb, padded))[:m]
    local = np.full((size, self.num_columns), fl.PADDING_ID, np.int64)  # padding examples
    local[:m] = ids
    padded_weights = np.zeros((size, self.num_columns), np.float32)
    padded_weights[:m] = weights
    emb = self._layout_rows(local)
    return np.asarray(self._compiled[size](self._params, emb, padded, padded_weights))[:m]

  def _layout_rows(self, local: np.ndarray):
    """emb [b, S, E] of local id columns [b, S] (-1 padding) through VSI; zeros at padding."""
    rows = vsi.global_row_ids(local, self.offsets, column_rows=self.field_rows,
                              allow_padding=True)
    virt = vsi.dedup_ids(rows, rows.size + 1, pad_id=fl.PADDING_ID)  # + the spare entry U
    uniq_values = self.rows.gather(virt.uniq)  # [U_cap, E]; entries U.. (padding) are zeros
    return uniq_values[virt.vids]

  def _check(self, features: Features) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(ids int64 [n, F|S], dense float32 [n, Nd], weights [n, S] or None) of `features`,
    shapes and ranges checked."""
    ids, dense = np.asarray(features.ids), np.asarray(features.dense, np.float32)
    width = self.num_columns
    if ids.ndim != 2 or ids.shape[1] != width or ids.dtype.kind not in "iu":
      what = "id columns" if self.layout is not None else "fields"
      raise ValueError(f"ids: expected integer [n, {width}] ({what}), got {ids.dtype} "
                       f"{ids.shape}")
    if dense.shape != (ids.shape[0], self.num_dense):
      raise ValueError(f"dense: expected [{ids.shape[0]}, {self.num_dense}], got {dense.shape}")
    ids = ids.astype(np.int64, copy=False)
    if self.layout is None:
      if features.weights is not None:
        raise ValueError(f"weights: this bundle's model takes no per-id weights ({self.path} "
                         "has no feature layout)")
      low, weights = 0, None
    else:
      low, weights = fl.PADDING_ID, self._check_weights(ids, features.weights)
    bad = (ids < low) | (ids >= self.field_rows[None, :])
    if bad.any():
      i, c = map(int, np.argwhere(bad)[0])
      raise ValueError(f"ids[{i}, {c}] = {ids[i, c]}: {self._column_name(c)} has rows "
                       f"[0, {self.field_rows[c]})")
    return ids, dense, weights

  def _check_weights(self, ids: np.ndarray, weights) -> np.ndarray:
    """float32 [n, S] weights of a layout bundle's ids: given, finite, 0 at padding."""
    if weights is None:
      raise ValueError(f"weights: this bundle ({self.path}) has a feature layout: give per-id "
                       "weights [n, S] (0 in padding columns, 1 for unweighted ids)")
    weights = np.asarray(weights, np.float32)
    if weights.shape != ids.shape:
      raise ValueError(f"weights: expected {list(ids.shape)} like ids, got {list(weights.shape)}")
    bad = ~np.isfinite(weights) | ((ids == fl.PADDING_ID) & (weights != 0))
    if bad.any():
      i, c = map(int, np.argwhere(bad)[0])
      raise ValueError(f"weights[{i}, {c}] = {weights[i, c]}: {self._column_name(c)}: weights "
                       "must be finite, and 0 in padding columns (id -1)")
    return weights

  def _column_name(self, column: int) -> str:
    """'field <name>', or 'feature <name> (column c)' of a layout bundle."""
    if self.layout is None:
      return f"field {self.manifest['features'][column]['name']!r}"
    feature = self.layout.features[int(self.layout.column_features[column])]
    return f"feature {feature.name!r} (id column {column}, table {feature.table!r})"

  def predict_features(self, features: Features) -> np.ndarray:
    """[n] float32 click probabilities of mapped features."""
    return _sigmoid(self.logits_features(features))

  def predict_ids(self, ids, dense, weights=None) -> np.ndarray:
    """[n] float32 probabilities of local rows `ids` [n, F] and dense features [n, Nd]
    (a feature-layout bundle: ids [n, S] with -1 padding and `weights` [n, S])."""
    return self.predict_features(Features(np.asarray(ids), np.asarray(dense, np.float32),
                                          None if weights is None else np.asarray(weights)))

  def predict(self, records: Sequence[Mapping[str, Any] | str]) -> np.ndarray:
    """[n] float32 probabilities of raw records (`parse_records`, then `predict_features`)."""
    return self.predict_features(self.parse_records(records))
