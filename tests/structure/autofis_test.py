"""AutoFIS: settings, planted truth, recovery on planted data (the model: tests/models/gated_fm_test.py)."""

import json

import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import task as trial_data
from sfjax.structure import autofis
from tests.structure import runner_options


def planted_data_config():
  """Synthetic Criteo-like data (26 fields, small vocabularies) whose seed-2 planted FM has two
  pairs holding half of its pairwise variance: (0, 10) and (6, 10)."""
  return ml_collections.ConfigDict(dict(format="synthetic", synthetic=dict(
      num_train=500_000, num_eval=20_000, cardinality_scale=0.001, min_rows=4, zipf_exponent=1.1,
      planted_dim=8, num_dense=13)))


TASK = trial_data.CTRTask(planted_data_config(), seed=2, batch_size=512, eval_rows=16_000, eval_batch_size=2048)
# grda_c 0.02 (default 0.005): sparser, so the kept set is comparable with the two-pair truth.
SETTINGS = autofis.AutoFISSettings(embed_dim=4, search_steps=600, warmup_steps=150, retrain_steps=400,
                                   grda_c=0.02)


@pytest.mark.parametrize("field, value", [("embed_dim", 0), ("search_steps", 0), ("grda_c", -1.0),
                                          ("bn_momentum", 1.5), ("embedding_optimizer", "nope"),
                                          ("mlp_dims", (8, 0)), ("dense_lr", float("nan"))])
def test_bad_settings_name_the_field(field, value):
  with pytest.raises(Exception, match=f"AutoFISSettings.{field}"):
    autofis.AutoFISSettings(**{field: value})


def test_warmup_must_leave_search_steps():
  with pytest.raises(ValueError, match="AutoFISSettings.warmup_steps must be < search_steps=100"):
    autofis.AutoFISSettings(search_steps=100, warmup_steps=100)


def test_precision_recall_by_hand():
  assert autofis.pair_precision_recall([(0, 1), (2, 3), (4, 1)], [(1, 4), (0, 1)]) == (2 / 3, 1.0)
  assert autofis.pair_precision_recall([], [(0, 1)]) == (1.0, 0.0)
  assert autofis.pair_precision_recall([(0, 1)], []) == (0.0, 1.0)


def test_planted_pairs_are_the_top_variance_pairs():
  cfg = planted_data_config()
  half = autofis.planted_pairs(cfg, 2)
  assert half == ((0, 10), (6, 10)) == autofis.planted_pairs(cfg, 2)  # deterministic
  most = autofis.planted_pairs(cfg, 2, share=0.8)
  assert set(half) < set(most) and len(most) < 26 * 25 // 2
  assert len(autofis.planted_pairs(cfg, 2, share=1.0)) > len(most)
  with pytest.raises(ValueError, match="share"):
    autofis.planted_pairs(cfg, 2, share=0.0)
  with pytest.raises(ValueError, match="synthetic"):
    autofis.planted_pairs(ml_collections.ConfigDict({"format": "criteo"}), 2)


@pytest.fixture(scope="module")
def prepared():
  """The task's prepared data alone (a fast test needs no search)."""
  return autofis.st.prepare_trial_data(TASK, SETTINGS)


@pytest.fixture(scope="module")
def searched(prepared):
  return prepared, autofis.run_autofis(TASK, SETTINGS, data=prepared)


def test_recovers_the_planted_pairs(searched):
  _, result = searched
  truth = autofis.planted_pairs(TASK.data, TASK.seed)
  precision, recall = autofis.pair_precision_recall(result.kept_pairs, truth)
  # Measured: kept (6, 10), (0, 10), (10, 25): precision 0.67, recall 1; pruning is by exact zeros.
  assert precision >= 0.6 and recall >= 0.99, (result.kept_pairs, truth)
  gates = np.asarray(result.gates)
  assert gates.shape == (325,) and np.sum(gates == 0.0) == 325 - len(result.kept_pairs)
  assert result.steps == 1000 and result.field_names[0] == "C1"


def test_kept_pairs_retrain_beats_random_pairs(searched):
  data, result = searched
  rng = np.random.default_rng(0)
  others = [p for p in result.all_pairs if p not in result.kept_pairs]
  random_pairs = [others[i] for i in rng.choice(len(others), len(result.kept_pairs), replace=False)]
  random_metrics = autofis.retrain_with_pairs(data, SETTINGS, random_pairs)
  # Measured: kept 0.777 vs random 0.768 test AUC (8000 test rows).
  assert result.test_auc > random_metrics["test_auc"] + 0.002
  assert result.valid_auc > random_metrics["valid_auc"]


def test_retrain_refuses_bad_pairs(searched):
  data, _ = searched
  with pytest.raises(ValueError, match=r"pairs: every pair must be \(i, j\) with 0 <= i < j < 26"):
    autofis.retrain_with_pairs(data, SETTINGS, [(3, 3)])


def test_json_round_trip(searched):
  _, result = searched
  record = json.loads(json.dumps(result.to_json()))
  back = autofis.AutoFISResult.from_json(record)
  assert back.kept_pairs == result.kept_pairs and back.all_pairs == result.all_pairs
  np.testing.assert_array_equal(back.gates, result.gates)
  with pytest.raises(ValueError, match="lacks"):
    autofis.AutoFISResult.from_json({"kept_pairs": []})


def test_deterministic_for_a_seed(searched):
  # The same settings as the fixture: the compiled programs are reused, only the steps rerun.
  data, result = searched
  again = autofis.run_autofis(TASK, SETTINGS, data=data)
  np.testing.assert_array_equal(again.gates, result.gates)
  assert (again.kept_pairs, again.test_auc, again.search_auc) == (result.kept_pairs, result.test_auc,
                                                                  result.search_auc)


@pytest.mark.slow  # ~10 s
def test_searches_the_pooled_fields_of_bags_and_sequences():
  """Issue #22: on the planted multi-hot smoke data the gates are over the F pooled features
  (bags and the history are one field each), gRDA moves them, and the retrain runs."""
  task = trial_data.CTRTask(ctr_config.get_config("multihot_smoke").data, batch_size=128,
                            eval_rows=1024, eval_batch_size=1024)
  settings = autofis.AutoFISSettings(embed_dim=4, mlp_dims=(8,), search_steps=12, warmup_steps=4,
                                     retrain_steps=6, grda_c=0.02)
  data = autofis.st.prepare_trial_data(task, settings)
  result = autofis.run_autofis(task, settings, data=data)
  names = tuple(f.name for f in data.spec.layout.features)
  assert result.field_names == names and len(names) == 8
  assert result.all_pairs == autofis.all_field_pairs(8) and result.gates.shape == (28,)
  assert not np.allclose(result.gates, settings.gate_init)  # trained by gRDA, not frozen
  assert np.isfinite([result.valid_auc, result.test_auc, result.search_auc]).all()


def test_the_runners_compile_as_the_tasks_xla_cpu_dots_says(prepared, monkeypatch):
  runner_options.assert_runners_follow_xla_cpu_dots(autofis, autofis.run_autofis, prepared, SETTINGS,
                                                    monkeypatch)
