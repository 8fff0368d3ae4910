"""Batch scoring: a bundle's scores for whole input files, in input order (`score_files`).

Streams the input (Criteo / Avazu text, .gz allowed, through the training readers
`sfjax.data.text_io`; preprocessed split directories, `sfjax.data.shards`; or JSON lines,
one record per line as the HTTP endpoint takes them, e.g. `{"user": 3, "history": [5, 9],
"d0": 0.1, "label": 1}` for a feature-layout bundle, the optional `label` giving the
AUC), scores it with `Predictor` chunk by chunk and writes the probabilities, float32 [n]
in input order, as `.npy`. `python -m experiments.predict` is its command line.
"""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from sfjax.core import metrics as metrics_lib
from sfjax.core.atomic import atomic_write
from sfjax.data import avazu, criteo, shards, text_io
from sfjax.serving.features import Features, RecordError
from sfjax.serving.predictor import Predictor

_TEXT_FORMATS: dict[str, Callable[[], text_io.LineFormat]] = {
    "criteo": criteo.CriteoFormat, "avazu": avazu.AvazuFormat}
SCORING_FORMATS = (*_TEXT_FORMATS, "preprocessed", "jsonl")
LABEL_KEY = "label"  # a JSON-lines record's optional label (0 or 1)


def json_records(paths: Sequence[str], chunk: int) -> Iterator[tuple[list, np.ndarray]]:
  """(records, labels [n]; NaN where a record has none) of JSON-lines files, `chunk` at a time.

  Raises:
    ValueError: naming the file and line of a line that is not a JSON object or whose
      label is not 0 or 1.
  """
  records, labels = [], []
  for path in paths:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
        except ValueError as err:
          raise ValueError(f"{path}:{number}: not a JSON record: {err}") from None
        if not isinstance(record, dict):
          raise ValueError(f"{path}:{number}: a record must be a JSON object, got "
                           f"{type(record).__name__}")
        label = record.pop(LABEL_KEY, None)
        if label is not None and (isinstance(label, bool) or label not in (0, 1)):
          raise ValueError(f"{path}:{number}: {LABEL_KEY!r} must be 0 or 1, got {label!r}")
        records.append(record)
        labels.append(np.nan if label is None else float(label))
        if len(records) == chunk:
          yield records, np.asarray(labels, np.float32)
          records, labels = [], []
  if records:
    yield records, np.asarray(labels, np.float32)


def input_chunks(predictor: Predictor, pattern: str, fmt: str,
                 chunk: int) -> Iterator[tuple[Features, np.ndarray]]:
  """(features, labels [n]) of the input, chunk by chunk, in file and line order."""
  paths = text_io.expand_paths(pattern, "--input")
  if fmt == "preprocessed":
    for path in paths:  # split directories (DIR/eval), their ids already mapped
      for batch in shards.ShardSplit(path).chunks(chunk):
        yield Features(batch.ids, batch.dense, batch.weights), batch.labels
    return
  if fmt == "jsonl":
    first = 0
    for records, labels in json_records(paths, chunk):
      try:
        yield predictor.parse_records(records), labels
      except RecordError as err:  # its "record i" counts from the chunk's first record
        raise RecordError(f"--input records {first}..{first + len(records) - 1}: {err}") from None
      first += len(records)
    return
  for raw in text_io.TextReader(paths, _TEXT_FORMATS[fmt](), chunk_lines=chunk):
    yield predictor.map_values(raw.values, raw.dense), raw.labels


def score_files(bundle: str, input_pattern: str, out: str, fmt: str | None = None,
        chunk: int = 65536, batch_sizes=(64, 512, 4096),
        log: Callable[[str], None] = print) -> dict:
  """Scores the input with the bundle; writes `out` (.npy, float32 [n]); returns the summary.

  Args:
    bundle: the serving bundle directory.
    input_pattern: comma-separated globs of input files (or preprocessed split dirs).
    out: the scores file (`.npy`), written atomically at the end.
    fmt: criteo | avazu | preprocessed | jsonl; None: the bundle's record format (jsonl
      for a bundle whose records are ids).
    chunk: examples read per step.
    batch_sizes: the predictor's compiled batch sizes.
    log: where progress lines go.

  Raises:
    ValueError: an unknown format, or one the bundle cannot map; no input file.
  """
  predictor = Predictor.load(bundle, batch_sizes=batch_sizes)
  fmt = fmt or predictor.manifest["record_format"]
  if fmt == "ids":  # records of local ids (synthetic data, a feature layout): JSON lines
    fmt = "jsonl"
  if fmt not in SCORING_FORMATS:
    raise ValueError(f"--format: must be one of {', '.join(SCORING_FORMATS)}, got {fmt!r}")
  start, scores, labels, last = time.perf_counter(), [], [], 0.0
  for features, chunk_labels in input_chunks(predictor, input_pattern, fmt, chunk):
    scores.append(predictor.predict_features(features))
    labels.append(np.asarray(chunk_labels, np.float32))
    now = time.perf_counter()
    if now - last >= 5.0:
      done = sum(s.shape[0] for s in scores)
      log(f"scored {done} examples ({done / max(now - start, 1e-9):.0f} examples/s)")
      last = now
  probs = np.concatenate(scores) if scores else np.zeros((0,), np.float32)
  seconds = time.perf_counter() - start
  atomic_write(out, lambda f: np.save(f, probs))
  summary = {"examples": int(probs.shape[0]), "seconds": round(seconds, 3),
             "examples_per_sec": probs.shape[0] / max(seconds, 1e-9), "out": out}
  all_labels = np.concatenate(labels) if labels else np.zeros((0,), np.float32)
  if probs.shape[0] and not np.isnan(all_labels).any() and (
      0 < all_labels.sum() < all_labels.shape[0]):
    summary["auc"] = metrics_lib.auc(all_labels, probs)
    summary["logloss"] = metrics_lib.logloss(all_labels, probs)
  return summary
