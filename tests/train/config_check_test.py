"""Config validation (sfjax/train/config_check.py): every error names the field.

The known-name lists in the messages come from the registries that build the
things named, so each case below checks the message against its registry.
"""

import math
import re

import hypothesis
import hypothesis.strategies as st
import ml_collections
import pytest

from experiments.configs import ctr
from sfjax import models
from sfjax.core.errors import ConfigError
from sfjax.data import dataset
from sfjax.embedding import cache_planner, row_dtype, row_optimizers
from sfjax.train import backends, config_check, optimizers


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
    ("data.format", "orc", dataset.KNOWN_FORMATS, {}),
    ("model.name", "nope", models.TRAIN_MODEL_NAMES, {}),
    ("embedding.backend", "ps", tuple(backends.BACKENDS), {}),
    ("embedding.optimizer", "lamb", row_optimizers.ROW_OPTIMIZER_NAMES, {}),
    ("embedding.dtype", "bf16", row_dtype.ROW_DTYPE_NAMES, {}),
    ("optimizer.name", "lamb", optimizers.DENSE_OPTIMIZER_NAMES, {}),
    ("embedding.cache_policy", "fifo", cache_planner.CACHE_POLICIES, {"embedding__backend": "cache"}),
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


def test_a_caller_that_fills_the_host_path_lets_mmap_go_without_one():
  config = _config(embedding__backend="cache", embedding__host_storage="mmap")
  config_check.validate(config, default_host_path=True)  # the pipeline's steps: their own dir
  config.embedding.host_storage = "s3"  # the rest of the block is still checked
  with pytest.raises(ConfigError, match=r"^config field embedding\.host_storage:"):
    config_check.validate(config, default_host_path=True)


def test_file_format_requires_paths():
  _fails(_config(data__format="criteo"), "data.train_path")
  _fails(_config(data__format="criteo", data__train_path="t.txt"), "data.eval_path")
  config_check.validate(_config(data__format="criteo", data__train_path="t.txt",
                                data__eval_path="e.txt"))


# ---- property: any value of a checked field passes or names that field ------------------

def _int_in(low, high=2**63 - 1):
  return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def _real(low, low_ok=True, high=None):
  def ok(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      return False
    return (v > low or (low_ok and v == low)) and (high is None or v < high)
  return ok


def _dims_ok(v):
  return isinstance(v, (tuple, list)) and all(_int_in(1, config_check._MAX_COUNT)(x) for x in v)


def _cache_rows_ok(v):  # 0: auto (5% of the table, at least the minimum for the batch)
  return (_real(0.0, low_ok=True)(v) and v <= config_check._MAX_COUNT
          and (v < 1 or float(v).is_integer()))


# field -> the values validate must accept (the spec, written independently of the checker).
# `_base` below turns on every branch: a file format (criteo) or synthetic data, the cache.
def _name_in(known):
  return lambda v: isinstance(v, str) and v in tuple(known)


_COMMON_FIELDS = {
    "seed": _int_in(0),
    # Names: no hostile value below is long enough to switch format or backend, which would
    # change the fields checked.
    "data.format": _name_in(dataset.KNOWN_FORMATS),
    "model.name": _name_in(models.TRAIN_MODEL_NAMES),
    "embedding.backend": _name_in(backends.BACKENDS),
    "embedding.optimizer": _name_in(row_optimizers.ROW_OPTIMIZER_NAMES),
    "embedding.dtype": _name_in(row_dtype.ROW_DTYPE_NAMES),
    "embedding.stochastic_rounding": lambda v: isinstance(v, bool),
    "embedding.cache_policy": _name_in(cache_planner.CACHE_POLICIES),
    "optimizer.name": _name_in(optimizers.DENSE_OPTIMIZER_NAMES),
    "data.shuffle_buffer": _int_in(0, config_check._MAX_COUNT),
    "data.skip_bad_lines": lambda v: isinstance(v, bool),
    "model.embed_dim": _int_in(1),
    "model.mlp_dims": _dims_ok,
    "model.cin_dims": _dims_ok,
    "model.cross_layers": _int_in(0, config_check._MAX_COUNT),
    "model.attention_heads": _int_in(1, config_check._MAX_COUNT),
    "embedding.lookahead": _int_in(1, 1024),
    "embedding.keep_upcoming": _int_in(-1, 1024),
    "embedding.cache_rows": _cache_rows_ok,
    "embedding.learning_rate": _real(0.0, low_ok=False),
    "embedding.l2": _real(0.0),
    "embedding.init_stddev": _real(0.0),
    "embedding.adam_b1": _real(0.0, high=1.0),
    "embedding.ftrl_initial_accumulator": _real(0.0),
    "embedding.unique_capacity": _int_in(0, config_check._MAX_COUNT),
    "optimizer.learning_rate": _real(0.0, low_ok=False),
    "optimizer.weight_decay": _real(0.0),
    "train.steps": _int_in(1),
    "train.batch_size": _int_in(1),
    "train.eval_every": _int_in(1),
    "train.log_every": _int_in(1),
    "train.prefetch": _int_in(0, 1024),
    "train.loader_nice": _int_in(0, 19),
    "train.num_devices": _int_in(0, 1 << 20),
    # Checked by sfjax.checkpoint.checkpointer.settings: any size (they are only compared with steps).
    "checkpoint.every_steps": _int_in(0, math.inf),
    "checkpoint.keep": _int_in(1, math.inf),
}
_FORMAT_FIELDS = {
    "criteo": {"data.hash_rows": _int_in(0, config_check._MAX_COUNT),
               "data.min_count": _int_in(1)},
    "synthetic": {"data.synthetic.num_train": _int_in(1),
                  "data.synthetic.cardinality_scale": _real(0.0, low_ok=False),
                  "data.synthetic.num_dense": _int_in(0)},
}
# Integer-valued floats pass synthetic's int fields (it converts them): say so, not guess.
_FLOAT_AS_INT = {"data.synthetic.num_train", "data.synthetic.num_dense"}

_HOSTILE = st.one_of(
    st.integers(-3, 70), st.integers(), st.integers(2**62, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.0, 3.0, -0.0, 1e300]),
    st.booleans(), st.none(), st.text(max_size=3), st.sampled_from(["1", "nan", "inf", b"1"]),
    st.sampled_from(["lr", "fm", "sgd", "adam", "lru", "lfu", ["criteo"], ("sgd",)]),
    st.lists(st.integers(-2, 8), max_size=3).map(tuple), st.lists(st.floats(), max_size=2))


def _base(fmt):
  c = ctr.get_config().to_dict()
  c["data"].update(format=fmt, train_path="t.tsv", eval_path="e.tsv")
  c["embedding"].update(backend="cache")
  return c


def _accepts(field, value, valid):
  if field in _FLOAT_AS_INT and isinstance(value, float) and value.is_integer():
    value = int(value)
  return valid(value)


@hypothesis.settings(max_examples=200, deadline=1000, derandomize=True)
@hypothesis.given(data=st.data(), fmt=st.sampled_from(sorted(_FORMAT_FIELDS)))
def test_any_value_passes_or_names_its_field(data, fmt):
  spec = {**_COMMON_FIELDS, **_FORMAT_FIELDS[fmt]}
  fields = data.draw(st.lists(st.sampled_from(sorted(spec)), min_size=1, max_size=3, unique=True))
  values = {f: data.draw(_HOSTILE, label=f) for f in fields}
  c = _base(fmt)
  for field, value in values.items():
    section = c
    for part in field.split(".")[:-1]:
      section = section[part]
    section[field.split(".")[-1]] = value
  bad = [f for f, v in values.items() if not _accepts(f, v, spec[f])]
  try:
    config_check.validate(ml_collections.ConfigDict(c))
  except ConfigError as e:
    hypothesis.event("rejected")
    named = re.match(r"config field ([\w.]+): ", str(e))
    assert named and named.group(1) in bad, (str(e), bad)
    return
  hypothesis.event("accepted")
  assert not bad, f"accepted {bad}"


def _loose(fmt="criteo", **fields):
  """Like `_config`, but any value type (a ConfigDict refuses a type change on assignment)."""
  c = ctr.get_config().to_dict()
  c["data"].update(format=fmt, train_path="t.tsv", eval_path="e.tsv")
  c["embedding"]["backend"] = "cache"
  for dotted, value in fields.items():
    *sections, key = dotted.split("__")
    node = c
    for section in sections:
      node = node[section]
    node[key] = value
  return ml_collections.ConfigDict(c)


@pytest.mark.parametrize("field,value,fmt", [
    ("data.hash_rows", "64", "criteo"),  # a string: was a TypeError from a comparison
    ("data.hash_rows", 10**30, "criteo"),  # past int64 once multiplied by the fields
    ("data.min_count", None, "criteo"),
    ("data.skip_bad_lines", "no", "criteo"),  # a non-empty string is truthy: would skip
    ("data.shuffle_buffer", True, "criteo"),
    ("data.synthetic.num_train", math.inf, "synthetic"),  # was an OverflowError in int(inf)
    ("data.synthetic.num_dense", 2**63, "synthetic"),  # past int64
    ("seed", -1, "criteo"),  # numpy's default_rng refuses negative seeds
    ("train.prefetch", "4", "criteo"),
    ("train.loader_nice", 20, "criteo"),  # SCHED_IDLE is train.loader_idle
    ("train.loader_idle", 1, "criteo"),
    ("train.loader_idle", "yes", "criteo"),
    ("train.host_allocator", "jemalloc", "criteo"),
    ("train.host_allocator", 1, "criteo"),
    ("train.xla_cpu_dots", "mkl", "criteo"),
    ("train.xla_cpu_dots", None, "criteo"),
    ("train.num_devices", 1.5, "criteo"),
    ("embedding.cache_rows", math.nan, "criteo"),
    ("embedding.cache_rows", 2.5, "criteo"),  # neither a row count nor a fraction
    ("embedding.lookahead", 0, "criteo"),
    ("embedding.keep_upcoming", -2, "criteo"),
    ("embedding.adam_b2", 1.0, "criteo"),
    ("model.mlp_dims", (64, 0), "criteo"),
    ("checkpoint.keep", 0, "criteo"),
])
def test_a_wrong_type_or_range_names_the_field(field, value, fmt):
  message = _fails(_loose(fmt, **{field.replace(".", "__"): value}), field)
  assert repr(value) in message


def test_the_checkpoint_block_is_optional():
  c = _loose()
  del c["checkpoint"]
  config_check.validate(c)
