"""Tests of the CTR pipeline's search steps (nas -> hpo hand-off) and its step registry."""

import json

import ml_collections
import pytest

from experiments.configs import search_ctr
from search_spaces.ctr import SEARCH_SPACE
from sfjax.automl import pipeline
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import steps as pipeline_steps


def _config():
  search = search_ctr.get_config("smoke")
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = t = search.task
  t.data.synthetic.num_train, t.data.synthetic.num_eval = 8192, 2048
  t.data.synthetic.cardinality_scale = 0.0001
  t.batch_size, t.eval_rows, t.eval_batch_size, t.steps_per_budget_unit = 64, 1024, 1024, 4
  c.pipeline = ml_collections.ConfigDict({"order": "nas,hpo"})
  c.steps = ml_collections.ConfigDict()
  c.steps.nas = ml_collections.ConfigDict({"type": "nas", "search_space": "ctr"})
  c.steps.nas.space = search.space
  c.steps.nas.space.families = "lr,fm"
  c.steps.nas.study = st = search.study
  st.algorithm, st.num_trials, st.cohort_width = "random", 3, "1"
  st.min_budget = st.max_budget = 2.0
  st.leaderboard_size = 0
  c.steps.hpo = ml_collections.ConfigDict({"type": "hpo"})
  c.steps.hpo.study = ml_collections.ConfigDict(st.to_dict())
  c.steps.hpo.study.num_trials = 2
  return c


def test_registry_has_every_ctr_step_kind():
  kinds = pipeline_steps.ctr_step_kinds({"ctr": SEARCH_SPACE})
  assert set(kinds) == {"nas", "hpo", "autofis", "autogroup", "fully_train", "baseline",
                        "compress"}
  assert all(k.check is not None and k.description for k in kinds.values())


def test_nas_hands_its_best_config_to_hpo_which_keeps_the_architecture(tmp_path):
  kinds = pipeline_steps.ctr_step_kinds({"ctr": SEARCH_SPACE})
  report = pipeline.run_pipeline(_config(), str(tmp_path), kinds)
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
  assert {"auc", "holdout_auc", "beats_default", "num_trials"} <= set(nas_row["best_metrics"])
  assert nas_row["best_metrics"]["num_trials"] == 3 and hpo_row["best_metrics"]["num_trials"] == 2
  assert "start_config_holdout_auc" in hpo_row["best_metrics"]


def test_tuned_space_starts_at_the_given_point():
  best = SEARCH_SPACE.default_config(None).to_dict()
  space, start = pipeline_steps.tuned_space(SEARCH_SPACE, best)
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
  block = ml_collections.ConfigDict(_config().steps[kind].to_dict())
  edit(block)
  kinds = pipeline_steps.ctr_step_kinds({"ctr": SEARCH_SPACE})
  with pytest.raises(ConfigError, match=f"config field {field}"):
    kinds[kind].check(block, "steps.s")


def test_hpo_without_an_earlier_search_fails_naming_the_missing_input(tmp_path):
  c = _config()
  c.pipeline.order = "hpo"
  report = pipeline.run_pipeline(c, str(tmp_path), pipeline_steps.ctr_step_kinds({"ctr": SEARCH_SPACE}))
  assert report["steps"][0]["status"] == "failed"
  assert "needs 'search_space'" in report["steps"][0]["error"]
