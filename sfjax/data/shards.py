"""Binary example shards: plain `.npy` files, memory-mapped on read, indexed by `split.json`.

A split directory (e.g. `DIR/train`) holds, for shard k = 0, 1, ...:

  shard_0000k.ids.npy      [n_k, F] int32 per-field row ids (int64 if a field has > 2**31 rows)
  shard_0000k.dense.npy    [n_k, Nd] float32, already transformed
  shard_0000k.labels.npy   [n_k] float32 in {0, 1}
  split.json               num_examples, the fields (name, rows), Nd, ids dtype, the
                           digests of the data set it belongs to (`dataset`); per shard
                           its example count and each file's size in bytes and CRC-32

A split of a data set with a feature layout (bags, sequences, shared tables; issue #22)
keeps the one-hot features' ids in `ids.npy` [n_k, F1] and stores each multi_hot or
sequence feature f as `shard_0000k.f<f>.values.npy` / `.offsets.npy` [/ `.weights.npy`]
(`bag_shards`: no padding stored); its `split.json` (version 3) also records the layout.
A split without one is written exactly as before (version 2).

Any numpy reads them (`np.load(path, mmap_mode='r')`); no sfjax needed.

Writing (`write_split`): chunks of `Batch`es are rolled into shards of
`rows_per_shard` examples; every file is written atomically (`core.atomic`) and
`split.json` last, so a directory without it is an unfinished split.

Reading (`ShardSplit`): opening checks `split.json` and every file's size and
`.npy` header, so a truncated or swapped shard fails at once naming its file;
each shard's CRC-32s are checked the first time it is read (CRC-32 runs at GB/s
and the pages it touches are the ones about to be read), and so are its values
(`validate`: ids inside their field's rows, labels 0 or 1, finite dense
features; a `ShardValueError` names the file, the row within the shard and the
field), so a shard written with wrong values and a matching CRC never trains
(issue #25, Why 4). The maps are read-only, so a shard is checked once, not
every epoch. `chunks` copies
contiguous slices of the maps (no per-example Python work), in file order or,
given a generator, with the shards and the blocks of `chunk_size` examples
inside each shard in a seeded random order (mix examples further with
`batching._shuffle_stream`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from sfjax.core import atomic, digest
from sfjax.core import feature_layout as fl
from sfjax.data import bag_shards, batching, validate
from sfjax.data.types import Batch, DatasetSpec, FieldSpec

SPLIT_FILE = "split.json"
_ARRAYS = ("ids", "dense", "labels")  # one .npy file per array per shard
_KIND = "sfjax.shards"
_VERSION = 2  # 2: the fields (for value checks) and the data set's digests
_LAYOUT_VERSION = 3  # 3: a feature layout, its bags stored as values + offsets (issue #22)
_CHECK_ROWS = 1 << 16  # examples per value-check block (bounds the temporaries)
_INT32_ROWS = 2**31  # ids < rows <= 2**31 fit int32


class CorruptShardError(ValueError):
  """A shard file or `split.json` is missing, truncated or corrupt; names the file."""

  def __init__(self, path: str, reason: str):
    self.path = path
    self.reason = reason
    super().__init__(f"{path}: {reason}")


class ShardValueError(CorruptShardError):
  """A shard holds an invalid value (under a valid CRC); names the file, row and field.

  Attributes:
    row: 0-based example index within the shard.
    field: the field's name, `dense[j]` or `label`.
  """

  def __init__(self, path: str, row: int, field: str, reason: str):
    self.row = row
    self.field = field
    super().__init__(path, f"row {row}, field {field!r}: {reason} (preprocess again)")


def _shard_file(index: int, array: str) -> str:
  """File name of `array` ('ids' | 'dense' | 'labels') of shard `index`."""
  return f"shard_{index:05d}.{array}.npy"


def _ids_dtype_for(spec: DatasetSpec) -> np.dtype:
  """int32 when every field's ids fit (rows <= 2**31), else int64."""
  return np.dtype(np.int32 if max(spec.field_rows, default=1) <= _INT32_ROWS else np.int64)


@dataclasses.dataclass(frozen=True)
class _ShardInfo:
  """One shard: its example count and, per array, {'file', 'bytes', 'crc32'}."""

  num_examples: int
  files: dict


@dataclasses.dataclass(frozen=True)
class SplitInfo:
  """The contents of `split.json`."""

  num_examples: int
  fields: tuple[FieldSpec, ...]
  num_dense: int
  ids_dtype: str
  shards: tuple[_ShardInfo, ...]
  dataset: dict = dataclasses.field(default_factory=dict)  # e.g. {"spec_crc32": "..."}
  layout: fl.FeatureLayout | None = None

  @property
  def num_fields(self) -> int:
    """F, the number of categorical fields."""
    return len(self.fields)

  @property
  def arrays(self) -> tuple[str, ...]:
    """The arrays (one .npy file each) of every shard."""
    return _ARRAYS + (() if self.layout is None else bag_shards.array_names(self.layout))

  def to_json(self) -> dict:
    """The `split.json` content."""
    out = {"kind": _KIND, "version": _VERSION if self.layout is None else _LAYOUT_VERSION,
           "num_examples": self.num_examples, "num_fields": self.num_fields,
           "fields": [{"name": f.name, "num_rows": f.num_rows} for f in self.fields],
           "num_dense": self.num_dense, "ids_dtype": self.ids_dtype, "dataset": self.dataset}
    if self.layout is not None:
      out["layout"] = fl.layout_to_json(self.layout)
    out["shards"] = [{"num_examples": s.num_examples, "files": s.files} for s in self.shards]
    return out


def save_npy(path: str, array: np.ndarray) -> dict:
  """Writes `array` as `.npy` atomically; returns {'file', 'bytes', 'crc32'}."""
  array = np.ascontiguousarray(array)
  out: dict[str, Any] = {}

  def write(f):
    w = digest.DigestWriter(f)
    np.lib.format.write_array_header_1_0(w, np.lib.format.header_data_from_array_1_0(array))
    if array.size:
      w.write(array.reshape(-1).view(np.uint8))  # the raw C-order bytes, no copy
    written = w.digest()
    out.update(file=os.path.basename(path), bytes=written["bytes"],
               crc32=f"{written['crc32']:08x}")

  atomic.atomic_write(path, write)
  return out


def _check_chunk(chunk: Batch, spec: DatasetSpec, rows: np.ndarray) -> None:
  """ValueError unless `chunk` fits `spec` and holds valid values (what `ShardSplit` checks).

  With a layout only the one-hot columns are checked here (`rows` holds theirs); the
  bags' ids and the weights are checked as they are stored (`bag_shards.stored`).
  """
  f, nd = spec.num_columns, spec.num_dense
  if chunk.ids.ndim != 2 or chunk.ids.shape[1] != f or chunk.dense.shape[1:] != (nd,):
    what = f"{f} fields" if spec.layout is None else f"{f} id columns"
    raise ValueError(f"chunk ids {chunk.ids.shape} / dense {chunk.dense.shape} do not match the "
                     f"spec ({what}, {nd} dense)")
  ids = chunk.ids if spec.layout is None else chunk.ids[:, bag_shards.one_hot_columns(spec.layout)]
  bad = validate.first_bad_id(ids, rows)
  if bad is not None:
    name = bag_shards.id_fields(spec.fields, spec.layout)[bad.column].name
    raise ValueError(f"ids of field {name!r} outside [0, {rows[bad.column]}): {bad.value} "
                     f"(chunk row {bad.row})")
  bad = validate.first_bad_label(chunk.labels)
  if bad is not None:
    raise ValueError(f"label {bad.value} of chunk row {bad.row} is not 0 or 1")
  bad = validate.first_bad_dense(chunk.dense)
  if bad is not None:
    raise ValueError(f"dense[{bad.column}] of chunk row {bad.row} is {bad.value}, not finite")


def write_split(chunks: Iterable[Batch], directory: str, spec: DatasetSpec,
                rows_per_shard: int, dataset: dict | None = None) -> SplitInfo:
  """Writes a stream of examples as shards of `rows_per_shard` examples.

  Args:
    chunks: batches of any sizes, in the order to keep; examples with mask 0
      (padding) are dropped.
    directory: the split directory; created, and must be empty or missing.
    spec: fields, dense width and layout of the chunks; the ids must lie in each
      field's rows, and set the ids dtype (`_ids_dtype_for`). With a layout the
      chunks carry weights, and each bag is stored as values + offsets.
    rows_per_shard: examples per shard (the last one may hold fewer).
    dataset: JSON-able facts about the data set the split belongs to, recorded
      in `split.json` (`preprocessed` stores the digests of spec and mapping).

  Returns:
    The `SplitInfo` written to `directory/split.json` (written last).
  """
  rows_per_shard = int(rows_per_shard)
  if rows_per_shard < 1:
    raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
  if os.path.isdir(directory) and os.listdir(directory):
    raise FileExistsError(f"{directory}: split directory is not empty")
  os.makedirs(directory, exist_ok=True)
  ids_dtype = _ids_dtype_for(spec)
  rows = np.asarray([f.num_rows for f in bag_shards.id_fields(spec.fields, spec.layout)], np.int64)
  shards: list[_ShardInfo] = []
  pending: list[bag_shards.StoredExamples] = []  # pieces of the next shard
  count = 0

  def flush(parts: list[bag_shards.StoredExamples]) -> None:
    merged = bag_shards.merged_files(parts, spec.layout)
    index = len(shards)
    files = {name: save_npy(os.path.join(directory, _shard_file(index, name)), a)
             for name, a in merged.items()}
    shards.append(_ShardInfo(int(merged["labels"].shape[0]), files))

  for chunk in chunks:
    _check_chunk(chunk, spec, rows)
    keep = chunk.mask > 0
    if not keep.all():
      chunk = batching.take(chunk, keep)
    # Storage form at once: a pending shard costs 4F + 4Nd + 4 bytes per example (int32 ids),
    # plus 4 (8 with weights) per bag id and 8 per bag and example with a layout.
    piece = bag_shards.stored(chunk, spec.layout, ids_dtype)
    start = 0
    n = piece.labels.shape[0]
    while start < n:
      take = min(n - start, rows_per_shard - count)
      pending.append(piece.rows(start, start + take))
      count += take
      start += take
      if count == rows_per_shard:
        flush(pending)
        pending, count = [], 0
  if count:
    flush(pending)
  info = SplitInfo(sum(s.num_examples for s in shards), spec.fields, spec.num_dense,
                   ids_dtype.name, tuple(shards), dict(dataset or {}), spec.layout)
  atomic.atomic_write(os.path.join(directory, SPLIT_FILE),
                      json.dumps(info.to_json(), indent=1) + "\n")
  return info


def read_split_info(directory: str) -> SplitInfo:
  """Parses `directory/split.json`; CorruptShardError naming it if missing or malformed."""
  path = os.path.join(directory, SPLIT_FILE)
  if not os.path.exists(path):
    raise CorruptShardError(path, "missing: not a shard directory, or writing it did not finish")
  try:
    with open(path) as f:
      raw = json.load(f)
    if raw.get("kind") == _KIND and raw.get("version") == 1:
      raise CorruptShardError(path, "written by an older sfjax (split format 1: no field rows "
                                    "to check ids against); preprocess the data again "
                                    "(python -m experiments.preprocess ... --overwrite)")
    if raw.get("kind") != _KIND or raw.get("version") not in (_VERSION, _LAYOUT_VERSION):
      raise ValueError(f"kind/version {raw.get('kind')!r}/{raw.get('version')!r}, "
                       f"expected {_KIND!r}/{_VERSION} or {_LAYOUT_VERSION}")
    # Version 3 has a layout (and only it): layout_from_json checks it (a ConfigError).
    layout = (fl.layout_from_json(raw["layout"]) if raw["version"] == _LAYOUT_VERSION else None)
    arrays = _ARRAYS + (() if layout is None else bag_shards.array_names(layout))
    shards = tuple(_ShardInfo(int(s["num_examples"]),
                              {a: dict(s["files"][a]) for a in arrays}) for s in raw["shards"])
    fields = tuple(FieldSpec(str(f["name"]), int(f["num_rows"])) for f in raw["fields"])
    info = SplitInfo(int(raw["num_examples"]), fields, int(raw["num_dense"]),
                     str(np.dtype(raw["ids_dtype"])), shards, dict(raw["dataset"]), layout)
    if len(fields) != int(raw["num_fields"]):
      raise ValueError(f"num_fields {raw['num_fields']} but {len(fields)} fields")
    if layout is not None and len(fields) != layout.num_features:
      raise ValueError(f"{len(fields)} fields but the layout has {layout.num_features} features")
  except (ValueError, KeyError, TypeError) as exc:
    raise CorruptShardError(path, f"malformed split index ({exc})") from exc
  if info.num_examples != sum(s.num_examples for s in shards):
    raise CorruptShardError(path, "num_examples is not the sum of the shards' counts")
  return info


ShardArrays = bag_shards.StoredExamples  # one shard's read-only views of its memory maps


class ShardSplit:
  """A split directory opened for reading.

  Args:
    directory: holds `split.json` and the shards.
    verify_checksums: check each shard's CRC-32s on its first read (its values
      are checked on the first read either way).

  Raises:
    CorruptShardError: `split.json` missing or malformed, or a shard file
      missing, of the wrong size, or with an unexpected `.npy` header.
  """

  def __init__(self, directory: str, verify_checksums: bool = True):
    self.directory = directory
    self.info = read_split_info(directory)
    self.verify_checksums = bool(verify_checksums)
    self._verified: set[int] = set()  # shards whose CRC-32s matched
    self._checked: set[int] = set()  # shards whose values passed `_check_values`
    self._lock = threading.Lock()
    for index in range(len(self.info.shards)):
      self._open(index, verify=False)  # sizes and headers of every file, now

  @property
  def num_examples(self) -> int:
    """Examples in the split."""
    return self.info.num_examples

  @property
  def num_shards(self) -> int:
    """Shard files (each a set of .npy columns)."""
    return len(self.info.shards)

  def _expected(self, index: int, array: str, maps: dict) -> tuple[np.dtype, tuple]:
    """(dtype, shape) of `array` in shard `index`; None in a shape: any length (bag values)."""
    n = self.info.shards[index].num_examples
    ids_dtype = np.dtype(self.info.ids_dtype)
    if array in _ARRAYS:
      columns = len(bag_shards.id_fields(self.info.fields, self.info.layout))
      shape = {"ids": (n, columns), "dense": (n, self.info.num_dense), "labels": (n,)}[array]
      return (ids_dtype if array == "ids" else np.dtype(np.float32)), shape
    return bag_shards.expected_array(array, n, ids_dtype, maps)

  def _open(self, index: int, verify: bool) -> ShardArrays:
    shard = self.info.shards[index]
    maps: dict[str, Any] = {}
    for array in self.info.arrays:
      meta = shard.files[array]
      path = os.path.join(self.directory, meta["file"])
      if not os.path.exists(path):
        raise CorruptShardError(path, f"missing (listed in {SPLIT_FILE})")
      size = os.path.getsize(path)
      if size != int(meta["bytes"]):
        raise CorruptShardError(path, f"{size} bytes, {SPLIT_FILE} says {meta['bytes']} "
                                      "(truncated or replaced)")
      if verify:
        crc = f"{digest.file_digest(path)['crc32']:08x}"
        if crc != meta["crc32"]:
          raise CorruptShardError(path, f"CRC-32 {crc}, {SPLIT_FILE} says {meta['crc32']} "
                                        "(corrupt: preprocess again)")
      dtype, shape = self._expected(index, array, maps)
      try:
        m = np.load(path, mmap_mode="r", allow_pickle=False)
      except ValueError as exc:
        raise CorruptShardError(path, f"unreadable .npy file ({exc})") from exc
      if (m.ndim != len(shape) or m.dtype != dtype
          or any(e is not None and e != g for e, g in zip(shape, m.shape, strict=True))):
        want = ", ".join("T" if e is None else str(e) for e in shape)
        raise CorruptShardError(path, f"holds {m.dtype}{list(m.shape)}, expected {dtype}[{want}]")
      maps[array] = np.asarray(m)  # a plain ndarray view; keeps the map alive
    layout = self.info.layout
    bags = () if layout is None else bag_shards.from_files(maps, layout)
    return ShardArrays(maps["ids"], maps["dense"], maps["labels"], bags)

  def _check_values(self, index: int, arrays: ShardArrays) -> None:
    """ShardValueError naming the file, row and field of shard `index`'s first bad value."""
    id_fields = bag_shards.id_fields(self.info.fields, self.info.layout)
    names = [f.name for f in id_fields]
    rows = [f.num_rows for f in id_fields]
    files = self.info.shards[index].files
    for start in range(0, self.info.shards[index].num_examples, _CHECK_ROWS):
      block = slice(start, start + _CHECK_ROWS)
      bad = validate.first_bad_id(arrays.ids[block], rows)
      if bad is not None:
        raise ShardValueError(os.path.join(self.directory, files["ids"]["file"]),
                              start + bad.row, names[bad.column],
                              f"id {bad.value} outside the field's rows [0, {rows[bad.column]})")
      bad = validate.first_bad_label(arrays.labels[block])
      if bad is not None:
        raise ShardValueError(os.path.join(self.directory, files["labels"]["file"]),
                              start + bad.row, "label", f"label {bad.value} is not 0 or 1")
      bad = validate.first_bad_dense(arrays.dense[block])
      if bad is not None:
        raise ShardValueError(os.path.join(self.directory, files["dense"]["file"]),
                              start + bad.row, f"dense[{bad.column}]",
                              f"dense value {bad.value} is not finite")
    layout = self.info.layout
    bags = bag_shards.ragged_features(layout) if layout is not None else ()
    for f, bag in zip(bags, arrays.bags, strict=True):
      assert layout is not None  # bags exist only in a layout
      found = bag_shards.first_bad_bag(bag, f, layout)
      if found is not None:
        raise ShardValueError(os.path.join(self.directory, files[found.array]["file"]),
                              found.row, layout.features[f].name, found.reason)

  def shard(self, index: int) -> ShardArrays:
    """Memory-mapped (read-only) ids / dense / labels of shard `index`, checked once.

    Raises:
      CorruptShardError: on the first read, a CRC-32 mismatch (`verify_checksums`)
        or an invalid value (`ShardValueError`, naming file, row and field).
    """
    with self._lock:
      verify = self.verify_checksums and index not in self._verified
      check = index not in self._checked
    arrays = self._open(index, verify)
    if check:
      self._check_values(index, arrays)
    with self._lock:
      if verify:
        self._verified.add(index)
      self._checked.add(index)
    return arrays

  def verify(self) -> None:
    """Checks every shard's CRC-32s and values now (CorruptShardError naming the first bad file)."""
    for index in range(self.num_shards):
      self._check_values(index, self._open(index, verify=True))
    with self._lock:
      self._verified.update(range(self.num_shards))
      self._checked.update(range(self.num_shards))

  def chunks(self, chunk_size: int, rng: np.random.Generator | None = None) -> Iterator[Batch]:
    """One pass over the split as chunks of at most `chunk_size` examples.

    Chunks never straddle shards (a shard's last chunk may be shorter); cut
    them into fixed-size batches with `batching.rebatch`.

    Args:
      chunk_size: examples per chunk, also the block size of the shuffle.
      rng: None: file order. Else the shards, and the blocks of `chunk_size`
        examples within each shard, come in an order drawn from `rng` (its
        state advances, so each pass differs).

    Yields:
      Batches of fresh arrays (ids int64, mask ones): copies of contiguous
      slices of the maps, so page faults and disk reads happen here.
    """
    if int(chunk_size) < 1:
      raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    order = range(self.num_shards) if rng is None else rng.permutation(self.num_shards)
    for index in order:
      arrays = self.shard(int(index))
      n = self.info.shards[int(index)].num_examples
      starts = np.arange(0, n, chunk_size)
      if rng is not None:
        starts = rng.permutation(starts)
      for start in starts.tolist():
        stop = min(start + chunk_size, n)
        yield bag_shards.to_batch(arrays.rows(start, stop), self.info.layout)
