"""Fixtures shared by the cohort and search tests: one tiny synthetic task's precomputed
trial data, and a runner that records the program calls it makes."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import CohortRunner, cohort_call, host_cohort, trial_states
from sfjax.cohorts import task as trial_data
from sfjax.embedding import device_table

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


def assert_host_cohort_equals_device_program(data, arch, hparams, seeds, steps) -> np.ndarray:
  """Runs `seeds`' lanes through one host table and a device cache (`run_host_cohort`, at
  least one eviction) and checks them against the device-table program started from the
  same first-touch rows: losses, written rows and eval AUC per lane. Returns the lanes'
  initial rows `[V, W*E]`."""
  run = host_cohort.run_host_cohort(data, arch, hparams, seeds, steps)
  assert run.stats["evictions"] > 0  # rows went back to the host table and came again
  lanes = len(seeds)
  dims, latent = host_cohort._lane_dims(arch, data.spec,
                                        cohort_call.stacked_hparams(hparams, lanes), lanes)
  values, slots = host_cohort.lane_rows(seeds, hparams["embedding.init_stddev"],
                                        np.arange(data.full_rows), arch.embedding_width,
                                        host_cohort._slot_rows(arch, data.spec), data.spec, dims,
                                        latent)
  states = host_cohort._lane_inits(arch, data.spec)(hparams, np.asarray(seeds, np.int32))
  e, s = arch.embedding_width, slots.shape[1] // lanes
  states = jax.device_get(states._replace(table=device_table.TableState(
      jnp.asarray(np.stack([values[:, w * e:(w + 1) * e] for w in range(lanes)])),
      jnp.asarray(np.stack([slots[:, w * s:(w + 1) * s] for w in range(lanes)])))))
  ref = cohort_call.call_cohort(data, None, arch, hparams, seeds, 0, steps, init_states=states)
  np.testing.assert_allclose(run.output.losses, ref.losses, rtol=1e-5, atol=1e-6)
  written = run.host_table.written_ids()
  got_values, _ = run.host_table.gather(written)
  for w in range(lanes):
    np.testing.assert_allclose(got_values[:, w * e:(w + 1) * e],
                               np.asarray(ref.states.table.values[w])[written],
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(run.output.auc, ref.auc, atol=1e-6)
  assert not np.allclose(run.output.losses[0], run.output.losses[1])
  return values


_SAME_METRICS = ("auc", "logloss", "train_loss", "test_auc", "params", "flops", "steps")


def assert_same_trial(got, want) -> None:
  """Two finished trials of one config: the same metrics (those `want` has, to 1e-5) and
  states (to float tolerance)."""
  assert got.status == want.status == "done"
  for key in _SAME_METRICS:
    if key in want.metrics:
      tolerance = 1e-5 * max(1.0, abs(want.metrics[key]))
      assert abs(got.metrics[key] - want.metrics[key]) <= tolerance, key
  chex.assert_trees_all_close(got.state, want.state, atol=5e-5, rtol=1e-4)


def assert_cohort_equals_each_trial_alone(data, archs, hparams, steps: int, *,
                                          merge_optimizers: bool = False,
                                          num_programs: int | None = None) -> list:
  """Runs `archs` as one cohort for `steps // 2` steps, resumes it to `steps`, and checks
  each trial against itself run alone (fresh, then resumed from its own state): metrics,
  states and the state's shapes (`trial_states.state_template`). `num_programs`: the
  programs the first half must compile (None: not checked). Returns the first half's
  results."""
  n = len(archs)
  runner = CohortRunner(data.task, cohort_width=4, data=data)
  alone = CohortRunner(data.task, cohort_width=1, data=data)
  traces = cohort_call._num_traces()
  half = runner.run(archs, hparams, list(range(n)), [0] * n, steps // 2, [None] * n,
                    merge_optimizers=merge_optimizers)
  if num_programs is not None:
    assert cohort_call._num_traces() - traces == num_programs
  full = runner.run(archs, hparams, list(range(n)), [steps // 2] * n, steps,
                    [r.state for r in half], merge_optimizers=merge_optimizers)
  for i, arch in enumerate(archs):
    ref_half = alone.run(arch, [hparams[i]], [i], [0], steps // 2, [None])[0]
    ref_full = alone.run(arch, [hparams[i]], [i], [steps // 2], steps, [ref_half.state])[0]
    assert_same_trial(half[i], ref_half)
    assert_same_trial(full[i], ref_full)
    chex.assert_trees_all_equal_shapes(full[i].state, trial_states.state_template(arch, data.spec))
  return half
