"""The task every trial trains on: validation, budgets, precomputed steps, the eval stack."""

import dataclasses

import chex
import ml_collections
import numpy as np
import pytest

from experiments.configs import ctr as ctr_config
from sfjax.cohorts import task as trial_data
from sfjax.cohorts.table_choices import table_overrides
from sfjax.data import dataset as dataset_lib
from sfjax.embedding import vsi

BATCH = 32


def _data_config(num_eval=700):
  d = ctr_config.get_config().data
  d.synthetic.num_train, d.synthetic.num_eval = 2048, num_eval
  d.synthetic.cardinality_scale = 1e-4
  return d


@pytest.fixture(scope="module")
def dataset():
  return dataset_lib.make_dataset(_data_config(), 0)


def _task(**kw):
  return trial_data.CTRTask(_data_config(), **{"batch_size": BATCH, "eval_rows": 300,
                                               "eval_batch_size": 128, **kw})


@pytest.mark.parametrize("field,value", [
    ("batch_size", 0), ("eval_rows", -1), ("steps_per_budget_unit", 2.5),
    ("eval_batch_size", True), ("seed", -1), ("max_steps", -3), ("unique_capacity", "8")])
def test_bad_field_is_named(field, value):
  with pytest.raises(ValueError, match=rf"CTRTask\.{field} must be an integer >= [01], got"):
    trial_data.CTRTask(_data_config(), **{field: value})


def test_xla_cpu_dots_is_checked_and_gives_the_programs_compiler_options(monkeypatch):
  with pytest.raises(ValueError, match=r"CTRTask\.xla_cpu_dots must be one of \['auto', 'eigen', "
                                       r"'xla'\], got 'mkl'"):
    _task(xla_cpu_dots="mkl")
  assert _task().xla_cpu_dots == "auto"
  monkeypatch.setattr(trial_data.jax, "default_backend", lambda: "cpu")
  eigen = (("xla_cpu_experimental_ynn_fusion_type", ""),)
  assert _task(xla_cpu_dots="eigen").compiler_options == eigen
  assert _task(xla_cpu_dots="xla").compiler_options == ()
  assert _task().compiler_options in (eigen, ())  # this CPU's vendor decides
  monkeypatch.setattr(trial_data.jax, "default_backend", lambda: "gpu")
  assert _task(xla_cpu_dots="eigen").compiler_options == ()  # a CPU option only
  assert _task(xla_cpu_dots="eigen") != _task(xla_cpu_dots="xla")  # programs cached apart


def test_data_without_format_is_named():
  with pytest.raises(ValueError, match="CTRTask.data"):
    trial_data.CTRTask({"synthetic": {}})


def test_task_is_frozen_and_hashable():
  a = trial_data.CTRTask(dict(_data_config()), batch_size=BATCH)  # a plain mapping is accepted
  b = trial_data.CTRTask(_data_config(), batch_size=BATCH)
  assert isinstance(a.data, ml_collections.FrozenConfigDict)
  assert a == b and hash(a) == hash(b)
  assert a != trial_data.CTRTask(_data_config(), batch_size=BATCH + 1)


def test_steps_for_budget():
  task = _task(steps_per_budget_unit=10)
  assert [task.steps_for_budget(b) for b in (0, 1, 1.5, 0.26, 9)] == [0, 10, 15, 3, 90]
  for bad in (-1.0, float("nan"), float("inf")):
    with pytest.raises(ValueError, match="budget must be a finite number >= 0"):
      task.steps_for_budget(bad)


def _reference_steps(task, dataset, num_steps):
  """The first `num_steps` train steps, prepared one by one on the host."""
  source = dataset.train_batches(task.batch_size, task.seed)
  capacity = task.batch_size * dataset.spec.num_fields
  return [vsi.prepare_batch(next(source), dataset.spec.field_offsets, capacity,
                            dataset.spec.total_rows)[0] for _ in range(num_steps)]


def test_train_steps_slice_the_precomputed_steps_and_grow_on_demand(dataset):
  task = _task()
  data = trial_data.TrialData(task, dataset)
  assert data.num_steps == 0 and data.capacity == BATCH * dataset.spec.num_fields
  first = data.train_steps(0, 3)
  assert data.num_steps == 3
  later = data.train_steps(2, 6)  # grows to 6 steps
  assert data.num_steps == 6
  chex.assert_shape((first.rows, later.rows), (None, data.capacity))
  chex.assert_shape((first.vids, later.vids), (None, BATCH, dataset.spec.num_fields))
  reference = _reference_steps(task, dataset, 6)
  for start, got in ((0, first), (2, later)):
    for i in range(got.rows.shape[0]):
      chex.assert_trees_all_equal(tuple(None if x is None else np.asarray(x[i]) for x in got),
                                  tuple(reference[start + i]))
  assert 0 < data.max_unique <= data.capacity
  data.train_steps(1, 4)  # inside what exists: nothing new
  assert data.num_steps == 6


def test_max_steps_are_precomputed_up_front(dataset):
  data = trial_data.TrialData(_task(max_steps=4), dataset)
  assert data.num_steps == 4
  assert data.train_steps(4, 4).rows.shape == (0, data.capacity)


@pytest.mark.parametrize("start,end", [(-1, 2), (3, 2)])
def test_invalid_ranges_raise(dataset, start, end):
  data = trial_data.TrialData(_task(), dataset)
  with pytest.raises(ValueError, match=rf"step range \[{start}, {end}\)"):
    data.train_steps(start, end)


def test_eval_stack_keeps_exactly_eval_rows_real_examples(dataset):
  data = trial_data.TrialData(_task(eval_rows=300, eval_batch_size=128), dataset)
  num_fields = dataset.spec.num_fields
  chex.assert_shape(data.eval_batches.vids, (3, 128, num_fields))  # 300 rows: 3 batches of 128
  chex.assert_shape(data.eval_batches.rows, (3, 128 * num_fields))
  assert data.num_eval_examples == 300
  np.testing.assert_array_equal(data.eval_mask, np.r_[np.ones(300), np.zeros(84)])
  np.testing.assert_array_equal(np.asarray(data.eval_batches.mask).reshape(-1), data.eval_mask)
  # Labels are the split's first 300 examples.
  labels = np.concatenate([b.labels for b in dataset.eval_batches("eval", 128)])
  np.testing.assert_array_equal(data.eval_labels[:300], labels[:300])


def test_eval_stack_of_a_smaller_split_keeps_all_of_it():
  task = trial_data.CTRTask(_data_config(num_eval=200), batch_size=BATCH, eval_rows=1000,
                            eval_batch_size=128)
  data = trial_data.TrialData(task)
  assert data.num_eval_examples == 200 and data.eval_mask.shape == (256,)


def test_compact_rows_renumber_into_the_touched_rows(dataset):
  full = trial_data.TrialData(_task(max_steps=5), dataset)
  compact = trial_data.TrialData(_task(max_steps=5, compact_rows=True), dataset)
  assert full.row_ids is None and full.num_rows == full.full_rows == dataset.spec.total_rows
  u, v = compact.num_rows, compact.full_rows
  assert v == full.num_rows and 0 < u < v
  assert np.all(np.diff(compact.row_ids) > 0) and compact.row_ids[-1] < v
  for got, want in ((compact.train_steps(0, 5), full.train_steps(0, 5)),
                    (compact.eval_batches, full.eval_batches)):
    got_rows, want_rows = np.asarray(got.rows), np.asarray(want.rows)
    real = want_rows < v
    np.testing.assert_array_equal(got_rows == u, ~real)  # padding -> the new padding row U
    np.testing.assert_array_equal(compact.row_ids[got_rows[real]], want_rows[real])
    chex.assert_trees_all_equal(got._replace(rows=0), want._replace(rows=0))
  # every touched row is some batch's: U is exactly the union
  touched = np.concatenate([np.asarray(full.train_steps(0, 5).rows).ravel(),
                            np.asarray(full.eval_batches.rows).ravel()])
  np.testing.assert_array_equal(np.unique(touched[touched < v]), compact.row_ids)


def test_compact_rows_need_fixed_steps_and_refuse_more(dataset):
  with pytest.raises(ValueError, match=r"CTRTask\.compact_rows needs max_steps"):
    _task(compact_rows=True)
  with pytest.raises(ValueError, match=r"CTRTask\.compact_rows must be True or False"):
    _task(max_steps=2, compact_rows=1)
  compact = trial_data.TrialData(_task(max_steps=2, compact_rows=True), dataset)
  with pytest.raises(ValueError, match="max_steps=2"):
    compact.train_steps(0, 3)


def test_layout_steps_carry_weights_and_skip_padding(layout_data):
  """Bags and sequences (issue #22): S id columns, per-id weights, padding -> the pad entry."""
  spec = layout_data.spec
  s, b = spec.num_columns, layout_data.task.batch_size
  assert spec.has_padding and s > spec.num_fields
  assert layout_data.capacity == vsi.unique_capacity(b, s, True) == b * s + 1
  steps = layout_data.train_steps(0, 2)
  chex.assert_shape(steps.vids, (2, b, s))
  chex.assert_shape(steps.weights, (2, b, s))
  chex.assert_shape(layout_data.eval_batches.weights, (2, 256, s))
  weights, vids, rows = (np.asarray(a) for a in (steps.weights, steps.vids, steps.rows))
  # A padding column (weight 0) points at the padding entry, which holds the padding row V.
  pads = np.take_along_axis(rows, vids.reshape(2, -1), axis=1).reshape(vids.shape)
  assert (weights == 0).any()
  np.testing.assert_array_equal(pads[weights == 0], spec.total_rows)
  assert (pads[weights != 0] < spec.total_rows).all()
  # The rows are the trainer's: the same host batch through the trainer's VSI.
  batch = next(layout_data.dataset.train_batches(b, layout_data.task.seed))
  want, _ = vsi.prepare_batch(batch, spec.column_offsets, layout_data.capacity, spec.total_rows,
                              spec.column_rows)
  np.testing.assert_array_equal(rows[0], want.rows)
  np.testing.assert_array_equal(weights[0], want.weights)


def test_backend_and_format_errors_are_named_in_full():
  with pytest.raises(ValueError, match=r"^CTRTask\.embedding_backend must be one of \['device', "
                     r"'cache'\], got 'host'$"):
    _task(embedding_backend="host")
  with pytest.raises(ValueError, match=r"^CTRTask\.embedding_backend='cache' keeps the whole "
                     r"table on the host: set compact_rows=False$"):
    _task(embedding_backend="cache", max_steps=2, compact_rows=True)
  assert _task(embedding_backend="cache", max_steps=2).embedding_backend == "cache"
  with pytest.raises(ValueError, match=r"^CTRTask\.compact_rows needs max_steps > 0: the touched "
                     r"rows are those of the train steps fixed up front$"):
    _task(compact_rows=True)
  for data in ({"synthetic": {}}, "criteo"):  # a mapping without `format`, not a mapping
    with pytest.raises(ValueError, match=r"^CTRTask\.data must be the `data` block of "
                       r"experiments/configs/ctr\.py \(it has no `format` field\): "):
      trial_data.CTRTask(data)


def test_trial_data_keeps_a_given_dataset_and_builds_one_step_for_an_empty_range(dataset):
  data = trial_data.TrialData(_task(), dataset)
  assert data.dataset is dataset
  assert data.train_steps(0, 0).rows.shape == (0, data.capacity)
  assert data.num_steps == 1  # a stack to slice from: one step, no more
  assert data.eval_mask.dtype == np.float32 and data.eval_batches.mask.dtype == np.float32
  compact = trial_data.TrialData(_task(max_steps=2, compact_rows=True), dataset)
  assert compact.row_ids.dtype == np.int64 and compact.table_starts is None  # no layout
  with pytest.raises(ValueError, match=r"^train steps up to 3 were asked for, but the task has "
                     r"CTRTask\.compact_rows with max_steps=2: raise max_steps to the largest "
                     r"budget's steps$"):
    compact.train_steps(0, 3)


def test_compact_rows_of_a_layout_know_where_each_table_starts(layout_data):
  task = dataclasses.replace(layout_data.task, max_steps=2, compact_rows=True)
  compact = trial_data.TrialData(task, layout_data.dataset)
  starts = table_overrides.compact_table_starts(compact.spec, compact.row_ids)
  assert compact.table_starts == starts and len(starts) == len(compact.spec.layout.tables)
  assert starts[0] == 0 and list(starts) == sorted(starts)


class _NoEvalRows:
  """A data set whose eval split yields no batch (the rest is the real one's)."""

  def __init__(self, dataset):
    self._dataset = dataset
    self.spec, self.eval_splits = dataset.spec, dataset.eval_splits

  def train_batches(self, batch_size, seed):
    return self._dataset.train_batches(batch_size, seed)

  def eval_batches(self, split, batch_size):
    return iter(())


def test_an_empty_eval_split_is_named(dataset):
  with pytest.raises(ValueError, match=r"^eval split 'eval' of data\.format='synthetic' is "
                     r"empty$"):
    trial_data.TrialData(_task(), _NoEvalRows(dataset))
