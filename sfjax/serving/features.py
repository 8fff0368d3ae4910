"""Raw records -> the model's inputs, exactly as training mapped them (issue #23).

A record is a raw Criteo / Avazu text line (label column included, parsed by the
training readers, `sfjax.data.criteo` / `sfjax.data.avazu`) or a dict of feature name ->
raw value:
  criteo  I1..I13 (int, or its decimal text; "" = missing) and C1..C26 (str; "" = missing)
  avazu   the 21 categorical columns (str) and `hour` (YYMMDDHH), split as in training
  ids     (a synthetic-data run: no raw values) each field name -> its local row (int),
          and the dense names d0..d{Nd-1} -> float; a run on a feature layout (bags,
          sequences, shared tables; issue #22) takes lists of local ids for its bags and
          sequences (`sfjax.serving.layout_records`)
Categorical values become per-field local rows with the bundle's mapping: hashing (the
per-field salts and `hash_rows` recorded in the manifest; the key rule of
`sfjax.data.feature_map.value_keys`) or the vocabulary keys saved in the bundle.

`Features.ids` are LOCAL per-field rows ([n, F], 0 <= ids[:, f] < rows of field f, as in
`sfjax.data.Batch.ids`); the predictor adds the field offsets. With a feature layout they
are id columns [n, S] (-1 padding) with per-id `weights` [n, S]. Features concatenate
along n (`concat_features`), so a batcher can merge requests.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.core.errors import DataFormatError
from sfjax.data import avazu, criteo, feature_map, text_io
from sfjax.serving.layout_records import RecordError as RecordError
from sfjax.serving.layout_records import parse_layout_records

_AVAZU_HEADER = b"id,click,hour," + b",".join(c.encode() for c in avazu.CATEGORICAL_COLUMNS)


class Features(NamedTuple):
  """Mapped model inputs of n examples.

  Attributes:
    ids: [n, F] int64 local row of each field (0 <= ids[:, f] < rows of field f); with a
      feature layout [n, S] id columns local to each column's table, -1 = padding.
    dense: [n, Nd] float32 dense features, already transformed (Nd may be 0).
    weights: None (one-hot bundles), or with a feature layout [n, S] float32 per-id
      weights (0 in padding columns, 1 for unweighted ids).
  """

  ids: np.ndarray
  dense: np.ndarray
  weights: np.ndarray | None = None


def concat_features(parts: Sequence[Features]) -> Features:
  """The examples of `parts`, in order, as one `Features`."""
  arrays: list[Any] = [None if p[0] is None else np.concatenate(p, axis=0)
                        for p in zip(*parts, strict=True)]
  return Features(*arrays)


class FeatureMapping:
  """The bundle's raw value -> local row rule (manifest `mapping`).

  Args:
    mapping: the manifest's `mapping` entry.
    path: the bundle directory (vocabulary files are read from it).
  """

  def __init__(self, mapping: Mapping[str, Any], path: str):
    self.kind = mapping["kind"]
    if self.kind == "hashing":
      self.hash_rows = np.uint64(mapping["hash_rows"])
      self.salts = np.asarray([int(s, 16) for s in mapping["salts"]], np.uint64)
    elif self.kind == "vocabulary":
      self.salts = np.asarray([int(s, 16) for s in mapping["salts"]], np.uint64)
      self.vocab = [np.load(os.path.join(path, f)) for f in mapping["files"]]

  def __call__(self, values: np.ndarray) -> np.ndarray:
    """[n, F] raw bytes -> [n, F] int64 local rows."""
    keys = feature_map.value_keys(values, self.salts)
    if self.kind == "hashing":
      return (keys % self.hash_rows).astype(np.int64)
    ids = np.zeros(keys.shape, np.int64)
    for f, vocab in enumerate(self.vocab):  # rows 1..V in key order, 0 = out of vocabulary
      if vocab.shape[0]:
        pos = np.searchsorted(vocab, keys[:, f])
        found = vocab[np.minimum(pos, vocab.shape[0] - 1)] == keys[:, f]
        ids[:, f] = np.where(found, pos + 1, 0)
    return ids


class RecordParser:
  """Parses records (dicts or raw lines) into `Features` for one bundle.

  Args:
    manifest: the bundle's manifest.
    path: the bundle directory.
  """

  def __init__(self, manifest: Mapping[str, Any], path: str):
    self.record_format = manifest["record_format"]  # "criteo" | "avazu" | "ids"
    self.field_names = [f["name"] for f in manifest["features"]]
    self.dense_names = list(manifest["dense"]["names"])
    self.mapping = (None if self.record_format == "ids"
                    else FeatureMapping(manifest["mapping"], path))
    self.layout = (fl.layout_from_json(manifest["layout"]) if manifest.get("layout")
                   else None)

  def __call__(self, records: Sequence[Mapping[str, Any] | str]) -> Features:
    """[n] records -> Features [n, F], [n, Nd]; RecordError naming the record and field."""
    n = len(records)
    if self.layout is not None:  # bags, sequences, shared tables: records of local ids
      return Features(*parse_layout_records(records, self.layout, self.dense_names))
    if self.record_format == "ids":
      return self._ids_records(records)
    lines = [i for i, r in enumerate(records) if isinstance(r, (str, bytes))]
    assert self.mapping is not None  # record_format 'ids' returned above
    if lines and len(lines) == n:  # only raw lines: the reader's arrays as they are
      raw = self._parse_lines(list(records), lines)
      return Features(self.mapping(raw.values), np.asarray(raw.dense, np.float32))
    values = np.full((n, len(self.field_names)), b"", dtype=object)
    dense = np.zeros((n, len(self.dense_names)), np.float32)
    if lines:
      raw = self._parse_lines([records[i] for i in lines], lines)
      for j, i in enumerate(lines):
        values[i], dense[i] = raw.values[j], raw.dense[j]
    for i, record in enumerate(records):
      if isinstance(record, (str, bytes)):
        continue
      if not isinstance(record, Mapping):
        raise RecordError(f"record {i}: expected a dict of feature values or a raw "
                          f"{self.record_format} line, got {type(record).__name__}")
      values[i], dense[i] = self._dict_record(i, record)
    as_bytes = values.astype(bytes) if n else np.zeros((0, len(self.field_names)), "S1")
    return Features(self.mapping(as_bytes.reshape(n, -1)), dense)

  def _parse_lines(self, lines: list, indices: list[int]) -> text_io.RawChunk:
    """Raw lines -> RawChunk, parsed by the training reader of the bundle's format."""
    data = [(x if isinstance(x, bytes) else x.encode("utf-8")).rstrip(b"\r\n") + b"\n"
            for x in lines]
    if self.record_format == "criteo":
      parse, _ = criteo.CriteoFormat().start_file(io.BytesIO(b""), "request")
    else:
      parse, _ = avazu.AvazuFormat().start_file(io.BytesIO(_AVAZU_HEADER + b"\n"), "request")
    try:
      raw, _ = parse(text_io.LineChunk("request", 1, data), False)
    except DataFormatError as err:
      index = indices[err.line - 1] if 0 < getattr(err, "line", 0) <= len(indices) else "?"
      raise RecordError(f"record {index}: bad {self.record_format} line: {err.reason}") from None
    return raw

  def _dict_record(self, i: int, record: Mapping[str, Any]) -> tuple[list[bytes], np.ndarray]:
    """One dict record -> (F raw values, [Nd] dense)."""
    if self.record_format == "criteo":
      values = [_categorical(i, record, name) for name in self.field_names]
      ints = np.asarray([[_integer(i, record, name) for name in self.dense_names]], np.int64)
      return values, text_io.signed_log1p(ints)[0]
    values = [_categorical(i, record, name) for name in avazu.CATEGORICAL_COLUMNS]
    hour = _categorical(i, record, "hour")
    try:
      values.extend(avazu.split_hour(hour))
    except ValueError as err:
      raise RecordError(f"record {i}: field 'hour': {err}") from None
    return values, np.zeros((0,), np.float32)

  def _ids_records(self, records) -> Features:
    """Records of a run without raw values: dicts of local rows and dense floats."""
    ids = np.zeros((len(records), len(self.field_names)), np.int64)
    dense = np.zeros((len(records), len(self.dense_names)), np.float32)
    for i, record in enumerate(records):
      if not isinstance(record, Mapping):
        raise RecordError(f"record {i}: this bundle's run had no raw values (synthetic data): "
                          f"send a dict of field -> row id, got {type(record).__name__}")
      for f, name in enumerate(self.field_names):
        ids[i, f] = _require(i, record, name, int)
      for d, name in enumerate(self.dense_names):
        dense[i, d] = _require(i, record, name, (int, float))
    return Features(ids, dense)


def _require(i: int, record: Mapping[str, Any], name: str, types):
  """record[name], which must be one of `types` (not bool)."""
  if name not in record:
    raise RecordError(f"record {i}: missing feature {name!r}")
  value = record[name]
  if isinstance(value, bool) or not isinstance(value, types):
    raise RecordError(f"record {i}: feature {name!r} has the wrong type "
                      f"{type(value).__name__}")
  return value


def _categorical(i: int, record: Mapping[str, Any], name: str) -> bytes:
  """A categorical raw value as the bytes training hashed (str or int; "" = missing)."""
  value = _require(i, record, name, (str, int))
  text = (str(value) if isinstance(value, int) else value).encode("utf-8")
  if b"\0" in text:
    raise RecordError(f"record {i}: feature {name!r} contains a NUL character")
  return text


def _integer(i: int, record: Mapping[str, Any], name: str) -> int:
  """A Criteo integer feature (int, or its decimal text; "" = missing = 0)."""
  value = _require(i, record, name, (str, int))
  if isinstance(value, int):
    if not -2**63 <= value < 2**63:
      raise RecordError(f"record {i}: feature {name!r} is outside int64")
    return value
  try:
    return int(value) if value.strip() else 0
  except ValueError:
    raise RecordError(f"record {i}: feature {name!r} is not an integer: {value[:40]!r}") from None
