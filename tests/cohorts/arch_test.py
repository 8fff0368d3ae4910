"""ArchSpec / dynamic split of CTR trial configs, grouping, parameter counts."""

import jax.numpy as jnp
import pytest
from flax import nnx

from experiments.configs import ctr as ctr_config
from sfjax.automl import Config
from sfjax.cohorts import arch as arch_lib
from sfjax.core import feature_layout as fl
from sfjax.core.errors import ConfigError
from sfjax.data import types
from sfjax.models.behavior.pooling import PooledInput

CTR = ctr_config.get_config()
SPEC = types.DatasetSpec(tuple(types.FieldSpec(f"c{i}", n) for i, n in enumerate([7, 11, 5])), 2)


def test_empty_config_takes_ctr_defaults():
  arch, hparams = arch_lib.split_config({})
  assert arch == arch_lib.ArchSpec("deepfm", 16, (("mlp_dims", (400, 400, 400)),), "adagrad", "adam")
  assert hparams == {"optimizer.learning_rate": CTR.optimizer.learning_rate, "embedding.l2": CTR.embedding.l2,
                     "embedding.learning_rate": CTR.embedding.learning_rate,
                     "embedding.init_stddev": CTR.embedding.init_stddev,
                     "optimizer.weight_decay": CTR.optimizer.weight_decay}


def test_layer_keys_and_dynamic_values():
  arch, hparams = arch_lib.split_config(Config({
      "model.name": "xdeepfm", "model.embed_dim": 4, "model.mlp.depth": 2, "model.mlp.width": 16,
      "model.cin.depth": 3, "model.cin.width": 8, "embedding.optimizer": "ftrl",
      "embedding.learning_rate": 0.2, "optimizer.weight_decay": 1e-4}))
  assert arch.model_name == "xdeepfm" and arch.embed_dim == 4 and arch.embedding_optimizer == "ftrl"
  assert dict(arch.model_hparams) == {"mlp_dims": (16, 16), "cin_dims": (8, 8, 8)}
  assert hparams["embedding.learning_rate"] == 0.2 and hparams["optimizer.weight_decay"] == 1e-4
  # Only the depth given: the width is ctr.py's (mlp_dims[0]).
  arch, _ = arch_lib.split_config({"model.mlp.depth": 1})
  assert dict(arch.model_hparams) == {"mlp_dims": (CTR.model.mlp_dims[0],)}
  arch, _ = arch_lib.split_config({"model.name": "dcnv2", "model.cross_layers": 2, "model.cross_rank": 4})
  assert dict(arch.model_hparams)["cross_layers"] == 2 and dict(arch.model_hparams)["cross_rank"] == 4
  # DIN's interest pooling is part of the compiled program: a static key, the trainer's default
  # ("sum") unless the trial names it.
  din, _ = arch_lib.split_config({"model.name": "din"})
  din_mean, _ = arch_lib.split_config({"model.name": "din", "model.din_pooling": "mean"})
  assert dict(din.model_hparams)["din_pooling"] == "sum"
  assert dict(din_mean.model_hparams)["din_pooling"] == "mean" and din != din_mean


def test_keys_a_model_ignores_do_not_split_cohorts():
  a, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 8})
  b, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 8, "model.mlp.width": 64,
                                "model.cross_layers": 1, "optimizer.learning_rate": 0.1})
  assert a == b and hash(a) == hash(b) and a.model_hparams == ()
  lr4, _ = arch_lib.split_config({"model.name": "lr", "model.embed_dim": 4})
  lr16, _ = arch_lib.split_config({"model.name": "lr", "model.embed_dim": 16})
  assert lr4 == lr16 and lr4.embedding_width == 1


@pytest.mark.parametrize("config, key", [
    ({"model.mlp.widht": 16}, "model.mlp.widht"),
    ({"optim.lr": 0.1}, "optim.lr"),
    ({"model.name": "resnet"}, "model.name"),
    ({"model.embed_dim": 0}, "model.embed_dim"),
    ({"model.mlp.width": 2.5}, "model.mlp.width"),
    ({"model.mlp.depth": True}, "model.mlp.depth"),
    ({"embedding.optimizer": "rmsprop"}, "embedding.optimizer"),
    ({"optimizer.name": "lamb"}, "optimizer.name"),
    ({"embedding.learning_rate": 0.0}, "embedding.learning_rate"),
    ({"optimizer.weight_decay": -1e-3}, "optimizer.weight_decay"),
    ({"embedding.init_stddev": "big"}, "embedding.init_stddev"),
    ({"model.name": "dcnv2", "model.cross_structure": 3}, "model.cross_structure"),
    ({"model.name": "din", "model.din_pooling": 1}, "model.din_pooling"),
])
def test_errors_name_the_key(config, key):
  with pytest.raises(ValueError, match=key.replace(".", r"\.")):
    arch_lib.split_config(config)


@pytest.mark.parametrize("old,new", [
    ("optim.embedding_lr", "embedding.learning_rate"), ("optim.dense_lr", "optimizer.learning_rate"),
    ("optim.weight_decay", "optimizer.weight_decay"), ("optim.embedding_l2", "embedding.l2"),
    ("optim.init_stddev", "embedding.init_stddev"), ("optim.use_embedding_l2", "embedding.use_l2"),
])
def test_an_old_trial_key_names_its_trainer_path(old, new):
  message = rf"^config field {old} \(trial config\): renamed to {new} \(trial keys are"
  with pytest.raises(ConfigError, match=message):
    arch_lib.split_config({"model.name": "fm", old: 0.1})
  with pytest.raises(ConfigError, match=message):
    arch_lib.resolve_hparams({old: 0.1})


def test_old_optimizer_kinds_name_their_trainer_paths():
  with pytest.raises(ConfigError, match=r"optim\.embedding_optimizer \(trial config\): renamed "
                     r"to embedding\.optimizer"):
    arch_lib.split_config({"optim.embedding_optimizer": "sgd"})
  with pytest.raises(ConfigError, match=r"optim\.dense_optimizer \(search space\): renamed to "
                     r"optimizer\.name"):
    arch_lib.check_not_renamed(["model.name", "optim.dense_optimizer"], "search space")
  arch_lib.check_not_renamed(["optim.lr", "model.name", *arch_lib.DYNAMIC_KEYS], "search space")


def test_group_by_arch_is_stable():
  configs = [
      Config({"model.name": "fm", "embedding.learning_rate": 0.1}),
      {"model.name": "deepfm", "model.mlp.depth": 1, "model.mlp.width": 8},
      {"model.name": "fm", "embedding.learning_rate": 0.3},
      {"model.name": "deepfm", "model.mlp.depth": 1, "model.mlp.width": 16},
      {"model.name": "deepfm", "model.mlp.depth": 1, "model.mlp.width": 8, "optimizer.learning_rate": 1e-2},
  ]
  groups = arch_lib.group_by_arch(configs)
  assert list(groups.values()) == [[0, 2], [1, 4], [3]]
  assert [a.model_name for a in groups] == ["fm", "deepfm", "deepfm"]


def test_count_params_by_hand():
  rows = SPEC.total_rows  # 23
  lr, _ = arch_lib.split_config({"model.name": "lr"})
  assert arch_lib.count_params(lr, SPEC) == rows * 1 + 2 + 1  # table + dense weights + bias
  deepfm, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                     "model.mlp.depth": 1, "model.mlp.width": 8})
  mlp = (3 * 4 + 2) * 8 + 8 + 8 * 1 + 1
  assert arch_lib.count_params(deepfm, SPEC) == rows * 5 + 2 + mlp


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_a_layout_trial_is_the_trainers_pooled_model():
  """With a feature layout (issue #22) the trial's model pools bags into F fields, as the
  trainer's `build_model_from_config` does, and its table holds every table's rows."""
  layout = fl.FeatureLayout(
      (fl.TableSpec("user", 7), fl.TableSpec("item", 11), fl.TableSpec("tag", 5)),
      (fl.FeatureSpec("user", "user"), fl.FeatureSpec("item", "item"),
       fl.FeatureSpec("tags", "tag", "multi_hot", 3, "mean"),
       fl.FeatureSpec("history", "item", "sequence", 4)))
  spec = types.DatasetSpec(tuple(types.FieldSpec(f.name, r) for f, r in
                                 zip(layout.features, (7, 11, 5, 11), strict=True)), 2, layout)
  deepfm, _ = arch_lib.split_config({"model.name": "deepfm", "model.embed_dim": 4,
                                     "model.mlp.depth": 1, "model.mlp.width": 8})
  model = deepfm.build_model(spec, nnx.Rngs(0))
  assert isinstance(model, PooledInput) and model.layout == layout
  mlp = (4 * 4 + 2) * 8 + 8 + 8 * 1 + 1  # F = 4 pooled fields, not S = 9 columns
  assert arch_lib.count_params(deepfm, spec) == 23 * 5 + 2 + mlp  # 7 + 11 + 5 rows, shared item
  logits = model(jnp.ones((2, 9, 5)), jnp.zeros((2, 2)), jnp.ones((2, 9)))
  assert logits.shape == (2,)


def test_a_bag_pooling_is_a_dynamic_code():
  """Issue #22: `features.<bag>.pooling` does not split cohorts; it travels as a code."""
  a, ha = arch_lib.split_config({"model.name": "fm", "features.tags.pooling": "sqrtn"})
  b, hb = arch_lib.split_config({"model.name": "fm", "features.tags.pooling": "sum"})
  assert a == b and ha["features.tags.pooling"] == 2.0 and hb["features.tags.pooling"] == 0.0
  assert "features.tags.pooling" not in arch_lib.split_config({"model.name": "fm"})[1]
  with pytest.raises(ValueError, match="'features.tags.pooling': must be one of sum, mean, sqrtn"):
    arch_lib.split_config({"features.tags.pooling": "max"})
  with pytest.raises(ValueError, match="'features.tags.weight': unknown key"):
    arch_lib.split_config({"features.tags.weight": 1.0})
