"""Records of a feature-layout model -> id columns and per-id weights (issue #22).

A model trained on a feature layout (bags, weighted bags, sequences, shared tables;
`sfjax.core.feature_layout`) reads `ids [n, S]` and `weights [n, S]` laid out as the
training readers lay them out (`sfjax.data.parquet.dataset.chunk_batch`): feature f owns the
columns `layout.columns(f)`, ids are LOCAL to the feature's table, unused columns hold
-1 and weight 0. A record (the "ids" record kind: data sets without raw text values) is
a dict:

  <one_hot feature>    its local id (int)
  <multi_hot feature>  a list of local ids (a bag); missing = an empty bag
  <sequence feature>   a list of local ids in time order, most recent LAST; missing = empty
  <name>_weights       a weighted bag's per-id weights (list of numbers, one per id)
  <dense name>         a number

Longer lists are truncated as in training: a bag keeps its first `capacity` ids, a
sequence its last (most recent) ones, left-aligned. Unweighted ids weigh 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sfjax.core import feature_layout as fl


class RecordError(ValueError):
  """A record that cannot be mapped; the message names the record index and the field."""


def weights_key(name: str) -> str:
  """The record key of feature `name`'s per-id weights."""
  return f"{name}_weights"


def _is_int(value: Any) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _as_list(i: int, name: str, value: Any) -> Sequence[Any]:
  """`value`, which must be a list (or tuple) for a bag or sequence feature."""
  if isinstance(value, (list, tuple)):
    return value
  raise RecordError(f"record {i}: feature {name!r} is a bag or sequence: send a list of ids, "
                    f"got {type(value).__name__}")


def _kept(kind: str, length: int, capacity: int) -> slice:
  """The positions training keeps of a list of `length` ids (bags: first; sequences: last)."""
  if kind == "sequence":
    return slice(max(length - capacity, 0), length)
  return slice(0, min(length, capacity))


def _feature_ids(i: int, record: Mapping[str, Any], spec: fl.FeatureSpec, rows: int
                 ) -> tuple[list[int], list[float]]:
  """(kept local ids, their weights) of one feature of record i."""
  name = spec.name
  if spec.kind == "one_hot":
    if name not in record:
      raise RecordError(f"record {i}: missing feature {name!r}")
    values = [record[name]]
  else:
    values = list(_as_list(i, name, record.get(name, [])))
  for v in values:
    if not _is_int(v):
      raise RecordError(f"record {i}: feature {name!r} has an id of the wrong type "
                        f"{type(v).__name__} (ids are ints)")
    if not 0 <= int(v) < rows:
      raise RecordError(f"record {i}: feature {name!r} has id {int(v)} outside its table "
                        f"{spec.table!r} rows [0, {rows})")
  weights = [1.0] * len(values)
  key = weights_key(name)
  if spec.weighted and (values or key in record):
    if key not in record:
      raise RecordError(f"record {i}: missing {key!r} (feature {name!r} is a weighted bag)")
    given = _as_list(i, key, record[key])
    if len(given) != len(values) or not all(_is_number(w) for w in given):
      raise RecordError(f"record {i}: {key!r} must be a list of {len(values)} numbers, one "
                        f"per id of {name!r}")
    weights = [float(w) for w in given]
  keep = _kept(spec.kind, len(values), spec.capacity)
  return [int(v) for v in values[keep]], weights[keep]


def parse_layout_records(records: Sequence[Any], layout: fl.FeatureLayout,
                         dense_names: Sequence[str]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Records -> (ids [n, S] int64 local, -1 padding; dense [n, Nd] float32; weights [n, S]).

  Args:
    records: dicts as the module docstring describes.
    layout: the bundle's feature layout.
    dense_names: the Nd dense input names.

  Raises:
    RecordError: naming the record index and the feature (missing, wrong type, id out of
      its table's rows, weights of the wrong length).
  """
  n, s = len(records), layout.num_columns
  ids = np.full((n, s), fl.PADDING_ID, np.int64)
  weights = np.zeros((n, s), np.float32)
  dense = np.zeros((n, len(dense_names)), np.float32)
  starts = layout.feature_starts
  rows = [layout.tables[t].num_rows for t in layout.feature_tables]
  for i, record in enumerate(records):
    if not isinstance(record, Mapping):
      raise RecordError(f"record {i}: this bundle's run had no raw values: send a dict of "
                        f"feature -> id or list of ids, got {type(record).__name__}")
    for f, spec in enumerate(layout.features):
      kept, w = _feature_ids(i, record, spec, rows[f])
      ids[i, starts[f]:starts[f] + len(kept)] = kept
      weights[i, starts[f]:starts[f] + len(kept)] = w
    for d, name in enumerate(dense_names):
      if name not in record:
        raise RecordError(f"record {i}: missing feature {name!r}")
      if not _is_number(record[name]):
        raise RecordError(f"record {i}: feature {name!r} has the wrong type "
                          f"{type(record[name]).__name__}")
      dense[i, d] = record[name]
  return ids, dense, weights
