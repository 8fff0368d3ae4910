"""Host-side data types shared by every reader, the batcher and the trainer.

Three kinds of value never mix (STYLE.md): `DatasetSpec` is static and hashable,
`Batch` is a fixed-shape per-step input of numpy arrays, and readers are plain
iterators over `Batch` chunks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

from sfjax.core.feature_layout import FeatureLayout


@dataclasses.dataclass(frozen=True)
class FieldSpec:
  """One categorical field and the number of embedding rows it maps into."""

  name: str
  num_rows: int


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """Static description of a CTR data set after feature -> row mapping.

  Attributes:
    fields: categorical fields (the pooled features a model sees), in order; without a
      layout also the columns of `Batch.ids`, each its own table.
    num_dense: number of dense (float) features, columns of `Batch.dense`.
    layout: None (one one-hot id column per field), or the feature layout (issue #22):
      bags and sequences own several id columns, tables may be shared. `fields` then
      holds one entry per feature, its rows those of the table it reads.
  """

  fields: tuple[FieldSpec, ...]
  num_dense: int
  layout: FeatureLayout | None = None

  def __post_init__(self):
    if self.layout is not None and len(self.layout.features) != len(self.fields):
      raise ValueError(f"DatasetSpec: {len(self.fields)} fields but the layout has "
                       f"{self.layout.num_features} features")

  @property
  def num_fields(self) -> int:
    """F, the number of categorical fields."""
    return len(self.fields)

  @property
  def field_rows(self) -> tuple[int, ...]:
    """Rows of each field's slice of the concatenated table."""
    return tuple(f.num_rows for f in self.fields)

  @property
  def field_offsets(self) -> np.ndarray:
    """[F] int64 start of each field's rows in the concatenated table."""
    return np.concatenate([[0], np.cumsum(self.field_rows)[:-1]]).astype(np.int64)

  @property
  def total_rows(self) -> int:
    """V, rows of the concatenated table (also the padding row index)."""
    if self.layout is not None:
      return self.layout.total_rows
    return int(sum(self.field_rows))

  @property
  def num_columns(self) -> int:
    """S, id columns of `Batch.ids` (F without a layout)."""
    return self.num_fields if self.layout is None else self.layout.num_columns

  @property
  def column_offsets(self) -> np.ndarray:
    """[S] int64 start row of each id column in the concatenated table (VSI's offsets)."""
    return self.field_offsets if self.layout is None else self.layout.column_offsets

  @property
  def column_rows(self) -> np.ndarray | None:
    """[S] int64 rows of each id column's table; None without a layout (from the offsets)."""
    return None if self.layout is None else self.layout.column_rows

  @property
  def has_padding(self) -> bool:
    """Some id column may hold the padding id -1 (a bag or a sequence)."""
    return self.layout is not None and self.layout.has_padding


class Batch(NamedTuple):
  """A host batch (numpy). Also used for variable-size chunks before batching.

  Attributes:
    ids: [B, S] int64 row ids local to each column's table: 0 <= ids[:, s] < its rows,
      or -1 (padding) in the unused columns of a bag or a sequence. Without a feature
      layout S = F and column f is field f. The block shuffle of preprocessed shards
      keeps them as the shards store them (int32 when every field fits): consumers widen
      them where they add offsets (`vsi.global_row_ids`).
    dense: [B, Nd] float32, already transformed (e.g. log(1+x)); Nd may be 0.
    labels: [B] float32 in {0, 1}.
    mask: [B] float32, 1 for real examples and 0 for padding.
    weights: None (every id weighs 1; one-hot data), or [B, S] float32 per-id weights:
      0 in padding columns, 1 for unweighted ids.
  """

  ids: np.ndarray
  dense: np.ndarray
  labels: np.ndarray
  mask: np.ndarray
  weights: np.ndarray | None = None

  @property
  def size(self) -> int:
    """B, examples in the batch (padding included)."""
    return int(self.labels.shape[0])


def make_batch(ids, dense, labels, mask=None, weights=None) -> Batch:
  """Builds a `Batch` with canonical dtypes; `mask` defaults to all ones."""
  ids = np.asarray(ids, dtype=np.int64)
  labels = np.asarray(labels, dtype=np.float32)
  dense = np.asarray(dense, dtype=np.float32)
  if dense.ndim != 2:  # a flat [B] vector is one dense feature per example
    dense = dense.reshape(labels.shape[0], -1)
  if mask is None:
    mask = np.ones_like(labels)
  if weights is not None:
    weights = np.asarray(weights, dtype=np.float32)
  return Batch(ids, dense, labels, np.asarray(mask, dtype=np.float32), weights)


def map_arrays(fn, batch: Batch) -> Batch:
  """`Batch(*(fn(a) for a in batch))`, leaving an absent (None) `weights` absent."""
  arrays: list[Any] = [None if a is None else fn(a) for a in batch]
  return Batch(*arrays)


def concat_batches(batches: list[Batch]) -> Batch:
  """Concatenates batches along the example axis."""
  arrays: list[Any] = [None if parts[0] is None else np.concatenate(parts, axis=0)
                        for parts in zip(*batches, strict=True)]
  return Batch(*arrays)
