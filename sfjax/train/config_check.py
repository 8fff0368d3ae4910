"""Validation of a CTR training config: every error names the offending field.

Any value of a checked field (a string for a number, NaN, a bool for an int, 10**30, a
list for a name) either passes or raises `ConfigError("config field <dotted.field>: ...")`; never another
exception (tests/train/config_check_test.py checks it property-based).

The lists of known names come from the registries that build the things named
(data formats, backends, host storages, cache policies, models, optimizers), so
a name added there is accepted here with no second edit.
"""

from __future__ import annotations

import glob
import math
import numbers
import os

from sfjax import models
from sfjax.checkpoint import checkpointer as checkpoint
from sfjax.core import host_allocator, names, xla_cpu_dots
from sfjax.core.errors import ConfigError
from sfjax.data import dataset
from sfjax.data.generated import multihot, synthetic
from sfjax.data.parquet import columns as parquet_columns
from sfjax.embedding import cache_planner, placement, row_dtype, row_optimizers
from sfjax.models import generator
from sfjax.parallel import distributed
from sfjax.train import backends, device_backend, optimizers, resume_check

__all__ = ["ConfigError", "validate"]


# Upper bound of counts (rows per field, buffer sizes, cache rows): 2**40 rows is far beyond any
# host, and keeps sums over fields and byte sizes inside int64.
_MAX_COUNT = 2**40
_INT64_MAX = 2**63 - 1


def _require(cond: bool, field: str, msg: str) -> None:
  if not cond:
    raise ConfigError(f"config field {field}: {msg}")


def _get(config, field: str):
  value = config
  for part in field.split("."):
    value = value[part]
  return value


def _is_int(value) -> bool:
  """An integer, not a bool (numpy integers count: values may come from numpy code)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
  """A finite real number, not a bool."""
  return (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and math.isfinite(value))


def _integer(config, field: str, low: int, high: int = _INT64_MAX) -> None:
  """An int (not a bool) in [low, high]."""
  value = _get(config, field)
  bound = f">= {low}" if high == _INT64_MAX else f"in [{low}, {high}]"
  what = "a positive integer" if (low, high) == (1, _INT64_MAX) else f"an integer {bound}"
  _require(_is_int(value) and low <= value <= high, field, f"must be {what}, got {value!r}")


def _positive_int(config, field: str) -> None:
  _integer(config, field, 1)


def _number(config, field: str, *, low: float, low_ok: bool, high: float | None = None) -> None:
  """A finite real number >= low (> low unless `low_ok`), and < high if given."""
  value = _get(config, field)
  ok = _is_real(value) and (value > low or (low_ok and value == low))
  ok = ok and (high is None or value < high)
  bound = f"{'>=' if low_ok else '>'} {low}" + ("" if high is None else f" and < {high}")
  _require(ok, field, f"must be a finite number {bound}, got {value!r}")


def _boolean(config, field: str) -> None:
  value = _get(config, field)
  _require(isinstance(value, bool), field, f"must be True or False, got {value!r}")


def _string(config, field: str) -> None:
  value = _get(config, field)
  _require(isinstance(value, str), field, f"must be a string, got {value!r}")


def _dims(config, field: str) -> None:
  """A tuple or list of positive integers (layer widths; may be empty)."""
  value = _get(config, field)
  _require(isinstance(value, (tuple, list)) and all(_is_int(v) and 0 < v <= _MAX_COUNT
                                                     for v in value),
           field, f"must be a tuple of positive integers, got {value!r}")


def _blocks(config) -> None:
  """`model.blocks`: a string; for `composed`, a valid block spec of row width model.embed_dim."""
  value = config.model.get("blocks", "")
  _require(isinstance(value, str), "model.blocks", f"must be JSON text (a string), got {value!r}")
  if config.model.name != generator.COMPOSED_NAME:
    return
  try:
    spec = generator.spec_from_json(value, "model.blocks")
  except generator.SpecError as e:
    raise ConfigError(f"config field {e}") from None
  width = generator.spec_embedding_width(spec)
  _require(config.model.embed_dim == width, "model.embed_dim",
           f"the composed model's blocks read rows of width {width} (max embedding dim + "
           f"first-order column); set model.embed_dim={width}, got {config.model.embed_dim!r}")


def _choice(value, field: str, known) -> None:
  _require(isinstance(value, str), field, f"must be a name (a string), got {value!r}")
  names.lookup(dict.fromkeys(known), value, field, "value")


def _cache_rows(config) -> None:
  """`embedding.cache_rows`: a row count >= 1, a fraction of the table in (0, 1), or 0 (auto)."""
  value = config.embedding.cache_rows
  ok = _is_real(value) and 0 <= value <= _MAX_COUNT and (value < 1 or float(value).is_integer())
  _require(ok, "embedding.cache_rows", f"must be a row count in [1, {_MAX_COUNT}], a fraction "
           f"of the table in (0, 1) or 0 (auto), got {value!r}")


def _validate_data(config) -> None:
  d = config.data
  _choice(d.format, "data.format", dataset.KNOWN_FORMATS)
  for field in ("data.train_path", "data.eval_path", "data.test_path"):
    _string(config, field)
  if d.format in dataset.FILE_FORMATS:
    _require(bool(d.train_path.strip()), "data.train_path", f"required for format {d.format!r}")
    _require(bool(d.eval_path.strip()), "data.eval_path", f"required for format {d.format!r}")
    _integer(config, "data.hash_rows", 0, _MAX_COUNT)
    _positive_int(config, "data.min_count")
  if d.format in dataset.DIRECTORY_FORMATS:
    _require(bool(d.train_path.strip()), "data.train_path",
             f"required for format {d.format!r}: the directory experiments.preprocess wrote")
    for field in ("data.eval_path", "data.test_path"):
      _require(not str(_get(config, field)).strip(), field,
               f"not used by format {d.format!r} (its eval/test splits are subdirectories of "
               "data.train_path); leave it empty")
  if d.format == "synthetic":
    synthetic.SyntheticConfig.from_any(d.synthetic)  # ConfigError naming data.synthetic.<field>
  if d.format == "multihot":
    multihot.MultihotConfig.from_any(d.multihot)  # ConfigError naming data.multihot.<field>
  if d.format == "parquet":
    parquet_columns.parse_columns(d.parquet)  # ConfigError naming data.parquet.<field>
  if d.format == "movielens":
    _integer(config, "data.movielens.split_seed", 0)
  _boolean(config, "data.skip_bad_lines")
  _integer(config, "data.shuffle_buffer", 0, _MAX_COUNT)
  if "shuffle" in d:  # the block shuffle (sfjax/data/block_shuffle) reads preprocessed shards
    _choice(d.shuffle, "data.shuffle", ("buffer", "block"))
    _require(d.shuffle == "buffer" or d.format in dataset.DIRECTORY_FORMATS, "data.shuffle",
             f"'block' reads whole blocks of preprocessed shards (format 'preprocessed'); "
             f"format {d.format!r} shuffles with the streaming buffer ('buffer')")
  if "shuffle_block_rows" in d:
    _integer(config, "data.shuffle_block_rows", 1, _MAX_COUNT)
  if "shuffle_threads" in d:
    _integer(config, "data.shuffle_threads", 1, 2)


def _placement(config) -> None:
  """`embedding.sharding` (device backend), `embedding.placement` and its `plan` budgets.
  A row-sharded table whose rows do not split evenly over the devices is padded (ceil(V/D)
  rows per device), so no row count is refused here."""
  e = config.embedding
  if "sharding" in e:
    _choice(e.sharding, "embedding.sharding", device_backend.TABLE_SHARDINGS)
    _require(e.sharding == "replicated" or e.backend == "device", "embedding.sharding",
             f"{e.sharding!r} splits the device backend's table; the cache backend's rows are "
             "split by embedding.cache_sharding")
  if "placement" in e:
    _choice(e.placement, "embedding.placement", placement.SETTINGS)
  if "plan" in e:
    for field in ("embedding.plan.device_bytes", "embedding.plan.host_bytes"):
      _number(config, field, low=0.0, low_ok=True, high=float(_INT64_MAX))
    for field, low_ok in (("embedding.plan.replicate_fraction", True),
                          ("embedding.plan.unique_fraction", False)):
      _number(config, field, low=0.0, low_ok=low_ok)
      _require(_get(config, field) <= 1, field, f"must be <= 1, got {_get(config, field)!r}")


def _validate_embedding(config, default_host_path: bool) -> None:
  e = config.embedding
  _choice(e.backend, "embedding.backend", tuple(backends.BACKENDS))
  _placement(config)
  if e.backend == "cache":
    _choice(e.cache_policy, "embedding.cache_policy", cache_planner.CACHE_POLICIES)
    _choice(e.host_storage, "embedding.host_storage", tuple(backends.HOST_STORAGES))
    _choice(e.cache_sharding, "embedding.cache_sharding", backends.CACHE_SHARDINGS)
    _integer(config, "embedding.lookahead", 1, 1024)
    if "keep_upcoming" in e:
      _integer(config, "embedding.keep_upcoming", -1, 1024)
    _cache_rows(config)
    _string(config, "embedding.host_path")
    _require(e.host_storage != "mmap" or bool(e.host_path) or default_host_path,
             "embedding.host_path", "required when embedding.host_storage=mmap")
  _choice(e.optimizer, "embedding.optimizer", row_optimizers.ROW_OPTIMIZER_NAMES)
  _number(config, "embedding.learning_rate", low=0.0, low_ok=False)
  for field in ("embedding.l2", "embedding.init_stddev", "embedding.adagrad_initial_accumulator",
                "embedding.adam_eps", "embedding.ftrl_l1", "embedding.ftrl_l2",
                "embedding.ftrl_beta", "embedding.ftrl_initial_accumulator"):
    _number(config, field, low=0.0, low_ok=True)
  for field in ("embedding.adam_b1", "embedding.adam_b2"):
    _number(config, field, low=0.0, low_ok=True, high=1.0)
  _integer(config, "embedding.unique_capacity", 0, _MAX_COUNT)
  if "dtype" in e:  # half-width rows (sfjax/embedding/row_dtype.py)
    _choice(e.dtype, "embedding.dtype", row_dtype.ROW_DTYPE_NAMES)
  if "stochastic_rounding" in e:
    _boolean(config, "embedding.stochastic_rounding")


def validate(config, *, default_host_path: bool = False) -> None:
  """Raises `ConfigError` naming the first invalid field of a CTR config.

  Every field of `defaults.ctr_defaults()` with a value to check is checked for its type
  too (an int is not a bool, a number is finite), so a bad value fails here, never later
  with another exception.

  Args:
    config: a CTR config (`defaults.ctr_defaults()` fields).
    default_host_path: the caller fills an empty `embedding.host_path` itself (the CTR
      pipeline's training steps: a table in the step's own directory), so mmap host
      storage does not require one.
  """
  _integer(config, "seed", 0)
  _validate_data(config)
  _choice(config.model.name, "model.name", models.TRAIN_MODEL_NAMES)
  _choice(config.model.get("din_pooling", "sum"), "model.din_pooling", models.DIN_POOLINGS)
  _positive_int(config, "model.embed_dim")
  for field in ("model.mlp_dims", "model.bottom_mlp_dims", "model.cin_dims",
                "model.din_attention_dims"):
    _dims(config, field)
  for field in ("model.cross_layers", "model.cross_rank", "model.attention_layers"):
    _integer(config, field, 0, _MAX_COUNT)
  for field in ("model.attention_heads", "model.attention_dim"):
    _integer(config, field, 1, _MAX_COUNT)
  _blocks(config)
  _validate_embedding(config, default_host_path)
  _choice(config.optimizer.name, "optimizer.name", optimizers.DENSE_OPTIMIZER_NAMES)
  _number(config, "optimizer.learning_rate", low=0.0, low_ok=False)
  _number(config, "optimizer.weight_decay", low=0.0, low_ok=True)
  for field in ("train.steps", "train.batch_size", "train.eval_every", "train.eval_batch_size",
                "train.log_every"):
    _positive_int(config, field)
  _integer(config, "train.prefetch", 0, 1024)
  if "loader_nice" in config.train:
    _integer(config, "train.loader_nice", 0, 19)
  if "loader_idle" in config.train:
    _boolean(config, "train.loader_idle")
  _integer(config, "train.num_devices", 0, 1 << 20)
  _choice(host_allocator.choice_of(config.train), "train.host_allocator", host_allocator.CHOICES)
  _choice(xla_cpu_dots.dots_choice(config.train), "train.xla_cpu_dots", xla_cpu_dots.CHOICES)
  _choice(config.get("resume", "strict"), "resume", resume_check.RESUME_POLICIES)
  checkpoint.checkpoint_settings(config)  # checkpoint.every_steps / keep, when the block exists
  if "distributed" in config:
    distributed.distributed_settings(config)  # distributed.* (HOST:PORT, P, I), when the block exists


def check_paths(config) -> None:
  """Raises `ConfigError` naming the data path field that names nothing, or a directory
  where files are expected (or a file where the preprocessed directory is).

  Separate from `validate` (which checks values, not the file system): the trainer
  calls it when it reads the data itself.
  """
  d = config.data
  if d.format in dataset.DIRECTORY_FORMATS:
    path = d.train_path.strip()
    _require(not os.path.isfile(path), "data.train_path",
             f"{path} is a file; format {d.format!r} reads the directory experiments.preprocess "
             "wrote")
    _require(os.path.isdir(path), "data.train_path", f"{path}: no such directory")
    return
  if d.format not in dataset.FILE_FORMATS:
    return
  for field in ("data.train_path", "data.eval_path", "data.test_path"):
    for pattern in (p.strip() for p in str(_get(config, field)).split(",") if p.strip()):
      matches = glob.glob(os.path.expanduser(pattern))
      _require(not (matches and all(os.path.isdir(m) for m in matches)), field,
               f"{pattern} is a directory; format {d.format!r} reads files (comma-separated "
               "files or globs, e.g. DIR/day_*.gz; a preprocessed DIR: data.format=preprocessed)")
      _require(bool(matches), field, f"{pattern} matches no file")
