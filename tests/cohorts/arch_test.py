"""ArchSpec / dynamic split of CTR trial configs, grouping, parameter counts."""

import pytest

from experiments.configs import ctr as ctr_config
from sfjax.automl import Config
from sfjax.cohorts import arch as arch_lib
from sfjax.data import types

CTR = ctr_config.get_config()
SPEC = types.DatasetSpec(tuple(types.FieldSpec(f"c{i}", n) for i, n in enumerate([7, 11, 5])), 2)


def test_empty_config_takes_ctr_defaults():
  arch, hparams = arch_lib.split_config({})
  assert arch == arch_lib.ArchSpec("deepfm", 16, (("mlp_dims", (400, 400, 400)),), "adagrad", "adam")
  assert hparams == {"optim.dense_lr": CTR.optimizer.learning_rate, "optim.embedding_l2": CTR.embedding.l2,
                     "optim.embedding_lr": CTR.embedding.learning_rate,
                     "optim.init_stddev": CTR.embedding.init_stddev,
                     "optim.weight_decay": CTR.optimizer.weight_decay}


def test_layer_keys_and_dynamic_values():
  arch, hparams = arch_lib.split_config(Config({
      "model.name": "xdeepfm", "model.embed_dim": 4, "model.mlp.depth": 2, "model.mlp.width": 16,
      "model.cin.depth": 3, "model.cin.width": 8, "optim.embedding_optimizer": "ftrl",
      "optim.embedding_lr": 0.2, "optim.weight_decay": 1e-4}))
  assert arch.model_name == "xdeepfm" and arch.embed_dim == 4 and arch.embedding_optimizer == "ftrl"
  assert dict(arch.model_hparams) == {"mlp_dims": (16, 16), "cin_dims": (8, 8, 8)}
  assert hparams["optim.embedding_lr"] == 0.2 and hparams["optim.weight_decay"] == 1e-4
  # Only the depth given: the width is ctr.py's (mlp_dims[0]).
  arch, _ = arch_lib.split_config({"model.mlp.depth": 1})
  assert dict(arch.model_hparams) == {"mlp_dims": (CTR.model.mlp_dims[0],)}
  arch, _ = arch_lib.split_config({"model.name": "dcnv2", "model.cross_layers": 2, "model.cross_rank": 4})
  assert dict(arch.model_hparams)["cross_layers"] == 2 and dict(arch.model_hparams)["cross_rank"] == 4


def test_keys_a_model_ignores_do_not_split_cohorts():
  a, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 8})
  b, _ = arch_lib.split_config({"model.name": "fm", "model.embed_dim": 8, "model.mlp.width": 64,
                                "model.cross_layers": 1, "optim.dense_lr": 0.1})
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
    ({"optim.embedding_optimizer": "rmsprop"}, "optim.embedding_optimizer"),
    ({"optim.dense_optimizer": "lamb"}, "optim.dense_optimizer"),
    ({"optim.embedding_lr": 0.0}, "optim.embedding_lr"),
    ({"optim.weight_decay": -1e-3}, "optim.weight_decay"),
    ({"optim.init_stddev": "big"}, "optim.init_stddev"),
    ({"model.name": "dcnv2", "model.cross_structure": 3}, "model.cross_structure"),
])
def test_errors_name_the_key(config, key):
  with pytest.raises(ValueError, match=key.replace(".", r"\.")):
    arch_lib.split_config(config)


def test_group_by_arch_is_stable():
  configs = [
      Config({"model.name": "fm", "optim.embedding_lr": 0.1}),
      {"model.name": "deepfm", "model.mlp.depth": 1, "model.mlp.width": 8},
      {"model.name": "fm", "optim.embedding_lr": 0.3},
      {"model.name": "deepfm", "model.mlp.depth": 1, "model.mlp.width": 16},
      {"model.name": "deepfm", "model.mlp.depth": 1, "model.mlp.width": 8, "optim.dense_lr": 1e-2},
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
