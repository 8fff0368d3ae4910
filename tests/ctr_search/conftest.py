"""Fixtures of the search tests: the tiny task of tests/cohorts/conftest.py (its twin, as
ragged_test runs the cohort runner the way the search driver does)."""

import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import task as trial_data

STEPS = 12  # steps per budget unit of the tiny task


@pytest.fixture(scope="module")
def data():
  """TrialData of a ~3.4k-row synthetic Criteo task (batch 128, 1,500 eval rows)."""
  d = ctr_config.get_config().data
  d.synthetic.cardinality_scale, d.synthetic.num_eval = 1e-4, 4096
  task = trial_data.CTRTask(d, batch_size=128, eval_rows=1500, steps_per_budget_unit=STEPS,
                            eval_batch_size=512)
  return trial_data.TrialData(task)
