"""Synthetic Criteo-like CTR data: row sampling and the `SyntheticCTR` data set.

Rows look like Criteo Kaggle: 26 categorical fields with the real per-field
cardinalities (scaled down), Zipf id frequencies with the hot ids scattered over
each field, 13 dense non-negative integer counts, and labels drawn from the true
click probabilities of a hidden ("planted") factorization machine over the
learner's own features (`sfjax.data.generated.planted`), so the AUC/logloss of those
probabilities is the ceiling of any learner.

Determinism: split `s` is an infinite stream of `_CHUNK_ROWS`-row chunks; chunk
`c` is drawn from `np.random.default_rng([seed, SPLIT_IDS[s], c])`, so any row
range can be regenerated alone and train/eval draws never overlap. The planted
model is a function of the seed too.

Calibration (at construction, ~0.3 s): the planted model is calibrated
(`planted.calibrate_planted_model`) on the ids and counts of `_CALIBRATION_ROWS`
rows of a third stream (split id 2), which no split ever yields.
"""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from sfjax.core.errors import ConfigError
from sfjax.data import batching
from sfjax.data.chunked_rows import ChunkedRows
from sfjax.data.generated import planted
from sfjax.data.types import Batch, DatasetSpec, FieldSpec, make_batch

# Criteo Kaggle Display Advertising Challenge, fields C1..C26: distinct values per
# field (DLRM preprocessing). Source: /work/shared/data/ctr_dataset_facts.json, key
# "criteo_kaggle_cardinalities"; copied so that no data file is needed at run time.
_CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)

_CHUNK_ROWS = 16384  # rows per deterministic chunk; changing it changes every stream
# 'test' (stream 3, off by default): a second held-out split, e.g. one no model selection sees.
_SPLIT_IDS = {"train": 0, "eval": 1, "test": 3}
_CALIBRATION_ROWS = 2 * _CHUNK_ROWS
_CALIBRATION_SPLIT_ID = 2
# Row streams (second seed word); far from the split ids 0, 1, 2 and from the
# planted model's parameter streams.
_SAMPLER_STREAM, _SHUFFLE_STREAM = 0x5A3D, 0x5F1E


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
  """Validated generator settings (the `data.synthetic` config block)."""

  num_train: int
  num_eval: int
  cardinality_scale: float
  min_rows: int
  zipf_exponent: float
  planted_dim: int
  num_dense: int
  test_rows: int = 0  # rows of the 'test' split; 0 = no test split (optional in configs)
  # The planted FM's share of the logit variance (`planted.component_shares`); None (or a
  # config without the field) = the default mix.
  interaction_share: float | None = None

  @classmethod
  def from_any(cls, cfg) -> SyntheticConfig:
    """Reads and checks the fields of a ConfigDict (or any object with them)."""
    values = {}
    for field in dataclasses.fields(cls):
      if not hasattr(cfg, field.name) and field.default is not dataclasses.MISSING:
        values[field.name] = field.default
        continue
      if not hasattr(cfg, field.name):
        raise ConfigError(f"config field data.synthetic.{field.name}: missing from the config")
      values[field.name] = getattr(cfg, field.name)
    for name in ("num_train", "num_eval", "min_rows", "planted_dim", "num_dense", "test_rows"):
      low = 0 if name in ("num_dense", "test_rows") else 1
      values[name] = _as_number(name, values[name], int, low, low_ok=True)
    values["cardinality_scale"] = _as_number("cardinality_scale", values["cardinality_scale"], float, 0.0, low_ok=False)
    values["zipf_exponent"] = _as_number("zipf_exponent", values["zipf_exponent"], float, 0.0, low_ok=True)
    if values["interaction_share"] is not None:
      share = _as_number("interaction_share", values["interaction_share"], float, 0.0, low_ok=True)
      if share > 1.0:
        raise ConfigError(f"config field data.synthetic.interaction_share: must be in [0, 1], "
                          f"got {share!r}")
      values["interaction_share"] = share
    return cls(**values)


_INT64_MAX = 2**63 - 1


def _as_number(name: str, value, kind: type, low: float, low_ok: bool):
  """`value` as a finite int/float >= low (> low unless low_ok).

  Raises:
    ConfigError: naming the field (`config field data.synthetic.<name>: ...`).
  """
  bound = f"{'>=' if low_ok else '>'} {low}"
  try:
    number = kind(value)
    # An int field takes only whole numbers (3.0, not 2.5); a float field any finite real.
    valid = (not isinstance(value, (bool, str, bytes)) and bool(np.isfinite(number))
             and (kind is float or number == value))
  except (TypeError, ValueError, OverflowError):  # int(inf) and float(10**400) overflow
    valid = False
  if kind is int and valid and number > _INT64_MAX:  # Counts become numpy int64 values.
    bound, valid = f"in [{low}, {_INT64_MAX}]", False
  if not valid or number < low or (number == low and not low_ok):
    raise ConfigError(f"config field data.synthetic.{name}: must be a finite {kind.__name__} "
                      f"{bound}, got {value!r}")
  return number


class SyntheticRows(NamedTuple):
  """Raw generated rows, before the learner's transform.

  Attributes:
    ids: [N, F] int64 local row ids per field.
    dense_counts: [N, Nd] int64 non-negative counts (what a Criteo file holds).
    labels: [N] float32 in {0, 1}.
    probs: [N] float64 true click probabilities.
  """

  ids: np.ndarray
  dense_counts: np.ndarray
  labels: np.ndarray
  probs: np.ndarray

  def to_batch(self) -> Batch:
    """The learner's view: dense as log1p(counts) float32, mask all ones."""
    return make_batch(self.ids, np.log1p(self.dense_counts.astype(np.float32)), self.labels)


class RowSampler(NamedTuple):
  """How ids and dense counts are drawn.

  Attributes:
    field_rows: [F] int64 rows per field (n).
    perm_mul, perm_add: [F] int64; id = (perm_mul * rank + perm_add) mod n.
    zipf_exponent: power-law exponent of the ranks.
    dense_log_mean, dense_log_std: [Nd] lognormal parameters of the counts.
  """

  field_rows: np.ndarray
  perm_mul: np.ndarray
  perm_add: np.ndarray
  zipf_exponent: float
  dense_log_mean: np.ndarray
  dense_log_std: np.ndarray


def _scaled_field_rows(scale: float, min_rows: int) -> tuple[int, ...]:
  """Rows per field: max(min_rows, round(criteo_cardinality * scale))."""
  return tuple(max(int(min_rows), int(round(c * scale))) for c in _CRITEO_KAGGLE_CARDINALITIES)


def bounded_power_law_ranks(u: np.ndarray, num_rows: np.ndarray, exponent: float) -> np.ndarray:
  """Maps uniforms to Zipf-like ranks by inverting a bounded continuous power law.

  x has density proportional to x**-exponent on [1, n+1) and rank = floor(x) - 1,
  so P(rank = r) ~ (r+1)**-exponent, in O(1) memory whatever n is.

  Args:
    u: [N, F] uniforms in [0, 1).
    num_rows: [F] rows per field (n).
    exponent: >= 0 (0 = uniform).

  Returns:
    [N, F] int64 ranks in [0, n).
  """
  top = np.asarray(num_rows, dtype=np.float64) + 1.0
  if abs(exponent - 1.0) < 1e-9:
    x = np.exp(u * np.log(top))
  else:
    x = (1.0 + u * (top ** (1.0 - exponent) - 1.0)) ** (1.0 / (1.0 - exponent))
  return np.minimum(x.astype(np.int64) - 1, np.asarray(num_rows, dtype=np.int64) - 1)


def _affine_permutation(rng: np.random.Generator, n: int) -> tuple[int, int]:
  """(a, b) with gcd(a, n) = 1, so r -> (a*r + b) mod n is a bijection of [0, n).

  `a` comes from the middle of [1, n), so consecutive ranks land far apart.
  """
  if n == 1:
    return 1, 0
  while True:
    a = int(rng.integers(max(1, n // 4), max(2, (3 * n) // 4 + 1)))
    if np.gcd(a, n) == 1:
      return a, int(rng.integers(0, n))


def make_row_sampler(seed: int, field_rows, zipf_exponent: float, num_dense: int) -> RowSampler:
  """Seeded rank -> id bijections per field and Criteo-like count distributions."""
  rng = np.random.default_rng([seed, _SAMPLER_STREAM])
  perms = np.asarray([_affine_permutation(rng, int(n)) for n in field_rows], dtype=np.int64).reshape(-1, 2)
  return RowSampler(
      field_rows=np.asarray(field_rows, dtype=np.int64), perm_mul=perms[:, 0], perm_add=perms[:, 1],
      zipf_exponent=float(zipf_exponent),
      # Criteo's I1..I13 are counts: many zeros, heavy tails.
      dense_log_mean=rng.uniform(-1.0, 4.0, size=num_dense), dense_log_std=rng.uniform(0.5, 2.0, size=num_dense))


def _sample_features(sampler: RowSampler, rng: np.random.Generator, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
  """Draws Zipf ranks -> ids [N, F] int64 and lognormal dense counts [N, Nd] int64."""
  ranks = bounded_power_law_ranks(rng.random((num_rows, sampler.field_rows.size)), sampler.field_rows,
                                  sampler.zipf_exponent)
  ids = (sampler.perm_mul * ranks + sampler.perm_add) % sampler.field_rows
  normal = rng.standard_normal((num_rows, sampler.dense_log_mean.size))
  counts = np.floor(np.exp(sampler.dense_log_mean + sampler.dense_log_std * normal)).astype(np.int64)
  return ids, counts


def _sample_rows(sampler: RowSampler, model: planted.PlantedModel, rng: np.random.Generator,
                 num_rows: int) -> SyntheticRows:
  """Draws rows: `_sample_features`, then labels ~ Bernoulli(planted p) from the same `rng`."""
  ids, counts = _sample_features(sampler, rng, num_rows)
  probs = planted.click_probabilities(model, ids, counts)
  labels = (rng.random(num_rows) < probs).astype(np.float32)
  return SyntheticRows(ids, counts, labels, probs)


def _make_planted_model(seed: int, sampler: RowSampler, planted_dim: int,
                        interaction_share: float | None = None) -> planted.PlantedModel:
  """The planted model of a seed, calibrated on the ids and counts of the calibration stream.

  The calibration sample is `_CALIBRATION_ROWS` rows drawn chunk by chunk like a
  split, from stream id `_CALIBRATION_SPLIT_ID`, which no split yields.
  """
  raw = planted.init_planted_model(seed, sampler.field_rows, sampler.perm_mul, sampler.perm_add,
                                   sampler.dense_log_mean.size, planted_dim)
  pieces = [_sample_features(sampler, np.random.default_rng([seed, _CALIBRATION_SPLIT_ID, c]), _CHUNK_ROWS)
            for c in range(_CALIBRATION_ROWS // _CHUNK_ROWS)]
  ids, counts = (np.concatenate(parts) for parts in zip(*pieces, strict=True))
  return planted.calibrate_planted_model(raw, ids, counts,
                                         planted.component_shares(interaction_share))


def _concat_rows(pieces: list[SyntheticRows]) -> SyntheticRows:
  return SyntheticRows(*(np.concatenate(parts, axis=0) for parts in zip(*pieces, strict=True)))


def check_non_negative_int(name: str, value) -> int:
  """`value` as an int; ValueError naming `name` unless it is a non-negative integer (not a bool)."""
  if isinstance(value, bool) or int(value) != value or value < 0:
    raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
  return int(value)


class SyntheticCTR(ChunkedRows):
  """Criteo-like synthetic data set with a planted FM (see the module docstring).

  Implements the trainer's data-set protocol (`spec`, `eval_splits`,
  `train_batches`, `eval_batches`, `stats`) plus `generate`, `oracle` and
  `write_criteo`. A split's row indices are unbounded; `num_train` / `num_eval`
  only set the epoch length and the evaluation set. With `test_rows` > 0 the
  eval splits are ('eval', 'test'): the trainer selects on 'eval' and reports
  'test' (`test_auc`), which no selection sees.
  """

  eval_splits: tuple[str, ...] = ("eval",)
  chunk_rows, shuffle_stream = _CHUNK_ROWS, _SHUFFLE_STREAM

  def __init__(self, cfg, seed: int):
    """Builds the sampler and the calibrated planted model.

    Args:
      cfg: the `data.synthetic` ConfigDict, or any object with its attributes.
      seed: non-negative data seed; rows and the planted model are functions of it.
    """
    self.config = SyntheticConfig.from_any(cfg)
    self.seed = check_non_negative_int("seed", seed)
    rows = _scaled_field_rows(self.config.cardinality_scale, self.config.min_rows)
    self.spec = DatasetSpec(tuple(FieldSpec(f"C{f + 1}", r) for f, r in enumerate(rows)), self.config.num_dense)
    self.sampler = make_row_sampler(self.seed, rows, self.config.zipf_exponent, self.config.num_dense)
    self.planted = _make_planted_model(self.seed, self.sampler, self.config.planted_dim,
                                       self.config.interaction_share)
    self.stats = {"bad_lines": 0}
    self._oracle: dict[str, dict[str, float]] | None = None
    if self.config.test_rows:
      self.eval_splits = ("eval", "test")

  def split_size(self, split: str) -> int:
    """Rows of one epoch of 'train', rows of 'eval' and of 'test' (with test_rows > 0)."""
    sizes = {"train": self.config.num_train, "eval": self.config.num_eval,
             "test": self.config.test_rows}
    self._split_id(split)
    return sizes[split]

  def _split_id(self, split: str) -> int:
    known = ("train",) + self.eval_splits  # 'test' exists only with test_rows > 0
    if split not in known:
      raise ValueError(f"unknown split {split!r} of the synthetic data set (known: {sorted(known)})")
    return _SPLIT_IDS[split]

  def chunk(self, split: str, index: int) -> SyntheticRows:
    """Rows [index * CHUNK_ROWS, (index + 1) * CHUNK_ROWS) of a split, drawn independently."""
    rng = np.random.default_rng([self.seed, self._split_id(split), check_non_negative_int("chunk index", index)])
    return _sample_rows(self.sampler, self.planted, rng, _CHUNK_ROWS)

  def generate_rows(self, split: str, start: int, num_rows: int) -> SyntheticRows:
    """Raw rows [start, start + num_rows) of a split (dense as integer counts)."""
    self._split_id(split)
    start, num_rows = check_non_negative_int("start", start), check_non_negative_int("num_rows", num_rows)
    pieces = list(self._row_pieces(split, start, start + num_rows))
    if not pieces:
      f, nd = self.spec.num_fields, self.spec.num_dense
      return SyntheticRows(np.zeros((0, f), np.int64), np.zeros((0, nd), np.int64), np.zeros(0, np.float32),
                           np.zeros(0, np.float64))
    return _concat_rows(pieces)

  def generate(self, split: str, start: int, num_rows: int) -> tuple[Batch, np.ndarray]:
    """Rows [start, start + num_rows) of a split as a Batch, and their [N] true probabilities."""
    rows = self.generate_rows(split, start, num_rows)
    return rows.to_batch(), rows.probs

  def train_batches(self, batch_size: int, seed: int) -> Iterator[Batch]:
    """Infinite stream of full batches over epochs of `num_train` rows.

    Every epoch holds the same rows; `default_rng([seed, _SHUFFLE_STREAM, epoch])`
    permutes the chunk order and the rows inside each chunk.
    """
    batch_size = _check_positive_batch(batch_size)
    seed, num_train = check_non_negative_int("seed", seed), self.config.num_train

    yield from batching.rebatch(self._train_epochs(seed, num_train), batch_size, pad_last=False)

  def eval_batches(self, split: str, batch_size: int) -> Iterator[Batch]:
    """Finite stream over the split; the last batch is padded (mask 0), never dropped."""
    yield from self._eval_pass(split, _check_positive_batch(batch_size))

  def write_criteo(self, path: str, split: str, num_rows: int) -> None:
    """Writes rows [0, num_rows) of a split as Criteo TSV (gzip if `path` ends in .gz).

    Each line: label, the dense counts, then each field's id as 8+ hex digits.
    """
    self._split_id(split)
    num_rows = check_non_negative_int("num_rows", num_rows)
    line = "\t".join(["%d"] * (1 + self.spec.num_dense) + ["%08x"] * self.spec.num_fields) + "\n"
    # gzip's default level 9 runs at ~12k rows/s on these lines; level 6 (the gzip CLI's) at ~130k.
    opened = gzip.open(path, "wt", compresslevel=6) if path.endswith(".gz") else open(path, "w")
    with opened as out:
      for rows in self._row_pieces(split, 0, num_rows):
        table = np.concatenate([rows.labels[:, None].astype(np.int64), rows.dense_counts, rows.ids], axis=1)
        out.write("".join(line % tuple(values) for values in table.tolist()))


def _check_positive_batch(batch_size) -> int:
  if check_non_negative_int("batch_size", batch_size) == 0:
    raise ValueError("batch_size must be positive, got 0")
  return int(batch_size)
