"""Synthetic multi-hot CTR data with a planted label model (`data.format='multihot'`, issue #22).

The feature profile follows MLPerf DLRM-DCNv2 (Criteo 1TB multi-hot), scaled down:
most features hold one id or a small bag, a few hold long bags, and a behaviour
sequence shares the item table with the target item:

  user, item              one-hot; `item` is the target item
  ctx0 .. ctx{C-1}        one-hot context fields (site, device, ...)
  bag0 .. bag{B-1}        short multi-hot bags, capacity `short_bag_capacity`; length
                          min(Geometric(1 / short_bag_mean_len), capacity): mean
                          `short_bag_mean_len` before the clip, most bags 1-3 ids.
                          bag0 is weighted (lognormal weights, sum pooling); the others
                          pool by mean (odd) or sum (even).
  long0 .. long{L-1}      long bags, capacity `long_bag_capacity`; length
                          clip(round(LogNormal(log long_bag_median_len, long_bag_sigma)),
                          1, capacity), pooled by sqrtn (even) or mean (odd).
  history                 sequence over the item table (shared with `item`), capacity
                          `history_capacity`, length uniform in [1, capacity], most
                          recent id last, left-aligned.
  dense                   `num_dense` N(0, 1) features.

Every table has Zipf-like id popularity (`synthetic.bounded_power_law_ranks`, hot ids
scattered by a seeded affine bijection); ids in a bag are drawn independently, so a
bag may repeat an id. Labels come from `multihot_model` (first order, bag contents,
target-vs-history similarity, dense); `oracle` reports the AUC / logloss of the true
probabilities per eval split, as `SyntheticCTR` does.

Determinism: chunk c of split s is drawn from `default_rng([seed, SPLIT_ID[s], c])`;
the planted model is calibrated on `_CALIBRATION_ROWS` rows of a stream no split yields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data import batching
from sfjax.data.chunked_rows import ChunkedRows
from sfjax.data.generated import multihot_model as mm
from sfjax.data.generated.synthetic import (
  bounded_power_law_ranks,
  check_non_negative_int,
  make_row_sampler,
)
from sfjax.data.types import Batch, DatasetSpec, FieldSpec, make_batch

_CHUNK_ROWS = 8192  # rows per deterministic chunk; changing it changes every stream
_SPLIT_IDS = {"train": 0, "eval": 1, "test": 3}
_CALIBRATION_SPLIT_ID, _CALIBRATION_ROWS = 2, 2 * _CHUNK_ROWS
_LENGTH_STREAM, _SHUFFLE_STREAM = 0x1E46, 0x5F1F
_MAX_TABLE_ROWS = 1 << 22  # planted values are held per row
_MAX_COUNT = 1 << 62


@dataclasses.dataclass(frozen=True)
class MultihotConfig:
  """Validated generator settings (the `data.multihot` config block)."""

  num_train: int
  num_eval: int
  user_rows: int
  item_rows: int
  num_context: int
  context_rows: int
  num_short_bags: int
  short_bag_capacity: int
  short_bag_rows: int
  short_bag_mean_len: float
  num_long_bags: int
  long_bag_capacity: int
  long_bag_rows: int
  long_bag_median_len: float
  long_bag_sigma: float
  history_capacity: int
  zipf_exponent: float
  planted_dim: int
  num_dense: int
  shares: tuple[float, ...]
  logit_scale: float
  target_ctr: float
  test_rows: int = 0

  @classmethod
  def from_any(cls, cfg) -> MultihotConfig:
    """Reads and checks the fields of a ConfigDict (or any object with them).

    Raises:
      ConfigError: naming the field (`config field data.multihot.<name>: ...`).
    """
    values = {}
    for field in dataclasses.fields(cls):
      if not hasattr(cfg, field.name):
        if field.default is dataclasses.MISSING:
          raise _bad(field.name, "missing from the config")
        values[field.name] = field.default
      else:
        values[field.name] = getattr(cfg, field.name)
    lows = {"num_train": 1, "num_eval": 1, "user_rows": 1, "item_rows": 1, "num_context": 0,
            "context_rows": 1, "num_short_bags": 0, "short_bag_capacity": 1, "short_bag_rows": 1,
            "num_long_bags": 0, "long_bag_capacity": 1, "long_bag_rows": 1, "history_capacity": 1,
            "planted_dim": 1, "num_dense": 0, "test_rows": 0}
    for name, low in lows.items():
      values[name] = _int_field(name, values[name], low)
    for name in ("user_rows", "item_rows", "context_rows", "short_bag_rows", "long_bag_rows"):
      if values[name] > _MAX_TABLE_ROWS:
        raise _bad(name, f"must be <= {_MAX_TABLE_ROWS}, got {values[name]}")
    for name in ("short_bag_mean_len", "long_bag_median_len"):
      values[name] = _float_field(name, values[name], 1.0)
    for name in ("long_bag_sigma", "zipf_exponent", "logit_scale"):
      values[name] = _float_field(name, values[name], 0.0)
    values["target_ctr"] = _float_field("target_ctr", values["target_ctr"], 0.0)
    if not 0.0 < values["target_ctr"] < 1.0:
      raise _bad("target_ctr", f"must be in (0, 1), got {values['target_ctr']!r}")
    shares = values["shares"]
    if not isinstance(shares, (tuple, list)) or len(shares) != len(mm.PARTS):
      raise _bad("shares", f"must be {len(mm.PARTS)} numbers {mm.PARTS}, got {shares!r}")
    values["shares"] = tuple(_float_field("shares", s, 0.0) for s in shares)
    return cls(**values)


def _bad(name: str, message: str) -> ConfigError:
  return ConfigError(f"config field data.multihot.{name}: {message}")


def _int_field(name: str, value, low: int) -> int:
  """`value` as an int in [low, 2**62] (a whole float such as 3.0 passes); else ConfigError.

  Integers are compared exactly (as floats, 2**62 + 1 would round to 2**62 and pass).
  """
  number = _real(value)
  if number is not None and isinstance(value, (int, np.integer)):
    number = int(value)
  if number is None or number != int(number) or not low <= number <= _MAX_COUNT:
    raise _bad(name, f"must be an integer in [{low}, {_MAX_COUNT}], got {value!r}")
  return int(number)


def _float_field(name: str, value, low: float) -> float:
  """`value` as a finite float >= low; else ConfigError."""
  number = _real(value)
  if number is None or number < low:
    raise _bad(name, f"must be a finite number >= {low}, got {value!r}")
  return number


def _real(value) -> float | None:
  """A finite real number as float, or None (bools, strings, None, inf, nan, overflow)."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
    return None
  try:
    number = float(value)
  except OverflowError:
    return None
  return number if np.isfinite(number) else None


def multihot_layout(cfg: MultihotConfig) -> fl.FeatureLayout:
  """The feature layout of the profile (see the module docstring)."""
  tables = [fl.TableSpec("user", cfg.user_rows), fl.TableSpec("item", cfg.item_rows)]
  features = [fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item")]
  for i in range(cfg.num_context):
    tables.append(fl.TableSpec(f"ctx{i}", cfg.context_rows))
    features.append(fl.FeatureSpec(f"ctx{i}", f"ctx{i}"))
  for i in range(cfg.num_short_bags):
    tables.append(fl.TableSpec(f"bag{i}", cfg.short_bag_rows))
    features.append(fl.FeatureSpec(f"bag{i}", f"bag{i}", "multi_hot", cfg.short_bag_capacity,
                                   "mean" if i % 2 else "sum", weighted=i == 0))
  for i in range(cfg.num_long_bags):
    tables.append(fl.TableSpec(f"long{i}", cfg.long_bag_rows))
    features.append(fl.FeatureSpec(f"long{i}", f"long{i}", "multi_hot", cfg.long_bag_capacity,
                                   "mean" if i % 2 else "sqrtn"))
  features.append(fl.FeatureSpec("history", "item", "sequence", cfg.history_capacity))
  return fl.FeatureLayout(tuple(tables), tuple(features))


def _roles(layout: fl.FeatureLayout) -> mm.FeatureRoles:
  """One-hot features, (bag, partner) pairs (user for even bags, item for odd), target, history."""
  one_hot = tuple(f for f, s in enumerate(layout.features) if s.kind == "one_hot")
  bag_features = [f for f, s in enumerate(layout.features) if s.kind == "multi_hot"]
  bags = tuple((b, 1 if i % 2 else 0) for i, b in enumerate(bag_features))
  return mm.FeatureRoles(one_hot, bags, target=1, history=layout.sequence_features()[0])


class MultihotRows(NamedTuple):
  """Generated rows.

  Attributes:
    ids: [N, S] int64 local ids, -1 in padding columns.
    weights: [N, S] float32 per-id weights, 0 in padding columns.
    lengths: [N, F] int64 ids per feature.
    dense: [N, Nd] float32.
    labels: [N] float32 in {0, 1}.
    probs: [N] float64 true click probabilities.
  """

  ids: np.ndarray
  weights: np.ndarray
  lengths: np.ndarray
  dense: np.ndarray
  labels: np.ndarray
  probs: np.ndarray

  def to_batch(self) -> Batch:
    """The learner's view (weights always present)."""
    return make_batch(self.ids, self.dense, self.labels, weights=self.weights)


def _feature_lengths(cfg: MultihotConfig, layout: fl.FeatureLayout, rng: np.random.Generator,
                     n: int) -> np.ndarray:
  """[N, F] int64 ids per feature, drawn from the profile's length distributions."""
  lengths = np.ones((n, layout.num_features), np.int64)
  for f, spec in enumerate(layout.features):
    if spec.kind == "sequence":
      lengths[:, f] = rng.integers(1, spec.capacity + 1, n)
    elif spec.name.startswith("bag"):
      lengths[:, f] = np.minimum(rng.geometric(1.0 / cfg.short_bag_mean_len, n), spec.capacity)
    elif spec.name.startswith("long"):
      raw = np.exp(np.log(cfg.long_bag_median_len) + cfg.long_bag_sigma * rng.standard_normal(n))
      lengths[:, f] = np.clip(np.rint(raw), 1, spec.capacity).astype(np.int64)
  return lengths


class MultihotCTR(ChunkedRows):
  """Synthetic multi-hot data set with a planted model (see the module docstring).

  Implements the trainer's data-set protocol (`spec` with a feature layout,
  `eval_splits`, `train_batches`, `eval_batches`, `stats`, `oracle`) plus
  `generate_rows`. With `test_rows` > 0 the eval splits are ('eval', 'test').
  `stats`: 'bad_lines' (0), 'ids_per_example' (mean real ids per example) and
  'mean_lengths' (per feature), measured on the calibration sample.
  Rows are generated chunk by chunk on demand (nothing but the planted tables stays
  in memory), so `num_train` may exceed RAM.
  """

  eval_splits: tuple[str, ...] = ("eval",)
  chunk_rows, shuffle_stream = _CHUNK_ROWS, _SHUFFLE_STREAM

  def __init__(self, cfg, seed: int):
    """Builds the layout, the id samplers and the calibrated planted model.

    Args:
      cfg: the `data.multihot` ConfigDict, or any object with its attributes.
      seed: non-negative data seed; rows and the planted model are functions of it.
    """
    self.config = MultihotConfig.from_any(cfg)
    self.seed = check_non_negative_int("seed", seed)
    self.layout = multihot_layout(self.config)
    rows_of = {t.name: t.num_rows for t in self.layout.tables}
    self.spec = DatasetSpec(tuple(FieldSpec(f.name, rows_of[f.table]) for f in self.layout.features),
                            self.config.num_dense, self.layout)
    self.roles = _roles(self.layout)
    table_rows = [t.num_rows for t in self.layout.tables]
    sampler = make_row_sampler(self.seed, table_rows, self.config.zipf_exponent, 0)
    column_tables = np.repeat(self.layout.feature_tables, [f.capacity for f in self.layout.features])
    self._column_mul, self._column_add = sampler.perm_mul[column_tables], sampler.perm_add[column_tables]
    self._column_rows = self.layout.column_rows
    raw = mm.init_multihot_model(self.seed, self.layout, sampler.perm_mul, sampler.perm_add,
                                 self.layout.table_index("item"), self.config.num_dense,
                                 self.config.planted_dim)
    calibration = [self._features(np.random.default_rng([self.seed, _CALIBRATION_SPLIT_ID, c]), _CHUNK_ROWS)
                   for c in range(_CALIBRATION_ROWS // _CHUNK_ROWS)]
    ids, weights, lengths, dense = (np.concatenate(p) for p in zip(*calibration, strict=True))
    parts = mm.multihot_logit_parts(raw, self.layout, self.roles, ids, weights, dense)
    self.planted = mm.calibrate_multihot_model(raw, parts, self.config.shares, self.config.logit_scale,
                                               self.config.target_ctr)
    self.stats = {"bad_lines": 0, "ids_per_example": float(lengths.sum(axis=1).mean()),
                  "mean_lengths": {f.name: float(m) for f, m in zip(self.layout.features,
                                                                   lengths.mean(axis=0), strict=True)}}
    self._oracle: dict[str, dict[str, float]] | None = None
    if self.config.test_rows:
      self.eval_splits = ("eval", "test")

  def _features(self, rng: np.random.Generator, n: int):
    """(ids [N, S], weights [N, S], lengths [N, F], dense [N, Nd]) of n rows."""
    layout = self.layout
    lengths = _feature_lengths(self.config, layout, rng, n)
    ranks = bounded_power_law_ranks(rng.random((n, layout.num_columns)), self._column_rows,
                                    self.config.zipf_exponent)
    ids = (self._column_mul * ranks + self._column_add) % self._column_rows
    position = np.arange(layout.num_columns) - np.repeat(layout.feature_starts,
                                                         [f.capacity for f in layout.features])
    real = position < np.repeat(lengths, [f.capacity for f in layout.features], axis=1)
    ids = np.where(real, ids, fl.PADDING_ID)
    weights = real.astype(np.float32)
    for f, spec in enumerate(layout.features):
      if spec.weighted:
        cols = layout.columns(f)
        draw = np.exp(0.5 * rng.standard_normal((n, spec.capacity))).astype(np.float32)
        weights[:, cols] *= draw
    dense = rng.standard_normal((n, self.config.num_dense)).astype(np.float32)
    return ids, weights, lengths, dense

  def _split_id(self, split: str) -> int:
    known = ("train",) + self.eval_splits
    if split not in known:
      raise ValueError(f"unknown split {split!r} of the multihot data set (known: {sorted(known)})")
    return _SPLIT_IDS[split]

  def split_size(self, split: str) -> int:
    """Rows of one epoch of 'train', of 'eval' and of 'test'."""
    self._split_id(split)
    return {"train": self.config.num_train, "eval": self.config.num_eval,
            "test": self.config.test_rows}[split]

  def chunk(self, split: str, index: int) -> MultihotRows:
    """Rows [index * CHUNK_ROWS, (index + 1) * CHUNK_ROWS) of a split, drawn independently."""
    rng = np.random.default_rng([self.seed, self._split_id(split), int(index)])
    ids, weights, lengths, dense = self._features(rng, _CHUNK_ROWS)
    parts = mm.multihot_logit_parts(self.planted, self.layout, self.roles, ids, weights, dense)
    probs = mm.multihot_probabilities(self.planted, parts)
    labels = (rng.random(_CHUNK_ROWS) < probs).astype(np.float32)
    return MultihotRows(ids, weights, lengths, dense, labels, probs)

  def generate_rows(self, split: str, start: int, num_rows: int) -> MultihotRows:
    """Rows [start, start + num_rows) of a split (num_rows >= 1)."""
    if int(start) < 0 or int(num_rows) < 1:
      raise ValueError(f"need start >= 0 and num_rows >= 1, got {start}, {num_rows}")
    pieces = list(self._row_pieces(split, int(start), int(start) + int(num_rows)))
    return MultihotRows(*(np.concatenate(p) for p in zip(*pieces, strict=True)))

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite full batches over epochs of `num_train` rows.

    Every epoch holds the same rows; `default_rng([seed, _SHUFFLE_STREAM, epoch])`
    permutes the chunk order and the rows inside each chunk.
    """
    if int(batch_size) < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    yield from batching.rebatch(self._train_epochs(int(seed), self.config.num_train),
                                int(batch_size), pad_last=False)

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite stream over the split; the last batch is padded (mask 0), never dropped."""
    yield from self._eval_pass(split, int(batch_size))
