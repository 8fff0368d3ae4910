"""The `preprocessed` format: text or Parquet splits parsed and mapped once, read as binary shards.

Text parsing + hashing runs at ~1.4e5 lines/s per core; the shards are read at
millions of examples/s (`experiments/bench_input.py`). A preprocessed directory
DIR (`data.train_path` of a `data.format=preprocessed` config) holds spec.json,
mapping.json, vocabulary/ and the train/ eval/ [test/] `shards` split directories
(`preprocessed_layout` describes them and the digests that tie them together).

`_preprocess_splits` writes spec.json last, so a directory without it is
unfinished. Writing goes through `FileCTRDataset.chunks`, i.e. the very mapping
the text path trains with, in file order: with `data.shuffle_buffer=0` the
shards yield the same examples in the same order as the text files. Parquet with
list columns or shared tables (a feature layout, issue #22) is written as one-hot
ids plus each bag's values + offsets (`bag_shards`) and read back as the very
batches (ids padded with -1, weights) `data.format=parquet` yields. Opening
checks spec.json and mapping.json against every split's recorded digests;
reading checks each shard's CRC-32s and values on its first read (`shards`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import ml_collections
import numpy as np

from sfjax.core import atomic, background
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data import batching, dataset, index_stream, shards
from sfjax.data import preprocessed_layout as layout
from sfjax.data.block_shuffle import GROUP_ROWS, BlockOrder, BlockReader
from sfjax.data.types import Batch, DatasetSpec

DEFAULT_ROWS_PER_SHARD = 1 << 20  # ~170 MB per shard for Criteo (26 int32 ids, 13 floats)
SHUFFLE_MODES = ("buffer", "block")  # data.shuffle (see `PreprocessedDataset`)
DEFAULT_BLOCK_ROWS = 2048  # data.shuffle_block_rows when a config has none
_OWN_ENTRIES = (layout.SPEC_FILE, layout.MAPPING_FILE, layout.VOCABULARY_DIR) + layout.SPLITS


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
  for entry in sorted(entries, key=lambda e: e != layout.SPEC_FILE):
    path = os.path.join(out_dir, entry)
    if os.path.isdir(path):
      shutil.rmtree(path)
    else:
      os.remove(path)
  os.makedirs(out_dir, exist_ok=True)


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
  # The mapper's fields: one per field, or one per table (shared by features) with a layout.
  mapped = spec.fields if spec.layout is None else spec.layout.tables
  mapping_crc32 = layout.save_mapping(source.mapper, [f.name for f in mapped], out_dir)
  meta = {"kind": layout.KIND, "version": layout.VERSION,
          "fields": [{"name": f.name, "num_rows": f.num_rows} for f in spec.fields],
          "num_dense": spec.num_dense,
          "source": {"format": source.format_name,
                     "paths": {k: list(v) for k, v in source.paths.items()}},
          "mapping": layout.mapping_settings(source.mapper), "mapping_crc32": mapping_crc32,
          "rows_per_shard": int(rows_per_shard)}
  if spec.layout is not None:  # absent otherwise: one-hot directories stay as they were
    meta["layout"] = fl.layout_to_json(spec.layout)
  digests = {"spec_crc32": layout.spec_crc32(meta), "mapping_crc32": mapping_crc32}
  splits = {}
  for split in ("train",) + tuple(source.eval_splits):
    info = shards.write_split(source.chunks(split), os.path.join(out_dir, split), spec,
                              rows_per_shard, dataset=digests)
    stats = source.stats
    splits[split] = {"num_examples": info.num_examples, "num_shards": len(info.shards),
                     "bad_lines": int(stats["bad_lines_by_split"].get(split, 0))}
    if spec.layout is not None:
      splits[split]["truncated_ids"] = int(stats.get("truncated_ids_by_split", {}).get(split, 0))
  meta["splits"] = splits
  atomic.atomic_write(os.path.join(out_dir, layout.SPEC_FILE), json.dumps(meta, indent=1) + "\n")
  return meta


def preprocess_files(data_cfg: ml_collections.ConfigDict, out_dir: str,
                     rows_per_shard: int = DEFAULT_ROWS_PER_SHARD, overwrite: bool = False) -> dict:
  """Builds the text data set `data_cfg` describes and preprocesses it into `out_dir`.

  The mapping (hashing, or the one-pass vocabulary) is exactly the one training
  from the text files builds.

  Parquet with list columns or shared tables is stored with its feature layout (the
  bags as values + offsets); the shards then yield `data.format=parquet`'s batches.

  Raises:
    ConfigError: `data.format` is not a file format (text or Parquet), or
      `data.eval_path` is empty.
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


def _in_background(batches: Iterator[Batch], prefetch: int, name: str) -> Iterator[Batch]:
  """Runs `batches` on a thread; closing (or dropping) this generator stops it."""
  with background.BackgroundIterator(batches, maxsize=prefetch, name=name) as it:
    yield from it


def _groups_in_background(groups: Iterator[list[Batch]], prefetch: int, name: str
                          ) -> Iterator[Batch]:
  """Runs `groups` (lists of batches) on a thread, `prefetch` groups ahead, and yields their
  batches one by one: one thread hand-off per group (on 2 cores a hand-off per batch of
  4096 cost ~10-20% of the block shuffle's rate); closing this generator stops it."""
  with background.BackgroundIterator(groups, maxsize=prefetch, name=name) as it:
    for group in it:
      yield from group


class PreprocessedDataset:
  """`CTRDataset` over a preprocessed directory (`data.train_path`).

  Training is shuffled iff `data.shuffle_buffer` > 1, else in file order (the text
  path's order). `data.shuffle`:
    buffer  (the default) through `batching.train_batches`: each epoch visits the
            shards, and the blocks of `read_chunk` examples in each, in a seeded random
            order, mixed further by the streaming shuffle buffer (row by row).
    block   `BlockOrder`: blocks of `data.shuffle_block_rows` examples in a random
            order per epoch, the rows of each window of `shuffle_buffer` examples
            permuted; read by `BlockReader` (whole blocks copied, rows gathered from
            memory): several times faster, and a pure function of (seed, epoch);
            `data.shuffle_threads=2` prepares the next window on a second thread.
  Shard reading and batching run on a background thread.

  Args:
    data_cfg: the `data` block; uses train_path (DIR), shuffle_buffer and, when present,
      shuffle, shuffle_block_rows and shuffle_threads (the mapping settings are DIR's,
      from spec.json).
    read_chunk: examples per read (and per shuffled block).
    prefetch: batches the background thread may run ahead.

  Attributes:
    digests: `preprocessed_layout.dataset_digests` of DIR, checked at opening.

  Raises:
    CorruptShardError: spec.json, mapping.json or a split does not belong to the
      others (naming the file), or DIR predates the digests (preprocess again).
  """

  def __init__(self, data_cfg: ml_collections.ConfigDict, read_chunk: int = 8192,
               prefetch: int = 4):
    root = os.path.expanduser(str(data_cfg.train_path).strip())
    if not root:
      raise ValueError("data.train_path is empty: data.format='preprocessed' reads the directory "
                       "written by `python -m experiments.preprocess --out=DIR`")
    if int(data_cfg.shuffle_buffer) < 0:
      raise ValueError(f"data.shuffle_buffer must be >= 0, got {data_cfg.shuffle_buffer}")
    self.shuffle_mode = str(data_cfg.get("shuffle", "buffer"))
    if self.shuffle_mode not in SHUFFLE_MODES:
      raise ValueError(f"data.shuffle must be one of {', '.join(SHUFFLE_MODES)}, "
                       f"got {self.shuffle_mode!r}")
    self.block_rows = int(data_cfg.get("shuffle_block_rows", DEFAULT_BLOCK_ROWS))
    if self.block_rows < 1:
      raise ValueError(f"data.shuffle_block_rows must be >= 1, got {self.block_rows}")
    self.shuffle_threads = int(data_cfg.get("shuffle_threads", 1))
    if self.shuffle_threads not in (1, 2):
      raise ValueError(f"data.shuffle_threads must be 1 or 2, got {self.shuffle_threads}")
    self.root = root
    meta = layout.read_spec(root)
    self.spec: DatasetSpec = meta["dataset_spec"]
    self.source, self.mapping = meta["source"], meta["mapping"]
    self._splits: dict[str, shards.ShardSplit] = {
        name: shards.ShardSplit(os.path.join(root, name)) for name in layout.SPLITS
        if name in meta["splits"]}
    for name in ("train", "eval"):
      if name not in self._splits:
        raise ValueError(f"{os.path.join(root, name)}: the {name} split is required "
                         f"(not listed in {layout.SPEC_FILE})")
    self.digests = layout.checked_digests(root, meta, {n: s.info for n, s in self._splits.items()})
    self.eval_splits = tuple(n for n in ("eval", "test") if n in self._splits)
    self.shuffle_buffer = int(data_cfg.shuffle_buffer)
    self.read_chunk = int(read_chunk)
    self.prefetch = int(prefetch)
    self.oracle = None
    self._bad_lines = {n: int(meta["splits"][n].get("bad_lines", 0)) for n in self._splits}
    self._truncated = {n: int(meta["splits"][n]["truncated_ids"]) for n in self._splits
                       if "truncated_ids" in meta["splits"][n]}
    self.rows_read = 0  # training examples read by index (`read_train`)
    self._train_maps: dict[int, shards.ShardArrays] = {}  # shards opened by `read_train`
    self._reader: BlockReader | None = None  # `read_train`'s, with data.shuffle=block

  @property
  def stats(self) -> dict:
    """'bad_lines' is 0 (shards have none); lines dropped (and, with a feature layout, bag
    ids truncated) while preprocessing, per split."""
    out = {"bad_lines": 0, "preprocess_bad_lines_by_split": dict(self._bad_lines),
           "rows_read": self.rows_read}
    if self._truncated:
      out["preprocess_truncated_ids_by_split"] = dict(self._truncated)
    return out

  def split(self, name: str) -> shards.ShardSplit:
    """The opened shards of split `name`."""
    if name not in self._splits:
      raise ValueError(f"unknown split {name!r} (known: {', '.join(self._splits)})")
    return self._splits[name]

  @property
  def _blocks(self) -> bool:
    """True when training reads the block shuffle (`data.shuffle=block`, shuffled)."""
    return self.shuffle_mode == "block" and self.shuffle_buffer > 1

  def _train_shard(self, index: int) -> shards.ShardArrays:
    """Train shard `index`'s maps, opened (and checked) once, then kept."""
    arrays = self._train_maps.get(index)
    if arrays is None:
      arrays = self._train_maps.setdefault(index, self._splits["train"].shard(index))
    return arrays

  @property
  def _window_blocks(self) -> int:
    """Blocks of a block-shuffle window (`BlockOrder.window_blocks`: shuffle_buffer > 1)."""
    return -(-self.shuffle_buffer // self.block_rows)

  def _block_reader(self) -> BlockReader:
    """A `BlockReader` of the train split holding two windows of blocks."""
    return BlockReader(self._splits["train"], self._train_shard, self.block_rows,
                       2 * self._window_blocks + 1)

  def _block_groups(self, batch_size: int, seed: int) -> Iterator[list[Batch]]:
    """`train_order`'s batches in lists (a window's, up to `GROUP_ROWS` rows each), read
    by a `BlockReader` of their own."""
    order = self.train_order(batch_size, seed)
    assert isinstance(order, BlockOrder)
    yield from self._block_reader().batch_groups(order, ahead=self.shuffle_threads == 2)

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite full batches over epochs (shuffled iff shuffle_buffer > 1), on a thread."""
    if self._blocks:
      window = self.block_rows * self._window_blocks
      per_group = max(1, min(window, GROUP_ROWS) // int(batch_size))  # batches (about)
      return _groups_in_background(self._block_groups(batch_size, seed),
                                   -(-self.prefetch // per_group), "sfjax-shards-train")
    train = self._splits["train"]
    shuffle = self.shuffle_buffer > 1  # batching's own rule for an active buffer
    # A stream of its own for the shard/block order; the buffer's rng is seeded by `seed`.
    order_rng = np.random.default_rng([int(seed), 0x5EED]) if shuffle else None

    def epoch():
      return train.chunks(self.read_chunk, order_rng)

    batches = batching.train_batches(epoch, batch_size, self.shuffle_buffer, seed)
    return _in_background(batches, self.prefetch, "sfjax-shards-train")

  @property
  def indexable(self) -> bool:
    """True when training examples can be read by index (`read_train`): shards without
    bag features (a feature layout's ragged bags are read as a stream)."""
    return self._splits["train"].info.layout is None

  def train_order(self, batch_size: int, seed: int, position: index_stream.Position | None = None
                  ) -> index_stream.ShardOrder | BlockOrder:
    """`train_batches`'s order as example indices (index for index), from `position`."""
    train = self._splits["train"]
    if self._blocks:
      return BlockOrder(train.num_examples, self.block_rows, self.shuffle_buffer, seed,
                        batch_size, position)
    return index_stream.ShardOrder([s.num_examples for s in train.info.shards], self.read_chunk,
                                   self.shuffle_buffer, seed, batch_size, position)

  def read_train(self, indices: np.ndarray) -> Batch:
    """Training examples `indices` [n] (split-wide, in `train_order`'s numbering), in
    that order, gathered from the shards' memory maps (with the block shuffle from the
    blocks a `BlockReader` copied); counts `rows_read`."""
    if not self.indexable:
      raise ValueError(f"{self.root}: shards with bag features are read as a stream, not by index")
    if self._blocks:  # whole blocks, cached (the block shuffle's indices stay in two windows)
      if self._reader is None:
        self._reader = self._block_reader()
      batch = self._reader.read(indices)
      self.rows_read += batch.size
      return batch
    train = self._splits["train"]
    sizes = np.asarray([s.num_examples for s in train.info.shards], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    indices = np.asarray(indices, np.int64)
    shard_of = np.searchsorted(starts, indices, side="right") - 1
    n, f, nd = indices.size, len(train.info.fields), train.info.num_dense
    ids, dense = np.empty((n, f), np.int64), np.empty((n, nd), np.float32)
    labels = np.empty(n, np.float32)
    for s in np.unique(shard_of).tolist():
      at = np.flatnonzero(shard_of == s)
      arrays = self._train_shard(s)
      rows = indices[at] - starts[s]
      ids[at] = np.take(arrays.ids, rows, axis=0)
      dense[at], labels[at] = np.take(arrays.dense, rows, axis=0), np.take(arrays.labels, rows)
    self.rows_read += n
    return Batch(ids, dense, labels, np.ones(n, np.float32))

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite batches in file order, the last one padded with mask 0, on a thread."""
    if split not in self.eval_splits:
      raise ValueError(f"unknown eval split {split!r} (known: {', '.join(self.eval_splits)})")
    chunks = self._splits[split].chunks(self.read_chunk)
    return _in_background(batching.eval_batches(chunks, batch_size), self.prefetch,
                          f"sfjax-shards-{split}")
