"""The library's default CTR config: fresh, valid, and every choice a registered name."""

from flax import nnx

from sfjax import models
from sfjax.data import dataset
from sfjax.embedding import cache_planner, row_optimizers
from sfjax.train import backends, config_check, defaults, optimizers


def test_each_call_returns_a_fresh_config():
  a, b = defaults.ctr_defaults(), defaults.ctr_defaults()
  assert a is not b and a.to_dict() == b.to_dict()
  a.train.steps = 1
  a.model.mlp_dims = (8,)
  a.data.synthetic.num_train = 10
  assert b.train.steps == 2000 and tuple(b.model.mlp_dims) == (400, 400, 400)
  assert defaults.ctr_defaults().data.synthetic.num_train == 2_000_000


def test_defaults_pass_validation():
  config_check.validate(defaults.ctr_defaults())


def test_cache_backend_defaults_pass_validation():
  c = defaults.ctr_defaults()
  c.embedding.backend = "cache"
  config_check.validate(c)


def test_every_choice_default_is_a_registered_name():
  c = defaults.ctr_defaults()
  assert c.model.name in models.MODEL_NAMES
  assert c.embedding.optimizer in row_optimizers.ROW_OPTIMIZER_NAMES
  assert c.optimizer.name in optimizers.DENSE_OPTIMIZER_NAMES
  assert c.data.format in dataset.KNOWN_FORMATS
  assert c.embedding.backend in backends.BACKENDS
  assert c.embedding.host_storage in backends.HOST_STORAGES
  assert c.embedding.cache_policy in cache_planner.CACHE_POLICIES


def test_every_row_optimizer_finds_its_settings_in_the_defaults():
  e = defaults.ctr_defaults().embedding
  for name in row_optimizers.ROW_OPTIMIZER_NAMES:
    opt = row_optimizers.make(name, e.learning_rate, e)
    assert opt.name == name and opt.initial_slot_row(17).shape == (opt.slot_width(17),)


def test_the_default_deepfm_step_reads_the_unique_rows_itself():
  # issue #27: the default step gathers DeepFM's vectors and first-order weights as two
  # blocks (`model.split_input`); the concatenated layout is `split_input=False`.
  c = defaults.ctr_defaults()
  model = models.build_model_from_config(c.model, num_fields=3, num_dense=2, rngs=nnx.Rngs(0))
  assert c.model.name == "deepfm" and model.reads_unique_rows
  c.model.split_input = False
  model = models.build_model_from_config(c.model, num_fields=3, num_dense=2, rngs=nnx.Rngs(0))
  assert not model.reads_unique_rows
