"""Validation of a CTR training config: every error names the offending field.

The lists of known names come from the registries that build the things named
(data formats, backends, host storages, cache policies, models, optimizers), so
a name added there is accepted here with no second edit.
"""

from __future__ import annotations

import math

from sfjax import models
from sfjax.core import names
from sfjax.core.errors import ConfigError
from sfjax.data import dataset
from sfjax.embedding import cache_planner
from sfjax.embedding import row_optimizers
from sfjax.train import backends
from sfjax.train import optimizers

__all__ = ["ConfigError", "validate"]


def _require(cond: bool, field: str, msg: str) -> None:
  if not cond:
    raise ConfigError(f"config field {field}: {msg}")


def _get(config, field: str):
  value = config
  for part in field.split("."):
    value = value[part]
  return value


def _positive_int(config, field: str) -> None:
  value = _get(config, field)
  _require(isinstance(value, int) and not isinstance(value, bool) and value > 0, field,
           f"must be a positive integer, got {value!r}")


def _number(config, field: str, *, low: float, low_ok: bool) -> None:
  """A finite real number >= low (> low unless `low_ok`)."""
  value = _get(config, field)
  ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        and (value > low or (low_ok and value == low)))
  _require(ok, field, f"must be a finite number {'>=' if low_ok else '>'} {low}, got {value!r}")


def _choice(value, field: str, known) -> None:
  names.lookup(dict.fromkeys(known), value, field, "value")


def validate(config) -> None:
  """Raises `ConfigError` naming the first invalid field of a CTR config."""
  d, e, t = config.data, config.embedding, config.train
  _choice(d.format, "data.format", dataset.KNOWN_FORMATS)
  if d.format in dataset.FILE_FORMATS:
    _require(bool(d.train_path), "data.train_path", f"required for format {d.format!r}")
    _require(bool(d.eval_path), "data.eval_path", f"required for format {d.format!r}")
    _require(d.hash_rows >= 0, "data.hash_rows", f"must be >= 0, got {d.hash_rows}")
    _require(d.hash_rows > 0 or d.min_count >= 1, "data.min_count",
             f"must be >= 1 when data.hash_rows is 0, got {d.min_count}")
  if d.format in dataset.DIRECTORY_FORMATS:
    _require(bool(str(d.train_path).strip()), "data.train_path",
             f"required for format {d.format!r}: the directory experiments.preprocess wrote")
    for field in ("data.eval_path", "data.test_path"):
      _require(not str(_get(config, field)).strip(), field,
               f"not used by format {d.format!r} (its eval/test splits are subdirectories of "
               "data.train_path); leave it empty")
  _require(isinstance(d.shuffle_buffer, int) and d.shuffle_buffer >= 0, "data.shuffle_buffer",
           f"must be an integer >= 0, got {d.shuffle_buffer!r}")
  _choice(config.model.name, "model.name", models.MODEL_NAMES)
  _choice(e.backend, "embedding.backend", tuple(backends.BACKENDS))
  if e.backend == "cache":
    _choice(e.cache_policy, "embedding.cache_policy", cache_planner.POLICIES)
    _choice(e.host_storage, "embedding.host_storage", tuple(backends.HOST_STORAGES))
    _require(isinstance(e.lookahead, int) and e.lookahead >= 1, "embedding.lookahead",
             f"must be an integer >= 1, got {e.lookahead!r}")
    _require(e.host_storage != "mmap" or bool(e.host_path), "embedding.host_path",
             "required when embedding.host_storage=mmap")
  _choice(e.optimizer, "embedding.optimizer", row_optimizers.ROW_OPTIMIZER_NAMES)
  _choice(config.optimizer.name, "optimizer.name", optimizers.DENSE_OPTIMIZER_NAMES)
  for field in ("embedding.learning_rate", "optimizer.learning_rate"):
    _number(config, field, low=0.0, low_ok=False)
  for field in ("embedding.l2", "embedding.init_stddev", "optimizer.weight_decay"):
    _number(config, field, low=0.0, low_ok=True)
  _require(e.unique_capacity >= 0, "embedding.unique_capacity",
           f"must be >= 0, got {e.unique_capacity}")
  for field in ("train.steps", "train.batch_size", "train.eval_every", "train.eval_batch_size",
                "train.log_every", "model.embed_dim"):
    _positive_int(config, field)
  _require(t.prefetch >= 0, "train.prefetch", f"must be >= 0, got {t.prefetch}")
