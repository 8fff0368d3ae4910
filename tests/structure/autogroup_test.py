"""AutoGroup: settings, search on planted data, the searched groups against random ones.

The model (memberships, group interactions by hand) is tested in
tests/models/group_interactions_test.py.
"""

import json

import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import arch as arch_lib
from sfjax.cohorts import cohort_runner
from sfjax.cohorts import task as task_lib
from sfjax.structure import autogroup
from sfjax.structure import gate_training as st
from tests.structure import runner_options

DATA = ml_collections.ConfigDict(dict(format="synthetic", synthetic=dict(
    num_train=500_000, num_eval=20_000, cardinality_scale=0.001, min_rows=4, zipf_exponent=1.1,
    planted_dim=8, num_dense=13)))
TASK = task_lib.CTRTask(DATA, seed=0, batch_size=512, eval_rows=16_000, eval_batch_size=2048)
# Few groups and a faster structure rate: each group must be chosen, not just cover many fields.
SETTINGS = autogroup.AutoGroupSettings(embed_dim=4, max_order=3, num_groups=(2, 1), mlp_dims=(32,),
                                       steps=400, structure_lr=0.05)


@pytest.mark.parametrize("kwargs, field", [({"max_order": 1}, "max_order"),
                                           ({"num_groups": (2,)}, "num_groups"),
                                           ({"num_groups": 0}, "num_groups"),
                                           ({"temperature": 0.0}, "temperature"),
                                           ({"steps": 0}, "steps"),
                                           ({"embedding_lr": -1.0}, "embedding_lr")])
def test_bad_settings_name_the_field(kwargs, field):
  with pytest.raises(Exception, match=f"AutoGroupSettings.{field}"):
    autogroup.AutoGroupSettings(**kwargs)


@pytest.fixture(scope="module")
def prepared():
  """The task's prepared data alone (a fast test needs no search)."""
  return st.prepare_trial_data(TASK, SETTINGS)


@pytest.fixture(scope="module")
def searched(prepared):
  return prepared, autogroup.run_autogroup(TASK, SETTINGS, data=prepared)


def test_learns_hard_groups_and_beats_logistic_regression(searched):
  data, result = searched
  assert result.orders == (2, 3)
  assert [m.shape for m in result.memberships] == [(26, 2), (26, 1)]
  assert all(m.dtype == bool for m in result.memberships)
  member_counts = [int(m.sum()) for m in result.memberships]
  assert all(0 < c < m.size for c, m in zip(member_counts, result.memberships, strict=True))
  lr = arch_lib.split_config({"model.name": "lr"})[0]
  runner = cohort_runner.CohortRunner(data.task, cohort_width=1, data=data)
  lr_out = runner.run_stacked(lr, {}, [0], 0, SETTINGS.steps)
  # Measured: AutoGroup 0.775 vs LR 0.764 test AUC (8000 test rows).
  assert result.test_auc > float(lr_out.test_auc[0]) + 0.002, (result.test_auc, lr_out.test_auc)
  record = json.loads(json.dumps(result.to_json()))
  assert record["groups"]["2"] == [list(g) for g in result.groups(2)]
  back = autogroup.AutoGroupResult.from_json(record)
  for x, y in zip(back.memberships, result.memberships, strict=True):
    np.testing.assert_array_equal(x, y)
  assert back.orders == result.orders and back.test_auc == result.test_auc
  with pytest.raises(ValueError, match="lacks"):
    autogroup.AutoGroupResult.from_json({"orders": [2]})
  with pytest.raises(ValueError, match="not searched"):
    result.groups(4)


def _random_like(rng, memberships):
  """Random groups with the sizes of `memberships`' groups (each group its own draw)."""
  out = []
  for member in memberships:
    groups = np.zeros_like(member)
    for g in range(member.shape[1]):
      groups[rng.choice(member.shape[0], int(member[:, g].sum()), replace=False), g] = True
    out.append(groups)
  return out


def test_searched_groups_beat_random_groups_of_the_same_sizes(searched):
  # Both retrained the same way (same model, seed and steps, groups fixed): only the grouping
  # differs. Measured: searched 0.776 test / 0.772 valid AUC, three random draws <= 0.771 /
  # <= 0.763 (a second search seed: 0.776 vs <= 0.771).
  data, result = searched
  found = autogroup.retrain_with_groups(data, SETTINGS, result.memberships)
  rng = np.random.default_rng(0)
  for _ in range(2):
    random = autogroup.retrain_with_groups(data, SETTINGS, _random_like(rng, result.memberships))
    assert found["test_auc"] > random["test_auc"] + 0.003, (found, random)
    assert found["valid_auc"] > random["valid_auc"] + 0.003, (found, random)


def test_retrain_refuses_groups_of_other_shapes(searched):
  data, result = searched
  with pytest.raises(ValueError, match=r"memberships: shapes \[\(26, 2\)\], expected"):
    autogroup.retrain_with_groups(data, SETTINGS, result.memberships[:1])


def test_deterministic_for_a_seed(searched):
  # The same settings as the fixture: the compiled programs are reused, only the steps rerun.
  data, result = searched
  again = autogroup.run_autogroup(TASK, SETTINGS, data=data)
  for x, y in zip(again.memberships, result.memberships, strict=True):
    np.testing.assert_array_equal(x, y)
  assert (again.test_auc, again.valid_logloss) == (result.test_auc, result.valid_logloss)


@pytest.mark.slow  # ~10 s
def test_groups_the_pooled_fields_of_bags_and_sequences():
  """Issue #22: on the planted multi-hot smoke data the memberships are over the F pooled
  features, the structure logits train, and a fixed grouping retrains."""
  task = task_lib.CTRTask(ctr_config.get_config("multihot_smoke").data, batch_size=128,
                          eval_rows=1024, eval_batch_size=1024)
  settings = autogroup.AutoGroupSettings(embed_dim=4, max_order=3, num_groups=(2, 1), mlp_dims=(8,),
                                         steps=12, structure_lr=0.05)
  data = st.prepare_trial_data(task, settings)
  result = autogroup.run_autogroup(task, settings, data=data)
  assert result.field_names == tuple(f.name for f in data.spec.layout.features)
  assert [m.shape for m in result.memberships] == [(8, 2), (8, 1)]
  assert np.isfinite([result.valid_auc, result.test_auc]).all()
  metrics = autogroup.retrain_with_groups(data, settings, result.memberships)
  assert np.isfinite(metrics["valid_auc"])


def test_the_runners_compile_as_the_tasks_xla_cpu_dots_says(prepared, monkeypatch):
  runner_options.assert_runners_follow_xla_cpu_dots(autogroup, autogroup.run_autogroup, prepared, SETTINGS,
                                                    monkeypatch)
