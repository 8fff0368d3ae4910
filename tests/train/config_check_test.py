"""Config validation (sfjax/train/config_check.py): every error names the field.

The known-name lists in the messages come from the registries that build the
things named, so each case below checks the message against its registry.
"""

import math
import re

import pytest

from experiments.configs import ctr
from sfjax import models
from sfjax.core.errors import ConfigError
from sfjax.data import dataset
from sfjax.embedding import cache_planner
from sfjax.embedding import row_optimizers
from sfjax.train import backends
from sfjax.train import config_check
from sfjax.train import optimizers


def _config(**fields):
  """The default config with dotted `fields` ('embedding__l2' = embedding.l2) set."""
  c = ctr.get_config()
  for dotted, value in fields.items():
    section, key = dotted.split("__")
    setattr(c[section], key, value)
  return c


def _fails(c, field):
  """Validates `c`; returns the message of the ConfigError, which must name `field` first."""
  with pytest.raises(ConfigError, match=rf"^config field {re.escape(field)}:") as info:
    config_check.validate(c)
  return str(info.value)


@pytest.mark.parametrize("variant", ["", "smoke", "movielens"])
def test_the_shipped_configs_pass(variant):
  config_check.validate(ctr.get_config(variant))


@pytest.mark.parametrize("name", row_optimizers.ROW_OPTIMIZER_NAMES)
def test_every_registered_row_optimizer_is_accepted(name):
  config_check.validate(_config(embedding__optimizer=name))


def test_config_error_is_the_core_one():
  assert config_check.ConfigError is ConfigError and issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("field,value", [
    ("embedding.l2", -1e-4),
    ("embedding.init_stddev", -0.01),
    ("optimizer.learning_rate", math.inf),
    ("optimizer.learning_rate", -1.0),
    ("optimizer.learning_rate", 0.0),  # a rate must be > 0
    ("embedding.learning_rate", math.nan),
    ("optimizer.weight_decay", -1.0),
    ("optimizer.weight_decay", math.nan),
    ("train.batch_size", 0),
    ("train.batch_size", True),  # a bool is not an integer here
    ("train.steps", -5),
    ("model.embed_dim", 0),
])
def test_bad_number_names_the_field(field, value):
  message = _fails(_config(**{field.replace(".", "__"): value}), field)
  assert repr(value) in message


@pytest.mark.parametrize("field", ["embedding.l2", "embedding.init_stddev",
                                   "optimizer.weight_decay"])
def test_zero_is_allowed_where_the_bound_is_inclusive(field):
  config_check.validate(_config(**{field.replace(".", "__"): 0.0}))


@pytest.mark.parametrize("field,value,known,fields", [
    ("data.format", "parquet", dataset.KNOWN_FORMATS, {}),
    ("model.name", "nope", models.MODEL_NAMES, {}),
    ("embedding.backend", "ps", tuple(backends.BACKENDS), {}),
    ("embedding.optimizer", "lamb", row_optimizers.ROW_OPTIMIZER_NAMES, {}),
    ("optimizer.name", "lamb", optimizers.DENSE_OPTIMIZER_NAMES, {}),
    ("embedding.cache_policy", "fifo", cache_planner.POLICIES, {"embedding__backend": "cache"}),
    ("embedding.host_storage", "s3", tuple(backends.HOST_STORAGES),
     {"embedding__backend": "cache"}),
])
def test_unknown_name_lists_the_registry(field, value, known, fields):
  message = _fails(_config(**fields, **{field.replace(".", "__"): value}), field)
  assert repr(value) in message
  listed = re.search(r"\(known: (.*)\)$", message).group(1).split(", ")
  assert listed == list(known)


@pytest.mark.parametrize("field,value", [("embedding.cache_policy", "fifo"),
                                         ("embedding.host_storage", "s3")])
def test_cache_settings_are_checked_only_for_the_cache_backend(field, value):
  config_check.validate(_config(embedding__backend="device", **{field.replace(".", "__"): value}))


def test_cache_with_mmap_requires_a_host_path():
  _fails(_config(embedding__backend="cache", embedding__host_storage="mmap"),
         "embedding.host_path")
  config_check.validate(_config(embedding__backend="cache", embedding__host_storage="mmap",
                                embedding__host_path="/tmp/x"))


def test_file_format_requires_paths():
  _fails(_config(data__format="criteo"), "data.train_path")
  _fails(_config(data__format="criteo", data__train_path="t.txt"), "data.eval_path")
  config_check.validate(_config(data__format="criteo", data__train_path="t.txt",
                                data__eval_path="e.txt"))
