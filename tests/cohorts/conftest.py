"""Fixtures shared by the cohort and search tests: one tiny synthetic task's precomputed
trial data, and a runner that records the program calls it makes."""

import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import CohortRunner
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


@pytest.fixture(scope="module")
def layout_data():
  """TrialData of the planted multi-hot smoke data (`ctr.py:multihot_smoke`, issue #22): 4
  one-hot fields, a weighted bag, a mean bag, a long sqrtn bag and a history sharing the
  item table; batch 64, 512 eval rows."""
  d = ctr_config.get_config("multihot_smoke").data
  task = trial_data.CTRTask(d, batch_size=64, eval_rows=512, steps_per_budget_unit=4,
                            eval_batch_size=256)
  return trial_data.TrialData(task)


class CallRecorder(CohortRunner):
  """The real runner, recording `(lanes, scan steps, seeds)` of each program call that
  `run` makes (the calls that measure 'auto' widths are not recorded)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls, self._measuring = [], False

  def measure_widths(self, *args, **kwargs):
    self._measuring = True
    try:
      return super().measure_widths(*args, **kwargs)
    finally:
      self._measuring = False

  def run_stacked(self, arch, hparams, seeds, start, end, init_states=None, dense_masks=None):
    out = super().run_stacked(arch, hparams, seeds, start, end, init_states, dense_masks)
    if not self._measuring:
      lengths = np.broadcast_to(np.asarray(end) - np.asarray(start), (len(seeds),))
      self.calls.append((len(seeds), int(lengths.max()), [int(s) for s in seeds]))
    return out
