"""Search settings: parsing, the algorithm blocks, study checks, the workdir guard, the space."""

import json
import os

import ml_collections
import pytest

from experiments.configs import search_ctr
from search_spaces.ctr import SEARCH_SPACE
from sfjax.automl.algorithms import ALGORITHMS, Objective, Objectives
from sfjax.automl.pipeline import PipelineConfigError
from sfjax.automl.space import (
  Categorical,
  Fixed,
  Float,
  ForbiddenConfigError,
  Space,
  SpaceConfigError,
)
from sfjax.cohorts import arch as arch_lib
from sfjax.core.errors import ConfigError
from sfjax.ctr_search import search_config, search_defaults
from sfjax.ctr_search.search_config import SearchConfigError


def _config(algorithm="asha", settings=None, **study):
  """The default search config with `study.algorithm`, its block's `settings` and `study`."""
  c = search_ctr.get_config()
  c.seed = 7
  # A new study block: a bad value may have another type than the field's default.
  data = c.study.to_dict()
  data.update(algorithm=algorithm, **study)
  if settings:
    data[algorithm] = {**data[algorithm], **settings}
  c.study = ml_collections.ConfigDict(data)
  return c


@pytest.mark.parametrize("value,want", [("auto", "auto"), (" auto ", "auto"), ("4", 4),
                                        (" 2", 2), (3, 3), ("1", 1)])
def test_parse_cohort_width(value, want):
  assert search_config.parse_cohort_width(value) == want


@pytest.mark.parametrize("bad", ["x", "0", "-2", "2.5", "", 0, True, None, "AUTO"])
def test_bad_cohort_width_names_the_field(bad):
  with pytest.raises(SearchConfigError, match="study.cohort_width: expected 'auto' or a positive"):
    search_config.parse_cohort_width(bad)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_make_algorithm_builds_every_registered_name(name):
  config = _config(name)
  algorithm = search_config.make_algorithm(config)
  assert type(algorithm) is ALGORITHMS[name] and algorithm.name == name
  assert algorithm.seed == 7  # config.seed, not the algorithm's default
  for field, value in config.study[name].items():
    assert getattr(algorithm, field) == value, field
  for field in ("min_budget", "max_budget"):  # shared budgets, not in the block
    if field in config.study[name] or hasattr(algorithm, field):
      assert field not in config.study[name] and getattr(algorithm, field) == config.study[field]


@pytest.mark.parametrize("name,field,value", [
    ("asha", "eta", 4), ("hyperband", "eta", 2), ("hyperband", "num_iterations", 2),
    ("evolution", "population_size", 5), ("evolution", "sample_size", 2),
    ("pbt", "population_size", 6), ("pbt", "pbt_interval", 3.0),
    ("grid", "num_points_per_float", 3), ("grid", "shuffle", False),
    ("tpe", "n_startup_trials", 2), ("nsga2", "population_size", 4)])
def test_block_settings_reach_only_their_algorithm(name, field, value):
  algorithm = search_config.make_algorithm(_config(name, {field: value}))
  assert getattr(algorithm, field) == value
  study = search_defaults().study
  for other in ALGORITHMS:  # population_size is three settings now: one per algorithm
    if other != name and field in study[other]:
      changed = {**study[name].to_dict(), field: value}
      built = search_config.make_algorithm(_config(other, **{name: changed}))
      assert getattr(built, field) == study[other][field], other


def test_shared_budgets_reach_a_multi_fidelity_algorithm():
  algorithm = search_config.make_algorithm(_config("successive_halving", min_budget=3.0))
  assert (algorithm.min_budget, algorithm.max_budget) == (3.0, 9.0)


def test_unknown_algorithm_names_the_field():
  with pytest.raises(SearchConfigError, match=r"study\.algorithm: unknown algorithm 'bayes' "
                                              r"\(known: random, "):
    search_config.make_algorithm(_config("bayes"))


def test_bad_algorithm_setting_names_the_algorithm():
  with pytest.raises(SearchConfigError, match=r"study\.pbt: .*population_size"):
    search_config.make_algorithm(_config("pbt", {"population_size": 1}))


def test_a_misspelt_block_setting_names_the_closest():
  with pytest.raises(SearchConfigError, match=r"^study\.asha\.etta: unknown asha setting; did you "
                                              r"mean study\.asha\.eta\? \(known: eta\)$"):
    search_config.make_algorithm(_config("asha", {"etta": 2}))
  with pytest.raises(SearchConfigError, match=r"study\.tpe\.n_startup: .*n_startup_trials"):
    search_config.check_study_settings(_config("asha", **{"tpe": {"n_startup": 2}}))  # any block


@pytest.mark.parametrize("algorithm,key,new", [
    ("asha", "eta", "study.asha.eta"), ("hyperband", "eta", "study.hyperband.eta"),
    ("pbt", "population_size", "study.pbt.population_size"),
    ("random", "population_size", "study.evolution.population_size"),
    ("asha", "pbt_interval", "study.pbt.pbt_interval")])
def test_a_flat_algorithm_setting_names_its_new_path(algorithm, key, new):
  with pytest.raises(SearchConfigError, match=rf"^study\.{key}: .* use {new} \({key} is a setting"):
    search_config.check_study_settings(_config(algorithm, **{key: 2}))


def test_an_unknown_study_key_names_the_closest():
  with pytest.raises(SearchConfigError, match=r"^study\.num_trial: unknown study setting; did you "
                                              r"mean study\.num_trials\?"):
    search_config.check_study_settings(_config(num_trial=3))
  with pytest.raises(SearchConfigError, match=r"study\.asha: expected the block of asha's"):
    search_config.check_study_settings(_config(asha=3))


@pytest.mark.parametrize("argv,message", [
    (["--config.study.eta=2"], "--config.study.eta: .* use --config.study.asha.eta "),
    (["--config.study.algorithm=hyperband", "--config.study.eta", "2"],
     "use --config.study.hyperband.eta "),
    (["--config.steps.hpo.study.algorithm=tpe", "--config.steps.hpo.study.n_startup_trials=2"],
     "--config.steps.hpo.study.n_startup_trials: .* use --config.steps.hpo.study.tpe."),
    (["--noconfig.study.shuffle"], "use --config.study.grid.shuffle")])
def test_flat_overrides_on_the_command_line_name_the_new_path(argv, message):
  with pytest.raises(SearchConfigError, match=message.replace("(", r"\(")) as info:
    search_config.check_flag_overrides(["prog", "--config=x.py", *argv])
  assert "\n" not in str(info.value)  # one line


def test_new_overrides_on_the_command_line_pass():
  search_config.check_flag_overrides(["prog", "--config=x.py", "--config.study.asha.eta=2",
                                      "--config.study.num_trials=4", "--config.steps.x.study.tpe"
                                      ".n_startup_trials=2", "--workdir=/tmp/eta", "--eta=2"])


def test_one_config_error_base():
  for cls in (SearchConfigError, PipelineConfigError, SpaceConfigError, ForbiddenConfigError):
    assert issubclass(cls, ConfigError), cls
  names = [c.__name__ for c in (ConfigError, SearchConfigError, PipelineConfigError,
                                SpaceConfigError, ForbiddenConfigError)]
  assert len(set(names)) == len(names)  # no two classes share a name


def test_default_study_settings_pass():
  for name in ALGORITHMS:
    search_config.check_study_settings(_config(name))


@pytest.mark.parametrize("field,value", [
    ("num_trials", 0), ("num_trials", 2.5), ("num_trials", True), ("leaderboard_size", -1),
    ("ask_batch", -1), ("max_params", "10")])
def test_bad_study_count_names_the_field(field, value):
  with pytest.raises(SearchConfigError, match=rf"study\.{field}: expected an integer >="):
    search_config.check_study_settings(_config(**{field: value}))


@pytest.mark.parametrize("low,high", [(0.0, 9.0), (-1.0, 9.0), (10.0, 9.0)])
def test_bad_budgets_are_named(low, high):
  with pytest.raises(SearchConfigError, match="study.min_budget / study.max_budget"):
    search_config.check_study_settings(_config(min_budget=low, max_budget=high))


def test_pbt_interval_must_divide_max_budget():
  search_config.check_study_settings(_config("pbt", {"pbt_interval": 3.0}))  # 9 / 3: 3 rounds
  for interval in (2.0, 10.0):
    with pytest.raises(SearchConfigError, match=r"study\.pbt\.pbt_interval"):
      search_config.check_study_settings(_config("pbt", {"pbt_interval": interval}))
  search_config.check_study_settings(_config("asha", pbt={"pbt_interval": 2.0}))  # PBT only


def test_check_settings_writes_then_refuses_a_changed_task(tmp_path):
  record = search_config.search_settings_record(_config())
  search_config.check_search_settings(str(tmp_path), record)
  path = tmp_path / search_config.SETTINGS_FILE
  assert json.loads(path.read_text()) == record and os.listdir(tmp_path) == ["search.json"]
  search_config.check_search_settings(str(tmp_path), record)  # the same settings: fine
  grown = _config(num_trials=1000, cohort_width="2", leaderboard_size=0)  # may change
  search_config.check_search_settings(str(tmp_path), search_config.search_settings_record(grown))
  changed = _config()
  changed.task.batch_size, changed.task.data.synthetic.num_train = 128, 1000
  changed.seed = 8
  with pytest.raises(SearchConfigError) as e:
    search_config.check_search_settings(str(tmp_path), search_config.search_settings_record(changed))
  message = str(e.value)
  assert str(path) in message
  for diff in ("task.batch_size: stored 256, given 128", "seed: stored 7, given 8",
               "task.data.synthetic.num_train: stored 200000, given 1000"):
    assert diff in message
  assert "eval_rows" not in message  # only the differing fields
  assert json.loads(path.read_text()) == record  # the stored settings are kept


def test_xla_cpu_dots_reaches_the_task_and_stays_out_of_the_record(tmp_path):
  c = _config()
  assert search_config.make_task(c).xla_cpu_dots == "auto"
  record = search_config.search_settings_record(c)
  assert "xla_cpu_dots" not in record["task"]  # workdirs made before the field resume
  search_config.check_search_settings(str(tmp_path), record)
  c.task.xla_cpu_dots = "xla"
  assert search_config.make_task(c).xla_cpu_dots == "xla"
  search_config.check_search_settings(str(tmp_path), search_config.search_settings_record(c))
  c.task.xla_cpu_dots = "mkl"
  with pytest.raises(SearchConfigError, match=r"task: CTRTask\.xla_cpu_dots must be one of"):
    search_config.make_task(c)


def test_a_workdir_made_with_the_flat_study_resumes(tmp_path):
  # search.json of a study made before the algorithm blocks (the flat `study.pbt_interval`).
  record = search_config.search_settings_record(_config("pbt", {"pbt_interval": 3.0}))
  old = {**record, "study": {"algorithm": "pbt", "max_budget": 9.0, "pbt_model": "",
                             "pbt_interval": 3.0}}
  (tmp_path / search_config.SETTINGS_FILE).write_text(json.dumps(old))
  search_config.check_search_settings(str(tmp_path), record)  # read, not refused
  with pytest.raises(SearchConfigError, match="study.pbt_interval: stored 3.0, given 1.0"):
    search_config.check_search_settings(str(tmp_path), search_config.search_settings_record(_config("pbt")))


def test_make_space_of_a_normal_config():
  c = _config()
  c.space.families, c.space.mlp_widths = "fm,deepfm", "16,32"
  space = search_config.make_space(c, SEARCH_SPACE)
  assert space["model.name"].choices == ("fm", "deepfm")
  assert space["model.mlp.width"].choices == (16, 32)
  assert "model.cross_layers" not in space  # dcnv2 is not searched
  c.space.families = "fm,transformer"
  with pytest.raises(SearchConfigError, match="space"):
    search_config.make_space(c, SEARCH_SPACE)


def test_make_space_refuses_a_space_of_old_trial_keys():
  old = SEARCH_SPACE._replace(from_config=lambda _: Space(
      {"model.name": Categorical(("fm",)), "optim.dense_lr": Float(1e-4, 1e-2, log=True)}))
  with pytest.raises(ConfigError, match=r"^config field optim\.dense_lr \(search space\): "
                     r"renamed to optimizer\.learning_rate"):
    search_config.make_space(_config(), old)


@pytest.mark.parametrize("pbt_model,name", [("", "deepfm"), ("fm", "fm")])
def test_make_space_of_a_pbt_config_fixes_one_architecture(pbt_model, name):
  space = search_config.make_space(_config("pbt", pbt_model=pbt_model), SEARCH_SPACE)
  assert space["model.name"] == Fixed(name)
  assert all(isinstance(space[k], Fixed) for k in space.keys if k.startswith("model."))
  assert all(k in space for k in arch_lib.DYNAMIC_KEYS)  # what PBT explores
  assert not isinstance(space["embedding.learning_rate"], Fixed)


def test_pbt_model_must_be_a_model():
  with pytest.raises(SearchConfigError, match="study.pbt_model"):
    search_config.make_space(_config("pbt", pbt_model="transformer"), SEARCH_SPACE)


def test_parse_objectives():
  auc = search_config._parse_objectives("")
  assert auc == Objective("auc", "maximize") and not isinstance(auc, Objectives)
  both = search_config._parse_objectives(" auc:max , params:minimize,latency_ms:min")
  assert isinstance(both, Objectives) and [(o.metric, o.direction) for o in both.all] == [
      ("auc", "maximize"), ("params", "minimize"), ("latency_ms", "minimize")]


@pytest.mark.parametrize("value,match", [
    ("auc", "'auc' is not '<metric>:max'"), ("auc:up", "direction 'up' of 'auc'"),
    ("test_auc:max", "unknown metric 'test_auc'"), ("auc:max,auc:min", "named twice"),
    ("auc:max,", "'' is not"), (3, "expected a string")])
def test_bad_objectives_name_the_field(value, match):
  with pytest.raises(SearchConfigError, match=f"study.objectives: .*{match}"):
    search_config._parse_objectives(value)


def test_several_objectives_need_a_multi_objective_algorithm():
  c = _config("tpe", objectives="auc:max,params:min")
  with pytest.raises(SearchConfigError, match=r"study.objectives: 2 objectives.*'tpe'.*motpe"):
    search_config.check_study_settings(c)
  for name in ("nsga2", "motpe"):
    search_config.check_study_settings(_config(name, objectives="auc:max,flops:min"))


@pytest.mark.parametrize("field,value,match", [
    ("max_flops", -1.0, "study.max_flops"),
    ("max_latency_ms", float("inf"), "study.max_latency_ms"),
    ("executor", "ray", "study.executor: unknown executor 'ray'"),
    ("dask_workers", 0, "study.dask_workers"), ("dask_address", 5, "study.dask_address")])
def test_bad_quota_and_executor_fields_are_named(field, value, match):
  with pytest.raises(SearchConfigError, match=match):
    search_config.check_study_settings(_config("random", **{field: value}))


def test_pbt_runs_only_on_the_local_executor():
  with pytest.raises(SearchConfigError, match="study.executor='dask'.*pbt"):
    search_config.check_study_settings(_config("pbt", executor="dask"))


def test_a_study_setting_the_config_lacks_takes_the_library_default():
  c = _config("tpe")
  c.study = ml_collections.ConfigDict({k: c.study[k] for k in ("algorithm", "num_trials",
                                                               "cohort_width", "min_budget",
                                                               "max_budget", "pbt_model")})
  search_config.check_study_settings(c)
  assert search_config.study_field(c, "executor") == "local"
  assert search_config.make_objective(c) == Objective("auc", "maximize")
  assert search_config.make_algorithm(c).n_startup_trials == 8  # the search's default block
  assert search_config.search_settings_record(c)["study"]["pbt_interval"] == 1.0


def _cache_config(algorithm="random"):
  """The default search with its trials' tables on the host (`task.embedding_backend=cache`)."""
  c = _config(algorithm)
  c.task.compact_rows, c.task.embedding_backend, c.task.cache_rows = False, "cache", 4096
  return c


def test_the_cache_backend_reaches_the_task_and_its_record():
  c = _cache_config()
  search_config.check_study_settings(c)
  task = search_config.make_task(c)
  assert (task.embedding_backend, task.cache_rows, task.cache_lookahead) == ("cache", 4096, 2)
  assert search_config.search_settings_record(c)["task"]["embedding_backend"] == "cache"
  # The device backend records no cache field: workdirs made before them resume.
  record = search_config.search_settings_record(_config("random"))
  assert not {"embedding_backend", "cache_rows", "cache_lookahead"} & set(record["task"])


@pytest.mark.parametrize("algorithm", ["asha", "pbt"])
def test_the_cache_backend_refuses_resuming_algorithms(algorithm):
  with pytest.raises(SearchConfigError, match="task.embedding_backend=cache: trials cannot resume"):
    search_config.check_study_settings(_cache_config(algorithm))


def test_the_cache_backend_with_compact_rows_names_the_field():
  c = _cache_config()
  c.task.compact_rows = True
  with pytest.raises(SearchConfigError, match="task: .*set compact_rows=False"):
    search_config.make_task(c)
