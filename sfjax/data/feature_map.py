"""Feature -> row mapping: raw categorical values to per-field local row ids.

Both mappers start from the same stable 64-bit key of a raw value: the value's
bytes, zero-padded to 8-byte little-endian words, folded with SplitMix64 from a
per-field salt (`value_keys`). The key depends only on (field index, bytes), so
it is identical across runs, processes and machines (unlike Python's salted
`hash()`). The empty value (a missing field) is an ordinary value: it gets its
own key, hence its own hashed row or vocabulary entry.

* `HashingMapper(num_rows)`: row = key mod num_rows, per field.
* `Vocabulary`: built in one streaming pass (`build_vocabulary`); values seen
  at least `min_count` times get rows 1..V (in key order), everything else
  the out-of-vocabulary row 0, so a field has V + 1 rows. Entries are stored as
  64-bit keys, not strings: two distinct values of one field share an entry
  only on a 64-bit collision (probability ~ V**2 / 2**65, ~3e-6 for 10M values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy as np

from sfjax.core.hashing import splitmix64
from sfjax.data.types import DatasetSpec, FieldSpec

_FIELD_SALT = np.uint64(0xC7F0E1D2A3B4C5D6)


def field_salts(num_fields: int) -> np.ndarray:
  """[F] uint64 per-field hash salts: `value_keys(column[:, None], field_salts(F)[f:f + 1])`
  equals column f of `value_keys(values)` (a reader of ragged columns keys them one by one)."""
  return splitmix64(np.arange(num_fields, dtype=np.uint64) ^ _FIELD_SALT)


_field_salts = field_salts  # the name sfjax.serving.bundle reads


def value_keys(values: np.ndarray, salts: np.ndarray | None = None) -> np.ndarray:
  """Stable per-field 64-bit keys of raw values.

  Args:
    values: [n, F] bytes (numpy 'S' dtype). Values must not contain NUL bytes
      (text fields never do); b'' is the missing value.
    salts: [F] uint64 per-field salts; None: the fields' own (`splitmix64(f ^ SALT)`).
      A serving bundle records them and passes them back.

  Returns:
    [n, F] uint64.
  """
  values = np.ascontiguousarray(values)
  if values.dtype.kind != "S" or values.ndim != 2:
    raise TypeError(f"values must be a 2-D bytes ('S') array, got {values.dtype} {values.shape}")
  n, num_fields = values.shape
  width = values.dtype.itemsize
  words = max(1, -(-width // 8))
  padded = np.zeros((n, num_fields, words * 8), dtype=np.uint8)
  padded[..., :width] = values.view(np.uint8).reshape(n, num_fields, width)
  packed = padded.view("<u8")  # [n, F, words]
  salts = field_salts(num_fields) if salts is None else np.asarray(salts, np.uint64)
  h = np.broadcast_to(salts, (n, num_fields)).copy()
  for k in range(words):
    word = packed[..., k]
    # Trailing all-zero words are padding (values have no NUL bytes): skipping
    # them makes the key independent of the array's string width.
    h = np.where(word != 0, splitmix64(h ^ word), h)
  return splitmix64(h)


class FeatureMapper(Protocol):
  """Maps raw values [n, F] to local row ids [n, F] and describes the rows."""

  def __call__(self, values: np.ndarray) -> np.ndarray:
    """[n, F] bytes -> [n, F] int64 with 0 <= ids[:, f] < rows of field f."""

  def rows_of_keys(self, keys: np.ndarray, field: int) -> np.ndarray:
    """[n] uint64 value keys of field `field` -> [n] int64 rows."""

  def dataset_spec(self, field_names: Sequence[str], num_dense: int) -> DatasetSpec:
    """The `DatasetSpec` of batches whose ids this mapper produced."""


@dataclasses.dataclass(frozen=True)
class HashingMapper:
  """Hashes each field's raw values into `num_rows` rows (collisions allowed)."""

  num_rows: int

  def __post_init__(self):
    if int(self.num_rows) < 1:
      raise ValueError(f"hash rows must be >= 1, got {self.num_rows}")
    if int(self.num_rows) > 2**63:  # rows key mod num_rows must fit the int64 ids
      raise ValueError(f"hash rows must be <= 2**63 (int64 ids), got {self.num_rows}")

  def __call__(self, values: np.ndarray) -> np.ndarray:
    """[n, F] bytes -> [n, F] int64 rows in [0, num_rows)."""
    return self.rows_of_keys(value_keys(values), 0)

  def rows_of_keys(self, keys: np.ndarray, field: int) -> np.ndarray:
    """Value keys (any shape, any field) -> int64 rows in [0, num_rows)."""
    del field  # every field hashes alike
    return (keys % np.uint64(self.num_rows)).astype(np.int64)

  def dataset_spec(self, field_names: Sequence[str], num_dense: int) -> DatasetSpec:
    """Every field gets `num_rows` rows."""
    return DatasetSpec(tuple(FieldSpec(n, int(self.num_rows)) for n in field_names), int(num_dense))


@dataclasses.dataclass(frozen=True, eq=False)
class Vocabulary:
  """Per-field vocabulary of value keys; row 0 is out-of-vocabulary.

  Attributes:
    keys: per field, the sorted uint64 keys in the vocabulary; the value with
      key `keys[f][i]` maps to row i + 1.
    min_count: occurrences a value needed to get its own row.
    num_distinct: per field, distinct values seen while building.
  """

  keys: tuple[np.ndarray, ...]
  min_count: int
  num_distinct: tuple[int, ...]

  @property
  def field_rows(self) -> tuple[int, ...]:
    """Rows per field: vocabulary size + 1 (the OOV row 0)."""
    return tuple(int(k.shape[0]) + 1 for k in self.keys)

  def __call__(self, values: np.ndarray) -> np.ndarray:
    """[n, F] bytes -> [n, F] int64 rows; unseen or rare values -> 0."""
    keys = value_keys(values)
    if keys.shape[1] != len(self.keys):
      raise ValueError(f"vocabulary has {len(self.keys)} fields, values have {keys.shape[1]}")
    ids = np.zeros(keys.shape, dtype=np.int64)
    for f in range(len(self.keys)):
      ids[:, f] = self.rows_of_keys(keys[:, f], f)
    return ids

  def rows_of_keys(self, keys: np.ndarray, field: int) -> np.ndarray:
    """[n] uint64 value keys of field `field` -> [n] int64 rows; unseen or rare -> 0."""
    vocab = self.keys[field]
    if vocab.shape[0] == 0:
      return np.zeros(keys.shape, dtype=np.int64)
    pos = np.searchsorted(vocab, keys)
    found = vocab[np.minimum(pos, vocab.shape[0] - 1)] == keys
    return np.where(found, pos + 1, 0).astype(np.int64)

  def dataset_spec(self, field_names: Sequence[str], num_dense: int) -> DatasetSpec:
    """Field f gets `field_rows[f]` rows."""
    if len(field_names) != len(self.keys):
      raise ValueError(f"{len(field_names)} field names for {len(self.keys)} vocabulary fields")
    return DatasetSpec(
        tuple(FieldSpec(n, r) for n, r in zip(field_names, self.field_rows, strict=True)), int(num_dense))


class _KeyCounter:
  """Streaming (key -> count) for one field, merged with amortised doubling."""

  def __init__(self):
    self.keys = np.zeros((0,), np.uint64)
    self.counts = np.zeros((0,), np.int64)
    self._pending: list[tuple[np.ndarray, np.ndarray]] = []
    self._pending_size = 0

  def add(self, keys: np.ndarray) -> None:
    uniq, counts = np.unique(keys, return_counts=True)
    self._pending.append((uniq, counts.astype(np.int64)))
    self._pending_size += uniq.shape[0]
    # Merging only when the pending part outgrows the merged part keeps the
    # total merge cost O(N log N) however many chunks arrive.
    if self._pending_size >= max(self.keys.shape[0], 1 << 16):
      self.merge()

  def merge(self) -> None:
    if not self._pending:
      return
    all_keys = np.concatenate([self.keys] + [k for k, _ in self._pending])
    all_counts = np.concatenate([self.counts] + [c for _, c in self._pending])
    self.keys, inverse = np.unique(all_keys, return_inverse=True)
    self.counts = np.bincount(
        inverse, weights=all_counts, minlength=self.keys.shape[0]).astype(np.int64)
    self._pending, self._pending_size = [], 0


def build_vocabulary(value_chunks: Iterable[np.ndarray], num_fields: int,
                     min_count: int = 1) -> Vocabulary:
  """Builds a `Vocabulary` in one streaming pass.

  Args:
    value_chunks: [n_i, F] bytes arrays (e.g. `RawChunk.values` of a reader).
    num_fields: F.
    min_count: a value needs this many occurrences to get its own row.

  Returns:
    The vocabulary; values below `min_count` map to the OOV row 0.
  """
  def key_chunks():
    for values in value_chunks:
      if values.ndim != 2 or values.shape[1] != num_fields:
        raise ValueError(f"expected [n, {num_fields}] values, got shape {values.shape}")
      keys = value_keys(values)
      yield [keys[:, f] for f in range(num_fields)]

  return build_vocabulary_from_keys(key_chunks(), num_fields, min_count)


def build_vocabulary_from_keys(key_chunks: Iterable[Sequence[np.ndarray]], num_fields: int,
                               min_count: int = 1) -> Vocabulary:
  """`build_vocabulary` from value keys: each chunk holds F arrays [n_f] uint64 of any lengths.

  Ragged inputs (the ids of list columns, `sfjax.data.parquet`) key their values field by
  field (`value_keys` with `field_salts`) and count them here.
  """
  if int(min_count) < 1:
    raise ValueError(f"min_count must be >= 1, got {min_count}")
  counters = [_KeyCounter() for _ in range(num_fields)]
  for keys in key_chunks:
    if len(keys) != num_fields:
      raise ValueError(f"expected {num_fields} key arrays, got {len(keys)}")
    for counter, field_keys in zip(counters, keys, strict=True):
      counter.add(np.asarray(field_keys, np.uint64))
  kept, distinct = [], []
  for counter in counters:
    counter.merge()
    kept.append(counter.keys[counter.counts >= min_count])
    distinct.append(int(counter.keys.shape[0]))
  return Vocabulary(tuple(kept), int(min_count), tuple(distinct))


def make_mapper(hash_rows: int, min_count: int,
                value_chunks: Callable[[], Iterable[np.ndarray]], num_fields: int,
                chunks_are_keys: bool = False) -> FeatureMapper:
  """The mapper a data config asks for.

  Args:
    hash_rows: `data.hash_rows`; > 0 selects `HashingMapper(hash_rows)`.
    min_count: `data.min_count`, used when `hash_rows == 0`.
    value_chunks: returns the training values ([n_i, F] bytes chunks); only
      called (once) to build a vocabulary.
    num_fields: F.
    chunks_are_keys: `value_chunks` returns key chunks instead
      (`build_vocabulary_from_keys`).

  Returns:
    A `HashingMapper` or a `Vocabulary`.
  """
  if int(hash_rows) < 0:
    raise ValueError(f"data.hash_rows must be >= 0 (0 = vocabulary), got {hash_rows}")
  if int(hash_rows) > 0:
    return HashingMapper(int(hash_rows))
  if int(min_count) < 1:
    raise ValueError(f"data.min_count must be >= 1 when data.hash_rows == 0, got {min_count}")
  if chunks_are_keys:
    return build_vocabulary_from_keys(value_chunks(), num_fields, int(min_count))  # type: ignore[arg-type]
  return build_vocabulary(value_chunks(), num_fields, int(min_count))
