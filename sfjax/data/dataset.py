"""Dataset factory: `make_dataset(data_cfg, seed) -> CTRDataset`.

`data_cfg` is the `data` block of a CTR config (`sfjax/train/defaults.py`):
  * format: 'synthetic' | 'multihot' | 'criteo' | 'avazu' | 'parquet' | 'movielens' |
    'preprocessed' ('parquet': `sfjax.data.parquet`, columns from `data.parquet`).
  * train_path / eval_path / test_path: comma-separated globs (file formats);
    eval splits are 'eval' (if eval_path) and 'test' (if test_path).
    'preprocessed' reads one directory, train_path, written by
    `preprocessed.preprocess_files` (`python -m experiments.preprocess`).
  * hash_rows > 0: `HashingMapper(hash_rows)`; 0: a vocabulary built in one
    streaming pass over the train files, values seen >= min_count times get a
    row, the rest share the OOV row 0.
  * skip_bad_lines: drop and count malformed lines (`stats['bad_lines']`)
    instead of raising `DataFormatError` naming file and line.
    A split with no examples is a `ValueError` naming its config key: at
    construction when its files hold no data line (0-byte files, headers only),
    at the end of its first pass when every line was skipped.
  * shuffle_buffer: examples in the training streaming shuffle buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import ml_collections

from sfjax.core import names
from sfjax.data import (
  avazu,
  batching,
  criteo,
  feature_map,
  feature_pooling,
  feature_select,
  movielens,
  table_settings,
  text_io,
)
from sfjax.data.types import Batch, DatasetSpec, make_batch

_LINE_FORMATS: dict[str, Callable[[], text_io.LineFormat]] = {"criteo": criteo.CriteoFormat, "avazu": avazu.AvazuFormat}


class CTRDataset(Protocol):
  """What the trainer needs from a data set.

  Attributes:
    spec: fields (rows per field) and number of dense features.
    eval_splits: names accepted by `eval_batches`.
    oracle: per eval split {'auc', 'logloss'} of the true click model (known
      only for synthetic data), else None.
    stats: at least 'bad_lines' (malformed lines skipped so far).
  """

  # Read-only properties: a data set may hold them as attributes or compute them.
  @property
  def spec(self) -> DatasetSpec:
    """Fields and dense features."""

  @property
  def eval_splits(self) -> tuple[str, ...]:
    """Names accepted by `eval_batches`."""

  @property
  def oracle(self) -> dict[str, dict[str, float]] | None:
    """Per eval split metrics of the true click model, or None."""

  @property
  def stats(self) -> dict:
    """At least 'bad_lines'."""

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite iterator of full, shuffled batches of `batch_size` examples."""

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite iterator over a split; the last batch padded with mask 0."""


class FileCTRDataset:
  """`CTRDataset` streaming line-oriented files (Criteo TSV, Avazu CSV)."""

  def __init__(self, fmt: text_io.LineFormat, data_cfg: ml_collections.ConfigDict,
               chunk_lines: int = 8192):
    if not str(data_cfg.train_path).strip():
      raise ValueError(f"data.train_path is empty: data.format={data_cfg.format!r} reads files "
                       "(comma-separated globs, .gz allowed)")
    if int(data_cfg.shuffle_buffer) < 0:
      raise ValueError(f"data.shuffle_buffer must be >= 0, got {data_cfg.shuffle_buffer}")
    self.format = fmt
    self.format_name = str(data_cfg.format)
    self.shuffle_buffer = int(data_cfg.shuffle_buffer)
    skip = bool(data_cfg.skip_bad_lines)
    split_paths = {"train": ("data.train_path", data_cfg.train_path),
                   "eval": ("data.eval_path", data_cfg.eval_path),
                   "test": ("data.test_path", data_cfg.test_path)}
    self._keys = {name: key for name, (key, spec) in split_paths.items() if str(spec).strip()}
    self._readers = {
        name: text_io.TextReader(text_io.expand_paths(str(split_paths[name][1]), key), fmt, skip,
                                 chunk_lines)
        for name, key in self._keys.items()}
    for name, reader in self._readers.items():
      # Fail now, not at the first evaluation (or the first epoch's end).
      if not reader.has_data_lines():
        raise ValueError(f"{self._keys[name]}: split {name!r} has no examples: no data line in "
                         f"{', '.join(reader.paths)}")
    self.eval_splits = tuple(name for name in ("eval", "test") if name in self._readers)
    train = self._readers["train"]
    self.mapper = feature_map.make_mapper(
        data_cfg.hash_rows, data_cfg.min_count, lambda: (raw.values for raw in train),
        len(fmt.field_names))
    self.spec: DatasetSpec = self.mapper.dataset_spec(fmt.field_names, fmt.num_dense)
    self.oracle = None

  @property
  def stats(self) -> dict:
    """'bad_lines' (all splits) and 'bad_lines_by_split', counted so far."""
    by_split = {name: r.bad_lines for name, r in self._readers.items()}
    return {"bad_lines": sum(by_split.values()), "bad_lines_by_split": by_split}

  @property
  def train_reader(self) -> text_io.TextReader:
    """The training files' reader (`read_chunk`: per-process input, `train/chunk_feed`)."""
    return self._readers["train"]

  @property
  def paths(self) -> dict[str, tuple[str, ...]]:
    """Per split, the files read (globs expanded, in reading order)."""
    return {name: r.paths for name, r in self._readers.items()}

  def chunks(self, split: str) -> Iterator[Batch]:
    """One pass over a split ('train' or an eval split) as mapped, variable-size batches."""
    if split not in self._readers:
      raise ValueError(f"unknown split {split!r} (known: {', '.join(self._readers)})")
    reader = self._readers[split]
    examples = 0
    for raw in reader:
      examples += raw.labels.shape[0]
      yield make_batch(self.mapper(raw.values), raw.dense, raw.labels)
    if not examples:  # Every line was malformed and skipped (data.skip_bad_lines).
      raise ValueError(f"{self._keys[split]}: split {split!r} has no examples: all "
                       f"{reader.bad_lines} data lines of {', '.join(reader.paths)} were "
                       "malformed and skipped")

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite full batches: epochs through a seeded streaming shuffle buffer."""
    return batching.train_batches(
        lambda: self.chunks("train"), batch_size, self.shuffle_buffer, seed)

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite batches in file order, the last one padded with mask 0."""
    if split not in self.eval_splits:
      known = ", ".join(self.eval_splits) or "none: set data.eval_path / data.test_path"
      raise ValueError(f"unknown eval split {split!r} (known: {known})")
    return batching.eval_batches(self.chunks(split), batch_size)


def make_dataset(data_cfg: ml_collections.ConfigDict, seed: int) -> CTRDataset:
  """Builds the data set `data_cfg.format` names.

  Args:
    data_cfg: the `data` block of a CTR config.
    seed: run seed; used by the synthetic generator (file formats take
      their shuffle seed in `train_batches`, MovieLens its split seed from
      `data.movielens.split_seed`).

  Returns:
    A `CTRDataset`.

  Raises:
    ValueError: unknown `data.format`, empty `data.train_path` for a file
      or directory format, or an invalid mapping setting.
  """
  data = names.lookup(DATA_FORMATS, str(data_cfg.format), "data.format", "format")(
      data_cfg, seed)
  data = feature_select.with_features(data, str(data_cfg.get("use_features", "")))
  data = feature_pooling.with_pooling(data, str(data_cfg.get("pooling", "")))
  return table_settings.with_tables(data, str(data_cfg.get("tables", "")))


def _synthetic(data_cfg, seed: int) -> CTRDataset:
  from sfjax.data.generated.synthetic import SyntheticCTR  # pylint: disable=import-outside-toplevel
  return SyntheticCTR(data_cfg.synthetic, seed)


def _multihot(data_cfg, seed: int) -> CTRDataset:
  from sfjax.data.generated.multihot import MultihotCTR  # pylint: disable=import-outside-toplevel
  return MultihotCTR(data_cfg.multihot, seed)


def _parquet(data_cfg, seed: int) -> CTRDataset:
  from sfjax.data.parquet.dataset import ParquetDataset  # pylint: disable=import-outside-toplevel
  del seed  # the shuffle seed comes with `train_batches`
  return ParquetDataset(data_cfg)


def _preprocessed(data_cfg, seed: int) -> CTRDataset:
  # preprocessed.py builds text data sets through this module: imported on use, no cycle.
  from sfjax.data.preprocessed import PreprocessedDataset  # pylint: disable=import-outside-toplevel
  del seed  # the shuffle seed comes with `train_batches`
  return PreprocessedDataset(data_cfg)


# Formats read from one directory, data.train_path (its splits are subdirectories).
_DIRECTORY_FORMATS = {"preprocessed": _preprocessed}

# format name -> (data_cfg, seed) -> CTRDataset. The registry every format list derives from;
# a new format registers its builder here.
DATA_FORMATS: dict[str, Callable[[ml_collections.ConfigDict, int], CTRDataset]] = {
    "synthetic": _synthetic,
    "multihot": _multihot,
    "criteo": lambda data_cfg, seed: FileCTRDataset(_LINE_FORMATS["criteo"](), data_cfg),
    "avazu": lambda data_cfg, seed: FileCTRDataset(_LINE_FORMATS["avazu"](), data_cfg),
    "parquet": _parquet,
    "movielens": lambda data_cfg, seed: movielens.MovieLensDataset(data_cfg),
    **_DIRECTORY_FORMATS,
}
KNOWN_FORMATS: tuple[str, ...] = tuple(DATA_FORMATS)
# read from train_path / eval_path files
FILE_FORMATS: tuple[str, ...] = tuple(_LINE_FORMATS) + ("parquet",)
DIRECTORY_FORMATS: tuple[str, ...] = tuple(_DIRECTORY_FORMATS)  # read from the train_path directory
