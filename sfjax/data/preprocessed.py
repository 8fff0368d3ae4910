"""The `preprocessed` format: text splits parsed and mapped once, then read as binary shards.

Text parsing + hashing runs at ~1.4e5 lines/s per core; the shards are read at
millions of examples/s (`experiments/bench_input.py`). A preprocessed directory
DIR (`data.train_path` of a `data.format=preprocessed` config) holds:

  spec.json        fields (name, rows), num_dense, the source format and files,
                   the mapping settings, examples and dropped bad lines per split
  mapping.json     how raw values became ids: hashing (rows per field), or a
                   vocabulary and its key files
  vocabulary/<field>.keys.npy   (vocabulary only) [V_f] uint64 sorted value keys
                   (`feature_map.value_keys`): key i is row i + 1, row 0 is OOV
  train/ eval/ [test/]          `shards` split directories

`_preprocess_splits` writes spec.json last, so a directory without it is
unfinished. Writing goes through `FileCTRDataset.chunks`, i.e. the very mapping
the text path trains with, in file order: with `data.shuffle_buffer=0` the
shards yield the same examples in the same order as the text files.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterator

import ml_collections
import numpy as np

from sfjax.core import atomic, background
from sfjax.core.errors import ConfigError
from sfjax.data import batching, dataset, feature_map, shards
from sfjax.data.types import Batch, DatasetSpec, FieldSpec

_SPEC_FILE = "spec.json"
_MAPPING_FILE = "mapping.json"
_VOCABULARY_DIR = "vocabulary"
_SPLITS = ("train", "eval", "test")
DEFAULT_ROWS_PER_SHARD = 1 << 20  # ~170 MB per shard for Criteo (26 int32 ids, 13 floats)
_KIND = "sfjax.preprocessed"
_VERSION = 1
_OWN_ENTRIES = (_SPEC_FILE, _MAPPING_FILE, _VOCABULARY_DIR) + _SPLITS  # what --overwrite removes


def _check_out_dir(out_dir: str, overwrite: bool) -> list[str]:
  """The entries of `out_dir` that preprocessing would replace (none if it is new or empty).

  Raises:
    FileExistsError: `out_dir` is not empty and `overwrite` is False, or it
      holds entries a preprocessing run does not write (never deleted).
  """
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"{out_dir}: exists and is not a directory")
  entries = sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []
  if entries and not overwrite:
    raise FileExistsError(f"{out_dir}: output directory is not empty ({', '.join(entries[:5])}"
                          f"{', ...' if len(entries) > 5 else ''}); choose a new one or overwrite")
  foreign = [e for e in entries if e not in _OWN_ENTRIES]
  if foreign:
    raise FileExistsError(f"{out_dir}: holds files preprocessing does not write "
                          f"({', '.join(foreign[:5])}); not overwriting it")
  return entries


def _prepare_out_dir(out_dir: str, overwrite: bool) -> None:
  """`_check_out_dir`, then removes an earlier preprocessing and creates `out_dir`."""
  entries = _check_out_dir(out_dir, overwrite)
  # spec.json first: a half-deleted directory must never look finished.
  for entry in sorted(entries, key=lambda e: e != _SPEC_FILE):
    path = os.path.join(out_dir, entry)
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)
  os.makedirs(out_dir, exist_ok=True)


def _mapping_settings(mapper: feature_map.FeatureMapper) -> dict:
  """The JSON description of a mapper (spec.json's 'mapping')."""
  if isinstance(mapper, feature_map.HashingMapper):
    return {"kind": "hashing", "num_rows": int(mapper.num_rows)}
  if isinstance(mapper, feature_map.Vocabulary):
    return {"kind": "vocabulary", "min_count": int(mapper.min_count),
            "num_distinct": [int(n) for n in mapper.num_distinct]}
  raise TypeError(f"cannot store a mapper of type {type(mapper).__name__}")


def _save_mapping(mapper: feature_map.FeatureMapper, field_names, out_dir: str) -> None:
  """Writes mapping.json (and a vocabulary's keys) under `out_dir`."""
  settings = dict(_mapping_settings(mapper))
  settings["key"] = ("feature_map.value_keys: SplitMix64 over the raw value's bytes "
                     "(8-byte little-endian words) from a per-field salt")
  if isinstance(mapper, feature_map.HashingMapper):
    settings["row"] = "key mod num_rows"
  elif isinstance(mapper, feature_map.Vocabulary):  # mapping_settings rejected other mappers
    settings["row"] = "1 + position of the key in the field's sorted keys; 0 = out of vocabulary"
    settings["fields"] = []
    for name, keys in zip(field_names, mapper.keys, strict=True):
      rel = os.path.join(_VOCABULARY_DIR, f"{name}.keys.npy")
      atomic.atomic_write(os.path.join(out_dir, rel),
                          functools.partial(np.save, arr=np.asarray(keys, np.uint64)))
      settings["fields"].append({"name": name, "keys": rel, "num_keys": int(keys.shape[0])})
  atomic.atomic_write(os.path.join(out_dir, _MAPPING_FILE), json.dumps(settings, indent=1) + "\n")


def _load_mapping(root: str) -> feature_map.FeatureMapper:
  """The mapper that produced DIR's ids (maps new raw values the same way)."""
  with open(os.path.join(root, _MAPPING_FILE)) as f:
    settings = json.load(f)
  if settings["kind"] == "hashing":
    return feature_map.HashingMapper(int(settings["num_rows"]))
  keys = tuple(np.load(os.path.join(root, fld["keys"])) for fld in settings["fields"])
  return feature_map.Vocabulary(keys, int(settings["min_count"]),
                                tuple(int(n) for n in settings["num_distinct"]))


def _preprocess_splits(source, out_dir: str, rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
                       overwrite: bool = False) -> dict:
  """Streams every split of a text data set into shards under `out_dir`.

  Args:
    source: a `dataset.FileCTRDataset` (its `chunks`, `spec`, `mapper`,
      `eval_splits`, `format_name`, `paths`, `stats`).
    out_dir: DIR; must be empty or missing unless `overwrite`.
    rows_per_shard: examples per shard file.
    overwrite: replace an earlier preprocessing in `out_dir`.

  Returns:
    The contents of DIR/spec.json.
  """
  _prepare_out_dir(out_dir, overwrite)
  spec: DatasetSpec = source.spec
  _save_mapping(source.mapper, [f.name for f in spec.fields], out_dir)
  splits = {}
  for split in ("train",) + tuple(source.eval_splits):
    info = shards.write_split(source.chunks(split), os.path.join(out_dir, split), spec,
                              rows_per_shard)
    splits[split] = {"num_examples": info.num_examples, "num_shards": len(info.shards),
                     "bad_lines": int(source.stats["bad_lines_by_split"].get(split, 0))}
  meta = {"kind": _KIND, "version": _VERSION,
          "fields": [{"name": f.name, "num_rows": f.num_rows} for f in spec.fields],
          "num_dense": spec.num_dense,
          "source": {"format": source.format_name,
                     "paths": {k: list(v) for k, v in source.paths.items()}},
          "mapping": _mapping_settings(source.mapper),
          "rows_per_shard": int(rows_per_shard), "splits": splits}
  atomic.atomic_write(os.path.join(out_dir, _SPEC_FILE), json.dumps(meta, indent=1) + "\n")
  return meta


def preprocess_files(data_cfg: ml_collections.ConfigDict, out_dir: str,
                     rows_per_shard: int = DEFAULT_ROWS_PER_SHARD, overwrite: bool = False) -> dict:
  """Builds the text data set `data_cfg` describes and preprocesses it into `out_dir`.

  The mapping (hashing, or the one-pass vocabulary) is exactly the one training
  from the text files builds.

  Raises:
    ConfigError: `data.format` is not a text format, or `data.eval_path` is empty.
    FileExistsError: `out_dir` is not empty (and not `overwrite`).
  """
  if str(data_cfg.format) not in dataset.FILE_FORMATS:
    raise ConfigError(f"config field data.format: preprocessing reads text formats "
                      f"({', '.join(dataset.FILE_FORMATS)}), got {data_cfg.format!r}")
  if not str(data_cfg.eval_path).strip():
    raise ConfigError("config field data.eval_path: required to preprocess (it becomes DIR/eval)")
  _check_out_dir(out_dir, overwrite)  # fail before a long vocabulary pass
  source = dataset.make_dataset(data_cfg, seed=0)
  return _preprocess_splits(source, out_dir, rows_per_shard, overwrite)


def _read_spec(root: str) -> dict:
  """Parses DIR/spec.json; CorruptShardError naming it if missing or malformed."""
  path = os.path.join(root, _SPEC_FILE)
  if not os.path.exists(path):
    raise shards.CorruptShardError(path, "missing: not a preprocessed directory, or "
                                         "preprocessing did not finish (run experiments.preprocess)")
  try:
    with open(path) as f:
      meta = json.load(f)
    if meta.get("kind") != _KIND or meta.get("version") != _VERSION:
      raise ValueError(f"kind/version {meta.get('kind')!r}/{meta.get('version')!r}")
    meta["dataset_spec"] = DatasetSpec(
        tuple(FieldSpec(str(f["name"]), int(f["num_rows"])) for f in meta["fields"]),
        int(meta["num_dense"]))
    meta["splits"] = dict(meta["splits"])
  except (ValueError, KeyError, TypeError) as exc:
    raise shards.CorruptShardError(path, f"malformed ({exc})") from exc
  return meta


def _in_background(batches: Iterator[Batch], prefetch: int, name: str) -> Iterator[Batch]:
  """Runs `batches` on a thread; closing (or dropping) this generator stops it."""
  with background.BackgroundIterator(batches, maxsize=prefetch, name=name) as it:
    yield from it


class PreprocessedDataset:
  """`CTRDataset` over a preprocessed directory (`data.train_path`).

  Training reads the train shards through `batching.train_batches`: with
  `data.shuffle_buffer` > 1 each epoch visits the shards, and the blocks of
  `read_chunk` examples in each, in a seeded random order, mixed further by the
  streaming shuffle buffer; otherwise in file order (the text path's order).
  Shard reading and batching run on a background thread.

  Args:
    data_cfg: the `data` block; uses train_path (DIR) and shuffle_buffer (the
      mapping settings are DIR's, from spec.json).
    read_chunk: examples per read (and per shuffled block).
    prefetch: batches the background thread may run ahead.
  """

  def __init__(self, data_cfg: ml_collections.ConfigDict, read_chunk: int = 8192,
               prefetch: int = 4):
    root = os.path.expanduser(str(data_cfg.train_path).strip())
    if not root:
      raise ValueError("data.train_path is empty: data.format='preprocessed' reads the directory "
                       "written by `python -m experiments.preprocess --out=DIR`")
    if int(data_cfg.shuffle_buffer) < 0:
      raise ValueError(f"data.shuffle_buffer must be >= 0, got {data_cfg.shuffle_buffer}")
    self.root = root
    meta = _read_spec(root)
    self.spec: DatasetSpec = meta["dataset_spec"]
    self.source, self.mapping = meta["source"], meta["mapping"]
    self._splits: dict[str, shards.ShardSplit] = {}
    for name in _SPLITS:
      if name not in meta["splits"]:
        continue
      split = shards.ShardSplit(os.path.join(root, name))
      if (split.info.num_fields, split.info.num_dense) != (self.spec.num_fields,
                                                           self.spec.num_dense):
        raise shards.CorruptShardError(
            os.path.join(split.directory, shards.SPLIT_FILE),
            f"{split.info.num_fields} fields / {split.info.num_dense} dense, {_SPEC_FILE} says "
            f"{self.spec.num_fields} / {self.spec.num_dense}")
      self._splits[name] = split
    for name in ("train", "eval"):
      if name not in self._splits:
        raise ValueError(f"{os.path.join(root, name)}: the {name} split is required "
                         f"(not listed in {_SPEC_FILE})")
    self.eval_splits = tuple(n for n in ("eval", "test") if n in self._splits)
    self.shuffle_buffer = int(data_cfg.shuffle_buffer)
    self.read_chunk = int(read_chunk)
    self.prefetch = int(prefetch)
    self.oracle = None
    self._bad_lines = {n: int(meta["splits"][n].get("bad_lines", 0)) for n in self._splits}

  @property
  def stats(self) -> dict:
    """'bad_lines' is 0 (shards have none); lines dropped while preprocessing, per split."""
    return {"bad_lines": 0, "preprocess_bad_lines_by_split": dict(self._bad_lines)}

  def split(self, name: str) -> shards.ShardSplit:
    """The opened shards of split `name`."""
    if name not in self._splits:
      raise ValueError(f"unknown split {name!r} (known: {', '.join(self._splits)})")
    return self._splits[name]

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite full batches over epochs (shuffled iff shuffle_buffer > 1), on a thread."""
    train = self._splits["train"]
    shuffle = self.shuffle_buffer > 1  # batching's own rule for an active buffer
    # A stream of its own for the shard/block order; the buffer's rng is seeded by `seed`.
    order_rng = np.random.default_rng([int(seed), 0x5EED]) if shuffle else None

    def epoch():
      return train.chunks(self.read_chunk, order_rng)

    batches = batching.train_batches(epoch, batch_size, self.shuffle_buffer, seed)
    return _in_background(batches, self.prefetch, "sfjax-shards-train")

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite batches in file order, the last one padded with mask 0, on a thread."""
    if split not in self.eval_splits:
      raise ValueError(f"unknown eval split {split!r} (known: {', '.join(self.eval_splits)})")
    chunks = self._splits[split].chunks(self.read_chunk)
    return _in_background(batching.eval_batches(chunks, batch_size), self.prefetch,
                          f"sfjax-shards-{split}")
