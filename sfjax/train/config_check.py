"""Validation of a CTR training config: every error names the offending field."""

from __future__ import annotations

DATA_FORMATS = ("synthetic", "criteo", "avazu", "movielens")
EMBEDDING_BACKENDS = ("device", "cache")
CACHE_POLICIES = ("lru", "lfu")
HOST_STORAGES = ("ram", "mmap")
ROW_OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")


class ConfigError(ValueError):
  """A config value is invalid; the message starts with the dotted field name."""


def _require(cond: bool, field: str, msg: str) -> None:
  if not cond:
    raise ConfigError(f"config field {field}: {msg}")


def _positive_int(config, field: str) -> None:
  value = config
  for part in field.split("."):
    value = value[part]
  _require(isinstance(value, int) and value > 0, field, f"must be a positive integer, got {value!r}")


def validate(config) -> None:
  """Raises `ConfigError` naming the first invalid field of a CTR config."""
  d, e, t = config.data, config.embedding, config.train
  _require(d.format in DATA_FORMATS, "data.format",
           f"unknown format {d.format!r} (known: {', '.join(DATA_FORMATS)})")
  if d.format in ("criteo", "avazu"):
    _require(bool(d.train_path), "data.train_path", f"required for format {d.format!r}")
    _require(bool(d.eval_path), "data.eval_path", f"required for format {d.format!r}")
    _require(d.hash_rows >= 0, "data.hash_rows", f"must be >= 0, got {d.hash_rows}")
    _require(d.hash_rows > 0 or d.min_count >= 1, "data.min_count",
             f"must be >= 1 when data.hash_rows is 0, got {d.min_count}")
  _require(e.backend in EMBEDDING_BACKENDS, "embedding.backend",
           f"unknown backend {e.backend!r} (known: {', '.join(EMBEDDING_BACKENDS)})")
  if e.backend == "cache":
    _require(e.cache_policy in CACHE_POLICIES, "embedding.cache_policy",
             f"unknown policy {e.cache_policy!r} (known: {', '.join(CACHE_POLICIES)})")
    _require(e.host_storage in HOST_STORAGES, "embedding.host_storage",
             f"unknown storage {e.host_storage!r} (known: {', '.join(HOST_STORAGES)})")
    _require(isinstance(e.lookahead, int) and e.lookahead >= 1, "embedding.lookahead",
             f"must be an integer >= 1, got {e.lookahead!r}")
    _require(e.host_storage != "mmap" or bool(e.host_path), "embedding.host_path",
             "required when embedding.host_storage=mmap")
  _require(e.optimizer in ROW_OPTIMIZERS, "embedding.optimizer",
           f"unknown row optimizer {e.optimizer!r} (known: {', '.join(ROW_OPTIMIZERS)})")
  _require(e.learning_rate > 0, "embedding.learning_rate", f"must be > 0, got {e.learning_rate}")
  _require(e.unique_capacity >= 0, "embedding.unique_capacity",
           f"must be >= 0, got {e.unique_capacity}")
  _require(config.optimizer.learning_rate > 0, "optimizer.learning_rate",
           f"must be > 0, got {config.optimizer.learning_rate}")
  for field in ("train.steps", "train.batch_size", "train.eval_every", "train.eval_batch_size",
                "train.log_every", "model.embed_dim"):
    _positive_int(config, field)
  _require(t.prefetch >= 0, "train.prefetch", f"must be >= 0, got {t.prefetch}")
