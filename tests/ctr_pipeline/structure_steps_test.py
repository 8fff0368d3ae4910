"""Tests of the CTR pipeline's AutoFIS step: settings from the block, the kept-pairs hand-off."""

import ml_collections
import pytest

from experiments.configs import search_ctr
from sfjax.automl.pipeline import StepContext, StepSpec
from sfjax.core.errors import ConfigError
from sfjax.ctr_pipeline import structure_steps as pss
from sfjax.structure import autofis


def _block(**fields):
  return ml_collections.ConfigDict({"type": "autofis", "planted_share": 0.5, **fields})


def test_settings_come_from_the_block_fields():
  s = pss._autofis_settings(_block(embed_dim=4, search_steps=7, warmup_steps=3, mlp_dims=[8]), "steps.a")
  assert (s.embed_dim, s.search_steps, s.mlp_dims) == (4, 7, (8,))
  assert s.grda_c == autofis.AutoFISSettings().grda_c  # unset fields keep their defaults


@pytest.mark.parametrize("fields, match", [
    ({"serch_steps": 3}, "steps.a.serch_steps: no such AutoFISSettings field"),
    ({"search_steps": 0}, "config field steps.a: .*search_steps"),
    ({"planted_share": 0.0}, "steps.a.planted_share"),
])
def test_bad_blocks_name_the_field(fields, match):
  kind = pss.structure_step_kinds()["autofis"]
  with pytest.raises(ConfigError, match=match):
    kind.check(_block(**fields), "steps.a")


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_autofis_step_hands_on_kept_pairs_scored_against_the_planted_ones(tmp_path):
  c = ml_collections.ConfigDict({"seed": 0})
  c.task = t = search_ctr.get_config("smoke").task
  t.data.synthetic.num_train, t.data.synthetic.num_eval = 8192, 2048
  t.data.synthetic.cardinality_scale = 0.0001
  t.batch_size, t.eval_rows, t.eval_batch_size = 64, 1024, 1024
  block = _block(embed_dim=4, search_steps=8, warmup_steps=4, retrain_steps=4)
  c.steps = ml_collections.ConfigDict({"a": block})
  ctx = StepContext(StepSpec(0, "a", "autofis", c.steps.a), str(tmp_path), str(tmp_path), c, ())
  out = pss._run_autofis_step(ctx)
  result = autofis.AutoFISResult.from_json(out.output["autofis"])
  assert out.output["kept_pairs"] == [list(p) for p in result.kept_pairs]
  assert out.best_metrics["num_kept_pairs"] == len(result.kept_pairs)
  assert out.best_metrics["num_pairs"] == 26 * 25 // 2
  truth = autofis.planted_pairs(t.data, 0, share=0.5)
  assert out.best_metrics["num_planted_pairs"] == len(truth)
  assert (out.best_metrics["planted_precision"], out.best_metrics["planted_recall"]) == \
      autofis.pair_precision_recall(result.kept_pairs, truth)


@pytest.mark.slow  # the fast tier stays under 5 minutes; make test-all runs it
def test_autogroup_step_hands_on_field_groups(tmp_path):
  c = ml_collections.ConfigDict({"seed": 0})
  c.task = t = search_ctr.get_config("smoke").task
  t.data.synthetic.num_train, t.data.synthetic.num_eval = 8192, 2048
  t.data.synthetic.cardinality_scale = 0.0001
  t.batch_size, t.eval_rows, t.eval_batch_size = 64, 1024, 1024
  block = ml_collections.ConfigDict({"type": "autogroup", "embed_dim": 4, "max_order": 3,
                                     "num_groups": [2, 3], "mlp_dims": [8], "steps": 6})
  c.steps = ml_collections.ConfigDict({"g": block})
  kind = pss.structure_step_kinds()["autogroup"]
  kind.check(block, "steps.g")
  out = kind.run(StepContext(StepSpec(0, "g", "autogroup", block), str(tmp_path), str(tmp_path),
                             c, ()))
  groups = out.output["field_groups"]
  assert sorted(groups) == ["2", "3"] and [len(groups["2"]), len(groups["3"])] == [2, 3]
  assert all(0 <= f < 26 for gs in groups.values() for g in gs for f in g)
  assert out.best_metrics["num_groups"] == 5 and 0 < out.best_metrics["valid_auc"] < 1
  bad = ml_collections.ConfigDict({**block.to_dict(), "num_groups": [2]})
  with pytest.raises(ConfigError, match="config field steps.g: .*num_groups"):
    kind.check(bad, "steps.g")
