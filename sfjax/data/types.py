"""Host-side data types shared by every reader, the batcher and the trainer.

Three kinds of value never mix (STYLE.md): `DatasetSpec` is static and hashable,
`Batch` is a fixed-shape per-step input of numpy arrays, and readers are plain
iterators over `Batch` chunks.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np


@dataclasses.dataclass(frozen=True)
class FieldSpec:
  """One categorical field and the number of embedding rows it maps into."""

  name: str
  num_rows: int


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """Static description of a CTR data set after feature -> row mapping.

  Attributes:
    fields: categorical fields, in column order of `Batch.ids`.
    num_dense: number of dense (float) features, columns of `Batch.dense`.
  """

  fields: tuple[FieldSpec, ...]
  num_dense: int

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
    return int(sum(self.field_rows))


class Batch(NamedTuple):
  """A host batch (numpy). Also used for variable-size chunks before batching.

  Attributes:
    ids: [B, F] int64 row ids local to each field: 0 <= ids[:, f] < fields[f].num_rows.
    dense: [B, Nd] float32, already transformed (e.g. log(1+x)); Nd may be 0.
    labels: [B] float32 in {0, 1}.
    mask: [B] float32, 1 for real examples and 0 for padding.
  """

  ids: np.ndarray
  dense: np.ndarray
  labels: np.ndarray
  mask: np.ndarray

  @property
  def size(self) -> int:
    """B, examples in the batch (padding included)."""
    return int(self.labels.shape[0])


def make_batch(ids, dense, labels, mask=None) -> Batch:
  """Builds a `Batch` with canonical dtypes; `mask` defaults to all ones."""
  ids = np.asarray(ids, dtype=np.int64)
  labels = np.asarray(labels, dtype=np.float32)
  dense = np.asarray(dense, dtype=np.float32)
  if dense.ndim != 2:  # a flat [B] vector is one dense feature per example
    dense = dense.reshape(labels.shape[0], -1)
  if mask is None:
    mask = np.ones_like(labels)
  return Batch(ids, dense, labels, np.asarray(mask, dtype=np.float32))


def concat_batches(batches: list[Batch]) -> Batch:
  """Concatenates batches along the example axis."""
  return Batch(*(np.concatenate(parts, axis=0) for parts in zip(*batches, strict=True)))
