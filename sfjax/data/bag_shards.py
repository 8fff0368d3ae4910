"""Examples in shard form: padded id columns <-> one-hot ids plus per-bag values + offsets.

A batch of a data set with a feature layout holds feature f's ids in `capacity` id
columns, left-aligned and padded with -1 (`types.Batch`). A shard stores instead, for
every multi_hot or sequence feature f (issue #22; TorchRec's jagged values + offsets):

  shard_k.f<f>.values.npy    [T_f] the ids of every example, in example order, no padding
                             (the shard's ids dtype; ids local to the feature's table)
  shard_k.f<f>.offsets.npy   [n + 1] int64: example i's ids are values[offsets[i]:offsets[i+1]]
  shard_k.f<f>.weights.npy   [T_f] float32 per-id weights (weighted multi_hot only)

and the one-hot features' ids in `shard_k.ids.npy` [n, F1] as before. An example's ids
are those its batch held (already truncated to the capacity; a sequence's most recent
last), so `pad` rebuilds the batch's ids and weights exactly: with one scatter per
feature, no Python loop over examples. `stored` / `to_batch` convert whole chunks
(`StoredExamples`: what `shards` writes and memory-maps); without a layout they only
change dtypes, and a shard is its ids, dense and labels as before.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.data import validate
from sfjax.data.types import Batch, FieldSpec


class BagArrays(NamedTuple):
  """One feature's ids of n examples without padding (written, or memory-mapped).

  Attributes:
    values: [T] ids local to the feature's table, example by example.
    offsets: [n + 1] int64, non-decreasing from 0 to T.
    weights: [T] float32 per-id weights, or None (every id weighs 1).
  """

  values: np.ndarray
  offsets: np.ndarray
  weights: np.ndarray | None


class StoredExamples(NamedTuple):
  """n examples as a shard stores them (arrays, or read-only views of its memory maps).

  Attributes:
    ids: [n, F] ids ([n, F1], the one-hot features' only, with a layout).
    dense: [n, Nd] float32.
    labels: [n] float32.
    bags: one `BagArrays` per bag feature (`ragged_features`); () without a layout.
  """

  ids: np.ndarray
  dense: np.ndarray
  labels: np.ndarray
  bags: tuple[BagArrays, ...] = ()

  def rows(self, start: int, stop: int) -> StoredExamples:
    """Examples [start, stop) (views; bag offsets rebased to 0)."""
    return StoredExamples(self.ids[start:stop], self.dense[start:stop], self.labels[start:stop],
                          tuple(take_rows(b, start, stop) for b in self.bags))


def ragged_features(layout: fl.FeatureLayout) -> tuple[int, ...]:
  """Indices of the features stored as values + offsets (multi_hot and sequence)."""
  return tuple(i for i, f in enumerate(layout.features) if f.kind != "one_hot")


def one_hot_columns(layout: fl.FeatureLayout) -> np.ndarray:
  """[F1] int64 id column of each one-hot feature (the columns of a shard's `ids`)."""
  return np.asarray([layout.feature_starts[i] for i, f in enumerate(layout.features)
                     if f.kind == "one_hot"], np.int64)


def id_fields(fields: tuple[FieldSpec, ...],
              layout: fl.FeatureLayout | None) -> tuple[FieldSpec, ...]:
  """The fields of a shard's `ids` columns: every field, or the one-hot features with a layout."""
  if layout is None:
    return fields
  return tuple(fields[i] for i, f in enumerate(layout.features) if f.kind == "one_hot")


def array_names(layout: fl.FeatureLayout) -> tuple[str, ...]:
  """The per-shard arrays of the bags, e.g. ('f2.values', 'f2.offsets', 'f3.values', ...)."""
  names = []
  for f in ragged_features(layout):
    names += [f"f{f}.values", f"f{f}.offsets"]
    if layout.features[f].weighted:
      names.append(f"f{f}.weights")
  return tuple(names)


def bag_files(bags: tuple[BagArrays, ...], layout: fl.FeatureLayout) -> dict[str, np.ndarray]:
  """{array name: array} of a shard's bags, in `array_names` order."""
  out = {}
  for f, bag in zip(ragged_features(layout), bags, strict=True):
    out[f"f{f}.values"], out[f"f{f}.offsets"] = bag.values, bag.offsets
    if bag.weights is not None:
      out[f"f{f}.weights"] = bag.weights
  return out


def from_files(arrays: dict[str, np.ndarray], layout: fl.FeatureLayout) -> tuple[BagArrays, ...]:
  """The bags of a shard from its {array name: array} (`bag_files`' inverse)."""
  return tuple(BagArrays(arrays[f"f{f}.values"], arrays[f"f{f}.offsets"],
                         arrays.get(f"f{f}.weights")) for f in ragged_features(layout))


def expected_array(array: str, n: int, ids_dtype: np.dtype,
                   maps: dict) -> tuple[np.dtype, tuple]:
  """(dtype, shape) of a bag array of a shard of n examples; None in a shape: any length.

  Args:
    array: 'f<f>.values' | 'f<f>.offsets' | 'f<f>.weights'.
    n: examples in the shard.
    ids_dtype: the split's ids dtype.
    maps: the arrays of the shard opened so far (a bag's values precede its weights).
  """
  feature, kind = array.split(".")
  if kind == "values":
    return ids_dtype, (None,)
  if kind == "offsets":
    return np.dtype(np.int64), (n + 1,)
  return np.dtype(np.float32), maps[f"{feature}.values"].shape  # one weight per id


def stored(chunk: Batch, layout: fl.FeatureLayout | None, ids_dtype: np.dtype) -> StoredExamples:
  """A chunk (ids and labels already checked) in storage form and dtypes.

  Raises:
    ValueError: with a layout, weights missing or not shaped like the ids, or a bag
      that cannot be stored (`unpad`).
  """
  dense, labels = chunk.dense.astype(np.float32), chunk.labels.astype(np.float32)
  if layout is None:
    return StoredExamples(chunk.ids.astype(ids_dtype), dense, labels)
  if chunk.weights is None or chunk.weights.shape != chunk.ids.shape:
    raise ValueError(f"chunk weights {None if chunk.weights is None else chunk.weights.shape} "
                     f"do not match its ids {chunk.ids.shape}: a data set with a feature "
                     "layout yields weights")
  ids, bags = unpad(chunk.ids, chunk.weights, layout, ids_dtype)
  return StoredExamples(ids, dense, labels, bags)


def merged_files(parts: list[StoredExamples],
                 layout: fl.FeatureLayout | None) -> dict[str, np.ndarray]:
  """{array name: array} of one shard made of `parts`: ids, dense, labels, then the bags'."""
  files = {name: np.concatenate([getattr(p, name) for p in parts])
           for name in ("ids", "dense", "labels")}
  if layout is not None:
    bags = tuple(concat(list(b)) for b in zip(*(p.bags for p in parts), strict=True))
    files.update(bag_files(bags, layout))
  return files


def to_batch(examples: StoredExamples, layout: fl.FeatureLayout | None) -> Batch:
  """Stored examples -> a `Batch` of fresh arrays (ids int64, mask ones; padded with a layout)."""
  dense, labels = np.array(examples.dense), np.array(examples.labels)
  mask = np.ones(labels.shape, np.float32)
  if layout is None:
    return Batch(examples.ids.astype(np.int64), dense, labels, mask)
  ids, weights = pad(examples.ids, examples.bags, layout)
  return Batch(ids, dense, labels, mask, weights)


def unpad(ids: np.ndarray, weights: np.ndarray, layout: fl.FeatureLayout,
          ids_dtype: np.dtype) -> tuple[np.ndarray, tuple[BagArrays, ...]]:
  """A batch's padded ids and weights -> one-hot ids and the bags' values + offsets.

  Args:
    ids: [n, S] ids, -1 in padding columns (valid ids already checked by the caller).
    weights: [n, S] float32 per-id weights.
    layout: the feature layout.
    ids_dtype: the dtype to store ids in.

  Returns:
    ([n, F1] one-hot ids, one `BagArrays` per bag feature).

  Raises:
    ValueError: a bag's padding is not a suffix of its columns, a padding column's
      weight is not 0, or an unweighted id's (one-hot or bag) is not 1: such a batch
      could not be rebuilt from values + offsets (names feature and chunk row).
  """
  n = ids.shape[0]
  one_hot = one_hot_columns(layout)
  bad_weight = weights[:, one_hot] != 1
  if bad_weight.any():
    row, col = np.argwhere(bad_weight)[0]
    raise ValueError(f"weight {weights[row, one_hot[col]]} of one-hot feature "
                     f"{layout.features[layout.column_features[one_hot[col]]].name!r} "
                     f"(chunk row {row}) is not 1")
  bags = []
  for f in ragged_features(layout):
    spec = layout.features[f]
    cols = layout.columns(f)
    used = ids[:, cols] != fl.PADDING_ID  # [n, C]
    lengths = used.sum(axis=1)
    left_aligned = used == (np.arange(spec.capacity)[None, :] < lengths[:, None])
    w = weights[:, cols]
    unit = np.where(used, 1.0, 0.0) if not spec.weighted else np.where(used, w, 0.0)
    bad = ~left_aligned.all(axis=1) | (w != unit).any(axis=1)
    if bad.any():
      raise ValueError(f"feature {spec.name!r} (chunk row {int(np.argmax(bad))}): ids must be "
                       "left-aligned with -1 padding of weight 0, unweighted ids of weight 1")
    offsets = np.zeros((n + 1,), np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = ids[:, cols][used]  # row-major: example by example, in order
    rows = layout.tables[layout.feature_tables[f]].num_rows
    found = validate.first_bad_id(values[:, None], [rows])
    if found is not None:
      raise ValueError(f"ids of feature {spec.name!r} outside [0, {rows}): {found.value} "
                       f"(chunk row {_row_of(offsets, found.row)})")
    bags.append(BagArrays(values.astype(ids_dtype), offsets,
                          w[used].astype(np.float32) if spec.weighted else None))
  return np.ascontiguousarray(ids[:, one_hot]).astype(ids_dtype), tuple(bags)


def take_rows(bag: BagArrays, start: int, stop: int) -> BagArrays:
  """Examples [start, stop) of `bag`, offsets rebased to 0 (views of the values)."""
  offsets = np.asarray(bag.offsets[start:stop + 1], np.int64)
  lo, hi = int(offsets[0]), int(offsets[-1])
  weights = None if bag.weights is None else bag.weights[lo:hi]
  return BagArrays(bag.values[lo:hi], offsets - lo, weights)


def concat(parts: list[BagArrays]) -> BagArrays:
  """The examples of `parts` one after another (offsets shifted)."""
  shifts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
  offsets = np.concatenate([parts[0].offsets[:1]] + [p.offsets[1:] + s
                                                     for p, s in zip(parts, shifts, strict=True)])
  weights = (None if parts[0].weights is None
             else np.concatenate([p.weights for p in parts]))
  return BagArrays(np.concatenate([p.values for p in parts]), offsets.astype(np.int64), weights)


def pad(one_hot_ids: np.ndarray, bags: tuple[BagArrays, ...],
        layout: fl.FeatureLayout) -> tuple[np.ndarray, np.ndarray]:
  """One-hot ids and the bags of n examples -> the batch's padded ids and weights.

  Args:
    one_hot_ids: [n, F1] ids of the one-hot features.
    bags: one `BagArrays` per bag feature, offsets starting at 0 (`take_rows`).
    layout: the feature layout.

  Returns:
    ids [n, S] int64 (-1 in unused columns) and weights [n, S] float32 (0 there).
  """
  n = one_hot_ids.shape[0]
  ids = np.full((n, layout.num_columns), fl.PADDING_ID, np.int64)
  weights = np.zeros((n, layout.num_columns), np.float32)
  one_hot = one_hot_columns(layout)
  ids[:, one_hot] = one_hot_ids
  weights[:, one_hot] = 1.0
  for f, bag in zip(ragged_features(layout), bags, strict=True):
    lengths = np.diff(bag.offsets)
    row_of = np.repeat(np.arange(n), lengths)  # [T] the example of each id
    column = layout.feature_starts[f] + np.arange(row_of.shape[0]) - np.repeat(bag.offsets[:-1],
                                                                               lengths)
    ids[row_of, column] = bag.values
    weights[row_of, column] = 1.0 if bag.weights is None else bag.weights
  return ids, weights


class BadBagValue(NamedTuple):
  """The first invalid entry of a stored bag.

  Attributes:
    array: the array holding it ('f<f>.values' | '.offsets' | '.weights').
    row: the example (0-based, within the shard).
    reason: what is wrong, for the error message.
  """

  array: str
  row: int
  reason: str


def first_bad_bag(bag: BagArrays, feature: int, layout: fl.FeatureLayout,
                  block: int = 1 << 20) -> BadBagValue | None:
  """Checks a shard's bag: offsets from 0 to T, no example over capacity, ids and weights valid.

  Args:
    bag: the stored arrays (memory maps).
    feature: the feature's index in the layout.
    layout: the feature layout (capacity, table rows).
    block: values checked at once (bounds the temporaries).

  Returns:
    None when every entry is valid, else the first bad one.
  """
  spec = layout.features[feature]
  name = f"f{feature}"
  offsets = np.asarray(bag.offsets)
  if offsets[0] != 0 or offsets[-1] != bag.values.shape[0]:
    return BadBagValue(f"{name}.offsets", 0 if offsets[0] != 0 else offsets.shape[0] - 2,
                       f"offsets run from {offsets[0]} to {offsets[-1]}, not from 0 to the "
                       f"{bag.values.shape[0]} values")
  lengths = np.diff(offsets)
  bad = (lengths < 0) | (lengths > spec.capacity)
  if bad.any():
    row = int(np.argmax(bad))
    return BadBagValue(f"{name}.offsets", row, f"{lengths[row]} ids, not in [0, capacity "
                                               f"{spec.capacity}]")
  rows = layout.tables[layout.feature_tables[feature]].num_rows
  for start in range(0, bag.values.shape[0], block):
    chunk = np.asarray(bag.values[start:start + block])
    found = validate.first_bad_id(chunk[:, None], [rows])
    if found is not None:
      return BadBagValue(f"{name}.values", _row_of(offsets, start + found.row),
                         f"id {found.value} outside the table's rows [0, {rows})")
    if bag.weights is not None:
      found = validate.first_bad_dense(np.asarray(bag.weights[start:start + block])[:, None])
      if found is not None:
        return BadBagValue(f"{name}.weights", _row_of(offsets, start + found.row),
                           f"weight {found.value} is not finite")
  return None


def _row_of(offsets: np.ndarray, position: int) -> int:
  """The example holding value `position`."""
  return int(np.searchsorted(offsets, position, side="right") - 1)
