"""Tests for the concrete CTR search space (search_spaces/ctr.py)."""

import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from search_spaces import ctr
from sfjax.automl.space import ConfigError, Fixed, SpaceError
from sfjax.cohorts import arch

MLP_KEYS = {"model.mlp.depth", "model.mlp.width"}
INTERACTION_KEYS = {
    "dcnv2": {"model.cross_layers", "model.cross_rank"},
    "autoint": {"model.attention_layers", "model.attention_heads", "model.attention_dim"},
    "xdeepfm": {"model.cin.depth", "model.cin.width"},
}
ALL_INTERACTION_KEYS = set().union(*INTERACTION_KEYS.values())


def _samples(space, n=300, seed=0):
  rng = np.random.default_rng(seed)
  return [space.sample(rng) for _ in range(n)]


def test_sub_spaces_compose_under_their_prefixes():
  space = ctr.ctr_space()
  assert set(space.keys) == ({"model.name", "model.embed_dim", "embedding.optimizer",
                              "embedding.learning_rate", "embedding.use_l2",
                              "embedding.l2", "embedding.init_stddev", "optimizer.learning_rate",
                              "optimizer.use_weight_decay", "optimizer.weight_decay"}
                             | MLP_KEYS | ALL_INTERACTION_KEYS)
  for key in ("embedding.learning_rate", "embedding.l2", "embedding.init_stddev",
              "optimizer.learning_rate", "optimizer.weight_decay"):
    assert space[key].log, key
  assert max(space["model.mlp.width"].choices) <= 400
  assert space["model.mlp.depth"].high <= 3
  assert space["model.embed_dim"].choices == (4, 8, 16)


def test_mlp_keys_active_only_for_models_with_an_mlp():
  space = ctr.ctr_space()
  seen = set()
  for config in _samples(space):
    name = config["model.name"]
    seen.add(name)
    has_mlp = MLP_KEYS <= set(config)
    assert has_mlp == (name in ctr.MLP_FAMILIES), config
    assert ("model.embed_dim" in config) == (name != "lr"), config
  assert seen == set(ctr.FAMILIES)


def test_interaction_keys_only_for_their_family():
  for config in _samples(ctr.ctr_space(), seed=1):
    name = config["model.name"]
    present = set(config) & ALL_INTERACTION_KEYS
    assert present == INTERACTION_KEYS.get(name, set()), config


def test_inactive_keys_are_rejected_naming_them():
  space = ctr.ctr_space()
  fm = dict(ctr.default_config(space))
  fm["model.name"] = "fm"
  with pytest.raises(ConfigError, match="model.mlp.depth"):
    space.validate(fm)
  deepfm = dict(ctr.default_config(space), **{"model.cross_layers": 2})
  with pytest.raises(ConfigError, match="model.cross_layers"):
    space.validate(deepfm)


def test_regularizer_gates():
  space = ctr.ctr_space()
  configs = _samples(space, seed=2)
  for config in configs:
    assert ("optimizer.weight_decay" in config) == config["optimizer.use_weight_decay"]
    assert ("embedding.l2" in config) == config["embedding.use_l2"]
    runner = ctr.runner_config(config)
    assert not set(ctr.GATES) & set(runner)
    if not config["optimizer.use_weight_decay"]:
      assert runner["optimizer.weight_decay"] == 0.0
    else:
      assert runner["optimizer.weight_decay"] == config["optimizer.weight_decay"] > 0
  assert {c["optimizer.use_weight_decay"] for c in configs} == {False, True}


def test_default_config_matches_ctr_py_and_validates():
  space = ctr.ctr_space()
  default = ctr.default_config(space)
  assert space.validate(default) == default
  c = ctr_config.get_config()
  runner = ctr.runner_config(default)
  assert runner["model.name"] == c.model.name == "deepfm"
  assert runner["model.embed_dim"] == c.model.embed_dim
  assert (runner["model.mlp.width"],) * runner["model.mlp.depth"] == tuple(c.model.mlp_dims)
  assert runner["embedding.optimizer"] == c.embedding.optimizer
  assert runner["embedding.learning_rate"] == c.embedding.learning_rate
  assert runner["optimizer.learning_rate"] == c.optimizer.learning_rate
  assert runner["embedding.init_stddev"] == c.embedding.init_stddev
  assert runner["optimizer.weight_decay"] == c.optimizer.weight_decay
  assert runner["embedding.l2"] == c.embedding.l2


def test_default_config_outside_a_restricted_space_names_the_key():
  with pytest.raises(ConfigError, match="model.name"):
    ctr.default_config(ctr.ctr_space(families=("lr", "fm")))


def test_family_subsets_drop_unused_sub_spaces():
  space = ctr.ctr_space(families="lr,fm")
  assert not (MLP_KEYS | ALL_INTERACTION_KEYS) & set(space.keys)
  space = ctr.ctr_space(families=("fm", "dcnv2"))
  assert INTERACTION_KEYS["dcnv2"] | MLP_KEYS <= set(space.keys)
  assert not (INTERACTION_KEYS["autoint"] | INTERACTION_KEYS["xdeepfm"]) & set(space.keys)
  for bad in (("fm", "fm"), ("transformer",), ()):
    with pytest.raises(SpaceError, match="families"):
      ctr.ctr_space(families=bad)


def test_grid_and_round_trip():
  space = ctr.ctr_space(families=("lr", "fm"))
  grid = space.grid(num_points_per_float=1)
  assert len(grid) == len(set(grid)) > 0
  for config in grid[:50] + _samples(ctr.ctr_space(), 50, seed=3):
    space_of = space if config["model.name"] in ("lr", "fm") else ctr.ctr_space()
    assert space_of.decode(space_of.encode(config)) == config


def test_hparam_space_is_exactly_the_runners_dynamic_keys():
  keys = set(ctr.hparam_space().keys) - set(ctr.GATES)
  assert keys == set(arch.DYNAMIC_KEYS)
  for config in _samples(ctr.ctr_space(), 100, seed=4):
    static, dynamic = arch.split_config(ctr.runner_config(config))
    assert static == arch.split_config(ctr.runner_config(ctr.arch_part(config)))[0]
    assert dynamic == arch.resolve_hparams(
        ctr.runner_config({k: v for k, v in config.items() if k not in ctr.arch_part(config)}))


def test_fixed_arch_space_varies_only_hyperparameters():
  baseline = ctr.default_config()
  space = ctr.fixed_arch_space(ctr.arch_part(baseline))
  assert all(isinstance(space[k], Fixed) for k in ctr.arch_part(baseline))
  assert space.validate(baseline) == baseline
  archs = {arch.split_config(ctr.runner_config(c))[0] for c in _samples(space, 50, seed=5)}
  assert len(archs) == 1
  with pytest.raises(SpaceError, match="optimizer.learning_rate"):
    ctr.fixed_arch_space({"model.name": "fm", "optimizer.learning_rate": 0.1})
  with pytest.raises(ConfigError, match=r"optim\.embedding_optimizer \(fixed architecture\): "
                     r"renamed to embedding\.optimizer"):
    ctr.fixed_arch_space({"model.name": "fm", "optim.embedding_optimizer": "sgd"})


def test_bag_poolings_are_searched_with_the_baseline_first():
  """Issue #22: `space.poolings` adds `features.<bag>.pooling`; the baseline keeps the data
  set's pooling; trials differing only there share an architecture (one cohort)."""
  space_cfg = ml_collections.ConfigDict(dict(families="fm,deepfm", mlp_widths="16,400",
                                             poolings="bag1:mean, long0:sqrtn"))
  space = ctr.space_from_config(space_cfg)
  assert space["features.bag1.pooling"].choices == ("mean", "sum", "sqrtn")
  assert space["features.long0.pooling"].choices == ("sqrtn", "sum", "mean")
  base = ctr.default_config(space)
  assert base["features.bag1.pooling"] == "mean" and base["features.long0.pooling"] == "sqrtn"
  other = dict(base, **{"features.bag1.pooling": "sum"})
  a, ha = arch.split_config(ctr.runner_config(base))
  b, hb = arch.split_config(ctr.runner_config(other))
  assert a == b and ha["features.bag1.pooling"] == 1.0 and hb["features.bag1.pooling"] == 0.0
  assert "features.bag1.pooling" not in ctr.space_from_config(
      ml_collections.ConfigDict(dict(families="fm", mlp_widths="16"))).keys
  for text, match in (("bag1", "space.poolings: entry 'bag1'"), ("bag1:max", "bag1: pooling")):
    with pytest.raises(SpaceError, match=match):
      ctr.space_from_config(ml_collections.ConfigDict(dict(families="fm", mlp_widths="16",
                                                           poolings=text)))


def test_table_dims_are_searched_with_the_full_width_baseline_first():
  """Issue #22: `space.table_dims` adds `tables.<table>.dim` in {0 (the model's), dims...};
  `model.embed_dim` keeps the choices at least as wide as every dim; the baseline reads
  every column; trials differing only in dims share an architecture (one cohort)."""
  space_cfg = ml_collections.ConfigDict(dict(families="fm,deepfm", mlp_widths="16,400",
                                             table_dims="item:8|4, user:2"))
  space = ctr.space_from_config(space_cfg)
  assert space["tables.item.dim"].choices == (0, 4, 8)
  assert space["tables.user.dim"].choices == (0, 2)
  assert space["model.embed_dim"].choices == (8, 16)  # 4 is narrower than item's 8
  base = ctr.default_config(space)
  assert base["tables.item.dim"] == 0 and base["tables.user.dim"] == 0
  assert base["model.embed_dim"] == 16  # the trainer's own
  other = dict(base, **{"tables.item.dim": 4})
  a, ha = arch.split_config(ctr.runner_config(base))
  b, hb = arch.split_config(ctr.runner_config(other))
  assert a == b and ha["tables.item.dim"] == 0.0 and hb["tables.item.dim"] == 4.0
  for point in _samples(space, 30, seed=2):  # every point is a trial config the runner takes
    arch.split_config(ctr.runner_config(point))
  assert ctr.table_dims_from_config(ml_collections.ConfigDict(dict(table_dims=""))) == {}
  assert ctr.table_dims_from_config(space_cfg) == {"item": (8, 4), "user": (2,)}
  for text, match in (("item", "space.table_dims: entry 'item' is not 'table:d|d|...'"),
                      ("item:0|4", "item: '0|4' is not dims"), ("item:a", "item: 'a' is not"),
                      ("item:4,item:8", "space.table_dims: table 'item' is named twice"),
                      ("item:32", "a dim of 32 is above every model.embed_dim choice")):
    with pytest.raises(SpaceError, match=match):
      ctr.space_from_config(ml_collections.ConfigDict(dict(families="fm", mlp_widths="16",
                                                           table_dims=text)))
  with pytest.raises(SpaceError, match="space.table_dims: item: expected dims >= 1"):
    ctr.table_dim_space({"item": ()})


def test_din_is_searched_only_when_named_with_its_attention_keys():
  assert "din" not in ctr.ctr_space()["model.name"].choices  # the default needs no sequence
  space = ctr.ctr_space(families="deepfm,din")
  din_keys = {"model.din_attention.depth", "model.din_attention.width", "model.din_pooling"}
  seen, poolings = set(), set()
  for config in _samples(space, n=100, seed=3):
    seen.add(config["model.name"])
    assert (din_keys <= set(config)) == (config["model.name"] == "din"), config
    assert MLP_KEYS <= set(config)  # both families have an MLP
    spec, _ = arch.split_config(ctr.runner_config(config))
    if config["model.name"] == "din":
      width, depth = config["model.din_attention.width"], config["model.din_attention.depth"]
      assert dict(spec.model_hparams)["din_attention_dims"] == (width,) * depth
      assert dict(spec.model_hparams)["din_pooling"] == config["model.din_pooling"]
      poolings.add(config["model.din_pooling"])
  assert seen == {"deepfm", "din"} and poolings == {"sum", "mean", "softmax"}
  with pytest.raises(SpaceError, match="unknown: \\['dien'\\]"):
    ctr.ctr_space(families="deepfm,dien")
