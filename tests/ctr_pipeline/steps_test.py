"""Tests of the CTR pipeline's search steps (nas -> hpo hand-off) and its step registry."""

import json

import ml_collections
import pytest

from search_spaces.ctr import SEARCH_SPACE
from sfjax.automl import pipeline
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import steps as pipeline_steps
from sfjax.ctr_search import search_config, search_defaults


def _config():
  """A tiny nas -> hpo pipeline whose step blocks hold only overrides."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = t = search_defaults().task
  t.data.synthetic.num_train, t.data.synthetic.num_eval = 8192, 2048
  t.data.synthetic.cardinality_scale = 0.0001
  t.batch_size, t.eval_rows, t.eval_batch_size, t.steps_per_budget_unit = 64, 1024, 1024, 4
  c.pipeline = ml_collections.ConfigDict({"order": "nas,hpo"})
  c.steps = ml_collections.ConfigDict()
  study = {"algorithm": "random", "num_trials": 3, "cohort_width": "1", "min_budget": 2.0,
           "max_budget": 2.0, "leaderboard_size": 0}
  c.steps.nas = ml_collections.ConfigDict({"type": "nas", "search_space": "ctr",
                                           "space": {"families": "lr,fm"}, "study": study})
  c.steps.hpo = ml_collections.ConfigDict({"type": "hpo", "study": {**study, "num_trials": 2}})
  return c


def _kinds():
  return pipeline_steps.ctr_step_kinds({"ctr": SEARCH_SPACE})


def test_registry_has_every_ctr_step_kind():
  kinds = _kinds()
  assert set(kinds) == {"nas", "hpo", "autofis", "autogroup", "fully_train", "baseline",
                        "compress"}
  assert all(k.check is not None and k.description for k in kinds.values())
  assert all(kinds[k].defaults is not None for k in ("nas", "hpo", "fully_train", "baseline"))


def test_search_steps_merge_their_overrides_onto_the_search_defaults():
  blocks = pipeline.effective_blocks(_config(), _kinds())
  nas, hpo = blocks["nas"], blocks["hpo"]
  defaults = search_defaults()
  assert nas.space.to_dict() == {**defaults.space.to_dict(), "families": "lr,fm"}
  assert nas.study.num_trials == 3 and hpo.study.num_trials == 2
  assert nas.study.executor == defaults.study.executor  # not overridden: the library's
  assert hpo.study.tpe.to_dict() == defaults.study.tpe.to_dict()
  assert "space" not in hpo and nas.search_space == "ctr"
  config = ml_collections.ConfigDict({"seed": 0, "study": hpo.study.to_dict()})
  assert search_config.make_algorithm(config).to_dict() == {"name": "random", "seed": 0}


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.steps.nas.study.__setitem__("num_trial", 3),
     r"steps\.nas\.study\.num_trial: unknown setting of step 'nas' \(nas\); did you mean "
     r"steps\.nas\.study\.num_trials\?"),
    (lambda c: c.steps.hpo.study.__setitem__("eta", 2),
     r"steps\.hpo\.study\.eta: unknown setting of step 'hpo' \(hpo\)"),
    (lambda c: c.steps.hpo.study.__setitem__("tpe", {"n_startup_trails": 2}),
     r"steps\.hpo\.study\.tpe\.n_startup_trails: .*did you mean "
     r"steps\.hpo\.study\.tpe\.n_startup_trials\?"),
    (lambda c: c.steps.nas.__setitem__("spaces", {}),
     r"steps\.nas\.spaces: .*did you mean steps\.nas\.space\?"),
])
def test_a_misspelt_override_names_the_step_and_the_closest_key(edit, message):
  config = _config()
  edit(config)
  with pytest.raises(ConfigError, match=f"^config field {message}"):
    pipeline.parse_steps(config, _kinds())


@pytest.mark.slow  # ~13 s; the fast tier stays under 5 minutes (make test-all runs it)
def test_nas_hands_its_best_config_to_hpo_which_keeps_the_architecture(tmp_path):
  report = pipeline.run_pipeline(_config(), str(tmp_path), _kinds())
  assert report["status"] == "done", report
  nas_out = json.loads((tmp_path / "steps" / "0_nas" / "output.json").read_text())
  hpo_out = json.loads((tmp_path / "steps" / "1_hpo" / "output.json").read_text())
  arch = SEARCH_SPACE.arch_part(nas_out["best_config"])
  assert nas_out["search_space"] == hpo_out["search_space"] == "ctr"
  assert nas_out["pareto_front"] and all({"trial_id", "config", "metrics"} <= set(p)
                                         for p in nas_out["pareto_front"])
  with open(tmp_path / "steps" / "1_hpo" / "trials.jsonl") as f:
    trials = [json.loads(line) for line in f]
  assert len(trials) == 2
  for t in trials:  # every HPO trial trains the NAS winner's architecture
    assert SEARCH_SPACE.arch_part(t["config"]) == arch
  assert SEARCH_SPACE.arch_part(hpo_out["best_config"]) == arch
  nas_row, hpo_row = report["steps"]
  for row in (nas_row, hpo_row):  # one selection split: valid AUCs only, no test half
    metrics = row["best_metrics"]
    assert {"auc", "default_auc", "beats_default", "num_trials"} <= set(metrics)
    assert not any("holdout" in k or "test" in k for k in metrics), metrics
    assert metrics["beats_default"] == (metrics["auc"] > metrics["default_auc"])
  assert nas_row["best_metrics"]["num_trials"] == 3 and hpo_row["best_metrics"]["num_trials"] == 2
  assert hpo_row["best_metrics"]["start_config_auc"] == hpo_row["best_metrics"]["default_auc"]


def test_tuned_space_starts_at_the_given_point():
  best = SEARCH_SPACE.default_config(None).to_dict()
  space, start = pipeline_steps._tuned_space(SEARCH_SPACE, best)
  assert dict(start) == best
  assert space.default_config(None) == start
  assert space.from_config(None).validate(best) == start
  other = {**best, "model.embed_dim": 4}
  with pytest.raises(ValueError, match="model.embed_dim"):
    space.from_config(None).validate(other)  # the architecture is fixed


@pytest.mark.parametrize("kind, edit, field", [
    ("nas", lambda b: b.__delitem__("space"), "steps.s.space: missing"),
    ("nas", lambda b: setattr(b, "search_space", "blocks"), "steps.s.search_space: unknown"),
    ("nas", lambda b: setattr(b.study, "num_trials", 0), "steps.s.study.num_trials"),
    ("nas", lambda b: setattr(b.study, "algorithm", "nope"), "steps.s.study.algorithm"),
    ("hpo", lambda b: b.__delitem__("study"), "steps.s.study: missing"),
    ("hpo", lambda b: setattr(b.study, "min_budget", 99.0), "steps.s.study.min_budget"),
])
def test_bad_search_blocks_name_the_field(kind, edit, field):
  kinds = _kinds()
  block = pipeline.effective_blocks(_config(), kinds)[kind]
  kinds[kind].check(block, "steps.s")  # the merged block is good
  edit(block)
  with pytest.raises(ConfigError, match=f"config field {field}"):
    kinds[kind].check(block, "steps.s")


def test_hpo_without_an_earlier_search_fails_naming_the_missing_input(tmp_path):
  c = _config()
  c.pipeline.order = "hpo"
  report = pipeline.run_pipeline(c, str(tmp_path), _kinds())
  assert report["steps"][0]["status"] == "failed"
  assert "needs 'search_space'" in report["steps"][0]["error"]


def _front_output():
  """A nas step's output whose front trades AUC for latency (trial 2 is slower, better)."""
  front = [{"trial_id": i, "config": {"model.name": name}, "metrics": {"auc": auc, "latency_ms": ms}}
           for i, name, auc, ms in ((0, "lr", 0.700, 0.2), (1, "fm", 0.745, 0.5),
                                    (2, "deepfm", 0.750, 3.0))]
  return pipeline.StepOutput({"auc": 0.750, "default_auc": 0.740, "beats_default": True},
                             {"best_config": front[2]["config"], "best_trial_id": 2,
                              "pareto_front": front, "search_space": "ctr"})


@pytest.mark.parametrize("delta, chosen, beats", [(0.0, 2, True), (0.01, 1, True), (0.06, 0, False)])
def test_select_fastest_hands_on_the_fastest_front_trial_within_delta(delta, chosen, beats):
  out = pipeline_steps.select_fastest(_front_output(), delta)
  front = _front_output().output["pareto_front"]
  assert out.output["best_trial_id"] == chosen
  assert out.output["best_config"] == front[chosen]["config"]
  assert out.best_metrics["auc"] == front[chosen]["metrics"]["auc"]
  assert out.best_metrics["latency_ms"] == front[chosen]["metrics"]["latency_ms"]
  assert out.best_metrics["best_auc"] == 0.750 and out.best_metrics["default_auc"] == 0.740
  assert out.best_metrics["beats_default"] is beats  # the chosen trial against the default


@pytest.mark.parametrize("edit, message", [
    ({"select_within_auc": 0.01}, "study.objectives must hold auc:max and latency_ms:min"),
    ({"select_within_auc": 0.01, "study": {"algorithm": "nsga2", "objectives": "auc:max,params:min"}},
     "study.objectives must hold auc:max and latency_ms:min"),
    ({"select_within_auc": float("nan")}, "expected a number"),
])
def test_a_latency_selection_without_its_front_is_refused_naming_the_field(edit, message):
  kinds = _kinds()
  block = pipeline.effective_blocks(_config(), kinds)["nas"]
  for key, value in edit.items():
    if key == "study":
      block.study.update(value)
    else:
      block[key] = value
  with pytest.raises(ConfigError, match=f"config field steps.s.select_within_auc: .*{message}"):
    kinds["nas"].check(block, "steps.s")


@pytest.mark.slow  # ~20 s: a hardware-aware NAS step, latencies measured on the serving forward
def test_nas_selects_the_fastest_front_model_within_delta_of_its_latencies(tmp_path):
  c = _config()
  c.pipeline.order = "nas"
  # The roofline latency: deterministic, so the front below does not hang on wall-time
  # noise (measured latencies of models this small are ~0.1 ms apart and swap order on a
  # busy machine; the measured source is tested in tests/cohorts/latency_test.py).
  c.steps.nas.study.update({"algorithm": "nsga2", "num_trials": 4, "objectives":
                            "auc:max,latency_ms:min", "latency_source": "model",
                            "latency_batch_size": 64})
  c.steps.nas.space.families = "lr,fm,deepfm"
  c.steps.nas.select_within_auc = 1.0  # any AUC: the fastest model of the front
  report = pipeline.run_pipeline(c, str(tmp_path), _kinds())
  assert report["status"] == "done", report
  out = json.loads((tmp_path / "steps" / "0_nas" / "output.json").read_text())
  front = out["pareto_front"]
  # a real trade-off (seed 0: FM better and slower than LR), so the choice is not the best AUC
  assert len(front) >= 2 and all(p["metrics"]["latency_ms"] > 0 for p in front)
  fastest = min(front, key=lambda p: (p["metrics"]["latency_ms"], -p["metrics"]["auc"]))
  assert out["best_trial_id"] == fastest["trial_id"] and out["best_config"] == fastest["config"]
  metrics = report["steps"][0]["best_metrics"]
  assert metrics["latency_ms"] == fastest["metrics"]["latency_ms"]
  assert metrics["best_auc"] > metrics["auc"] == fastest["metrics"]["auc"]
