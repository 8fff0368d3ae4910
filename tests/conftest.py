"""Test set-up: 8 fake CPU devices (set before JAX is imported anywhere), and the test tiers.

`make test` runs the fast tier, `-m "not slow and not quality"`; `make test-all` runs all.
Two markers (registered in pyproject.toml, strict) are applied here at collection:

- `slow`: a test that starts other processes or kernels. A test is slow when its function,
  a fixture it uses, or a function of the test tree that one of them calls (followed
  through the global names their code reads, nested functions and lambdas included) names
  a launcher: the modules `subprocess`, `multiprocessing`, `nbclient`, `dask`, `distributed`,
  or a module named `two_processes` (tests/parallel: two `jax.distributed` processes) or
  `executor_dask` (cohorts on a Dask cluster). Also slow, for files whose owners mark them
  from here: every case of a MATRICES test but its one fast case, and the long in-process
  runs under SLOW (searches, pipelines, benchmarks). Other files mark theirs in place:
  `pytest.param(..., marks=pytest.mark.slow)` for a matrix's extra cases, `pytest.mark.slow`.
- `quality`: a test that trains to a measured bar (a published AUC, a planted signal's AUC,
  thousands of steps): QUALITY below, or `pytest.mark.quality` in the file.

A node id here is a prefix: a file, a test, or one parametrization (`test[case]`). An entry
that names no collected test of its (collected) file stops the run at collection, so a renamed
test cannot slip back into the fast tier or out of it unnoticed.
"""

import inspect
import os
import shutil
import sys
import tempfile
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
from sfjax.core import host_devices  # noqa: E402  (imports no JAX: the flags below still count)

_EIGHT_DEVICES = "--xla_force_host_platform_device_count=8"
# XLA:CPU ends the process when one of the 8 device threads reaches a collective 40 s after
# the others. A wait of up to 10 minutes is a slow test, not a crash (two test workers and
# their subprocesses share 2 cores); a real deadlock still fails, by the test's own timeout.
_COLLECTIVE_PATIENCE = ("--xla_cpu_collective_call_warn_stuck_timeout_seconds=120 "
                        "--xla_cpu_collective_call_terminate_timeout_seconds=600")
TEST_XLA_FLAGS = f"{_EIGHT_DEVICES} {_COLLECTIVE_PATIENCE}"
if _EIGHT_DEVICES not in os.environ.get("XLA_FLAGS", ""):  # idempotent: nested pytest.main
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TEST_XLA_FLAGS).strip()
# Enough XLA:CPU launch threads (PJRT_NPROC) that 8 fake devices on 2 cores cannot hang in
# a collective (`sfjax.core.host_devices`: the AutoML notebook's kernel did, in CI and under
# the slow tier; inherited by every subprocess and kernel a test starts).
host_devices.guard_launch_threads()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
TESTS = os.path.join(ROOT, "tests") + os.sep

# Module roots / last module names that start processes, kernels or clusters.
LAUNCHER_ROOTS = frozenset({"subprocess", "multiprocessing", "nbclient", "dask", "distributed"})
LAUNCHER_NAMES = frozenset({"two_processes", "executor_dask"})

# Matrices (test id -> its one fast case): every other parametrization of the test is slow.
MATRICES = {
    "tests/train/resume_test.py::test_resume_after_a_crash_equals_the_uninterrupted_run":
        "device",  # the cache backends resume through the same checkpointer (DESIGN.md §6.4)
    "tests/train/resume_elsewhere_test.py::"
    "test_resume_with_another_setting_equals_the_uninterrupted_run": "device-change0",
    "tests/train/resume_corrupt_test.py::"
    "test_a_corrupt_latest_checkpoint_falls_back_to_the_previous": "corrupt_meta_json",
    "tests/ctr_search/search_loop_test.py::test_each_algorithm_exports_trials_and_best": "random",
    "tests/cohorts/shape_buckets/buckets_test.py::"
    "test_padded_model_gives_the_exact_models_logits": "deepfm-extra0",
    "tests/checkpoint/export_test.py::test_export_reads_back_with_numpy_as_the_final_table":
        "device",
    "tests/cohorts/shape_buckets/bucket_blocks_test.py::"
    "test_padded_model_gives_the_exact_models_logits": "fm",
    "tests/cohorts/table_choices/table_dims_test.py::"
    "test_traced_dims_equal_the_trainer_with_those_dims": "adagrad",  # rowwise_adagrad's per-row width is also checked fast (row_width test)
}
# Slow by node-id prefix: long in-process runs (searches, pipelines, benchmarks, cohorts
# trained fresh and resumed) of files whose owners mark them from here.
SLOW = (
    "tests/cohorts/shape_buckets/buckets_test.py::"
    "test_padded_cohort_equals_each_trial_alone_fresh_and_resumed",
    "tests/cohorts/shape_buckets/bucket_blocks_test.py::"
    "test_padded_cohort_of_block_subsets_equals_each_trial_alone_fresh_and_resumed",
    "tests/cohorts/shape_buckets/buckets_test.py::"
    "test_padded_cohort_with_adam_rows_and_first_order_columns_equals_each_trial_alone",
    "tests/ctr_search/ragged_test.py::test_ragged_padded_cohort_equals_each_trial_alone",
    "tests/ctr_search/ragged_test.py::test_ragged_cohort_of_one_architecture_equals_each_trial",
    "tests/checkpoint/export_test.py::test_export_skips_a_corrupt_latest",  # resume_corrupt_test's
    # cohorts: equal to trials one by one, and on 8 devices, stay fast
    "tests/cohorts/cohort_runner_test.py::test_resume_continues_exactly",  # program_test's too
    "tests/cohorts/cohort_runner_test.py::test_compact_rows_train_the_same_trial_as_the_full",
    "tests/cohorts/cohort_runner_test.py::test_trials_report_their_architectures_cost_metrics",
    "tests/ctr_pipeline/train_steps_test.py::test_fully_train_on_both_backends_scores_the_test",
    # table dims on both backends (the step's live columns and cohorts' dims stay fast)
    "tests/train/table_dims_test.py::test_data_tables_trains_alike_on_both_backends",
    # an mmap table under the trainer (host_table_test's mmap tables and loop_test's rerun on
    # an mmap table stay fast)
    "tests/train/cache_backend_test.py::test_mmap_table_trained_flushed_reopened",
    # the heaviest block cases of padded buckets (the other eight stay fast)
    "tests/cohorts/shape_buckets/bucket_blocks_test.py::"
    "test_column_gated_model_gives_the_exact_models_logits[attention]",
    "tests/cohorts/shape_buckets/bucket_blocks_test.py::"
    "test_column_gated_model_gives_the_exact_models_logits[outer_cin]",
    "tests/cohorts/shape_buckets/bucket_blocks_test.py::"
    "test_column_gated_model_gives_the_exact_models_logits[cross]",
    # one group-count superset stays fast ([two_in_one_stacked])
    "tests/cohorts/shape_buckets/bucket_row_layouts_test.py::"
    "test_a_trial_in_a_superset_of_other_group_counts_gives_its_exact_logits[one_in_three]",
    "tests/cohorts/shape_buckets/bucket_row_layouts_test.py::"
    "test_a_trial_in_a_superset_of_other_group_counts_gives_its_exact_logits[three_in_two]",
    # searches: `test_each_algorithm_exports_trials_and_best[random]` stays fast
    "tests/ctr_search/search_loop_test.py::test_asha_promotions_resume_from_the_parents_saved",
    "tests/ctr_search/search_loop_test.py::test_failed_cohort_is_told_failed_and_the_search",
    "tests/ctr_search/search_loop_test.py::test_pbt_population_explores_one_architecture",
    "tests/ctr_search/search_loop_test.py::"
    "test_architecture_aware_rounds_fill_cohorts_on_the_joint_space",
    "tests/ctr_search/search_loop_test.py::test_auto_width_reports_the_programs_that_ran",
    # one vision pipeline (digits) stays fast: tests/vision/vision_steps_test.py
    "tests/vision/vision_steps_test.py::test_augment_pipeline_smoke",
    "tests/vision/vision_steps_test.py::test_compress_pipeline_smoke",
    "tests/vision/vision_steps_test.py::test_hpo_interrupted_mid_step_resumes",
    "tests/vision/augment_search_test.py::test_tiny_pba_run",
    "tests/vision/augment_test.py::test_policy_probabilities_are_sampled_per_image",
    "tests/vision/vision_task_test.py::test_models_round_trip_through_their_descriptions",
    "tests/vision/compression_test.py::test_evaluator_fine_tunes_every_genome_alike",
    # benchmarks at smoke size (their config checks stay fast)
    "tests/experiments/bench_search_fill_test.py::"
    "test_ragged_and_exact_cohorts_run_the_same_asha_search",
    "tests/experiments/bench_trials_test.py::test_bench_trials_smoke",
    "tests/experiments/bench_trial_tables_test.py::test_bench_trial_tables_smoke",
    "tests/experiments/bench_scaling_test.py::test_bench_scaling_smoke",
    "tests/experiments/bench_scaling_test.py::test_device_counts_beyond_the_visible_ones",
    "tests/experiments/bench_gpu_test.py::test_bench_gpu_smoke",
    "tests/experiments/bench_autofis_test.py::test_bench_autofis_smoke",
    "tests/experiments/bench_huge_table_test.py::test_bench_huge_table_smoke",
    "tests/experiments/bench_train_test.py::test_every_round_reruns_the_floor_beside_the_device",
    "tests/experiments/bench_train_test.py::test_both_backends_on_fresh_batches",
    # the rest of a module whose searched fixture trains to a quality bar (QUALITY)
    "tests/structure/autogroup_test.py::test_retrain_refuses_groups_of_other_shapes",
    "tests/structure/autogroup_test.py::test_deterministic_for_a_seed",
    "tests/structure/autofis_test.py::test_retrain_refuses_bad_pairs",
    "tests/structure/autofis_test.py::test_json_round_trip",
    "tests/structure/autofis_test.py::test_deterministic_for_a_seed",
)
# Trains to a measured bar, by node-id prefix.
QUALITY = (
    "tests/train/movielens_quality_test.py",
    "tests/structure/autogroup_test.py::test_learns_hard_groups_and_beats_logistic_regression",
    "tests/structure/autogroup_test.py::test_searched_groups_beat_random_groups_of_the_same_sizes",
    "tests/structure/autofis_test.py::test_recovers_the_planted_pairs",
    "tests/structure/autofis_test.py::test_kept_pairs_retrain_beats_random_pairs",
    "tests/cohorts/pbt_population_test.py::test_pbt_beats_a_fixed_population_with_the_same_budget",
    "tests/compress/prune_search_test.py::test_the_front_dominates_the_unpruned_model_and_random",
    "tests/vision/compression_test.py::test_the_front_dominates_the_unpruned_network_and_random",
)


def _module_launches(module_name: str | None) -> bool:
  parts = (module_name or "").split(".")
  return parts[0] in LAUNCHER_ROOTS or parts[-1] in LAUNCHER_NAMES


def _code_objects(code: types.CodeType):
  yield code
  for const in code.co_consts:
    if isinstance(const, types.CodeType):
      yield from _code_objects(const)


def _reaches_launcher(func, seen: set) -> bool:
  """Whether `func`, or a function of the test tree it names, names a launcher."""
  func = inspect.unwrap(func)
  code = getattr(func, "__code__", None)
  if code is None or code in seen:
    return False
  seen.add(code)
  scope = getattr(func, "__globals__", {})
  for c in _code_objects(code):
    for name in c.co_names:
      value = scope.get(name)
      if value is None:
        continue
      if isinstance(value, types.ModuleType):
        if _module_launches(value.__name__):
          return True
      elif _module_launches(getattr(value, "__module__", None)):
        return True
      elif (inspect.isfunction(value) and value.__code__.co_filename.startswith(TESTS)
            and _reaches_launcher(value, seen)):
        return True
  return False


def _starts_processes(item) -> bool:
  seen = set()
  if _reaches_launcher(item.function, seen):
    return True
  fixtures = getattr(item, "_fixtureinfo", None)
  for defs in (fixtures.name2fixturedefs.values() if fixtures else ()):
    for fixturedef in defs:
      func = fixturedef.func
      if func.__code__.co_filename.startswith(TESTS) and _reaches_launcher(func, seen):
        return True
  return False


def _extra_matrix_case(node: str) -> bool:
  test, _, case = node.partition("[")
  return test in MATRICES and case[:-1] != MATRICES[test]


def tier_markers(item) -> list[str]:
  """The tier markers conftest gives `item`: a sublist of ['slow', 'quality']."""
  node = item.nodeid
  out = []
  if (node.startswith(SLOW) or _extra_matrix_case(node)
      or (isinstance(item, pytest.Function) and _starts_processes(item))):
    out.append("slow")
  if node.startswith(QUALITY):
    out.append("quality")
  return out


def _check_node_ids(items):
  """Every entry of SLOW, QUALITY and MATRICES whose file was collected names collected tests,
  and each matrix still has its fast case: a renamed test fails here, not silently."""
  nodes = [item.nodeid for item in items]
  files = {node.partition("::")[0] for node in nodes}
  for name, entries in (("SLOW", SLOW), ("QUALITY", QUALITY), ("MATRICES", tuple(MATRICES))):
    for entry in entries:
      if entry.partition("::")[0] in files and not any(n.startswith(entry) for n in nodes):
        raise pytest.UsageError(f"tests/conftest.py {name}: no test {entry}")
  for test, case in MATRICES.items():
    found = [n.partition("[")[2][:-1] for n in nodes if n.startswith(test + "[")]
    if found and case not in found:
      raise pytest.UsageError(f"tests/conftest.py MATRICES: {test} has no case [{case}] "
                              f"(found {sorted(found)})")


# JAX's persistent compilation cache, one folder per `pytest` run, shared by its xdist
# workers and removed at the end: a test that builds a program another test (or the other
# worker) already compiled loads it instead of compiling it again. Only in the test
# processes (the processes and kernels tests start compile for themselves). Set
# SFJAX_TEST_JAX_CACHE=off to compile everything.
JAX_CACHE_ENV = "SFJAX_TEST_JAX_CACHE"
_JAX_CACHE_MIN_COMPILE_S = 0.1  # smaller programs compile faster than they are stored
_CACHE_OWNER = pytest.StashKey[str]()  # the folder, in the process that made it


def pytest_configure(config):
  """Points JAX at the run's compilation cache (made here by the first pytest process)."""
  if os.environ.get(JAX_CACHE_ENV) == "off":
    return
  if not os.environ.get(JAX_CACHE_ENV):
    os.environ[JAX_CACHE_ENV] = tempfile.mkdtemp(prefix="sfjax-jax-cache-")
    config.stash[_CACHE_OWNER] = os.environ[JAX_CACHE_ENV]
  import jax  # pylint: disable=import-outside-toplevel  (after XLA_FLAGS above)
  jax.config.update("jax_compilation_cache_dir", os.environ[JAX_CACHE_ENV])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", _JAX_CACHE_MIN_COMPILE_S)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
  """Removes the compilation cache the run made (its owner: the first pytest process)."""
  folder = config.stash.get(_CACHE_OWNER, None)
  if folder:
    shutil.rmtree(folder, ignore_errors=True)
    os.environ.pop(JAX_CACHE_ENV, None)


def pytest_collection_modifyitems(config, items):
  """Adds the `slow` / `quality` markers by the rules of this module's docstring."""
  del config
  _check_node_ids(items)
  for item in items:
    for name in tier_markers(item):
      if item.get_closest_marker(name) is None:
        item.add_marker(getattr(pytest.mark, name))
