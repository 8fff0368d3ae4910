"""The fast tier (`make test`: -m "not slow and not quality") keeps the DESIGN.md §6 checks.

Collects a few test files in-process with the Makefile's marker expression (tests/conftest.py
applies the markers at collection) and checks which node ids the fast tier selects: each
invariant's test stays in it, and a test of each `slow` / `quality` rule leaves it.
"""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST_TIER = "not slow and not quality"  # the Makefile's `test` target

# DESIGN.md §6 check -> a node id, or a prefix ending in '[' or '::', the fast tier must keep.
MUST_STAY_FAST = {
    "cache == device": "tests/train/cache_backend_test.py::"
                       "test_cache_training_equals_device_reference[",
    "no recompile (chex.assert_max_traces)": "tests/train/step_test.py::"
                                             "test_step_does_not_recompile_across_unique_counts",
    "no recompile, both backends": "tests/train/cache_backend_test.py::"
                                   "test_step_compiles_once_for_both_backends",
    "resume identical": "tests/train/resume_test.py::"
                        "test_resume_after_a_crash_equals_the_uninterrupted_run[device]",
    "8 devices == 1": "tests/train/scale_out_test.py::"
                      "test_eight_devices_replicated_and_row_sharded_equal_one_device[",
    "8 devices == 1, cache": "tests/train/cache_backend_test.py::"
                             "test_cache_on_eight_devices_matches_one_device_reference",
    "a bad line is named": "tests/data/criteo_test.py::test_malformed_line_names_file_and_line[",
    "layering": "tests/layout/layering_test.py::test_imports_follow_the_layers",
}
# A test of each rule of tests/conftest.py -> the node id (or prefix) the fast tier must drop.
MUST_LEAVE = {
    "nbclient": "tests/notebooks/notebooks_test.py::test_notebook_runs_headless[",
    "subprocess through a helper": "tests/experiments/pipeline_ctr_test.py::"
                                   "test_smoke_pipeline_resumes_after_a_kill_in_fully_train",
    "two_processes through a fixture": "tests/parallel/multiprocess_checkpoint_test.py::"
                                       "test_two_processes_resume_a_two_process_checkpoint",
    "two_processes in the test": "tests/parallel/distributed_test.py::"
                                 "test_two_processes_match_the_one_device_reference",
    "executor_dask": "tests/ctr_search/executor_dask_test.py::",
    "a matrix's extra case": "tests/train/resume_test.py::"
                             "test_resume_after_a_crash_equals_the_uninterrupted_run[cache]",
    "an extra case marked in its file":
        "tests/train/scale_out_test.py::"
        "test_eight_devices_replicated_and_row_sharded_equal_one_device[adam]",
    "quality": "tests/train/movielens_quality_test.py::test_deepfm_beats_fuxictr_on_movielens",
}


class _Selection:
  """A pytest plugin that records the selected and the deselected node ids."""

  def __init__(self):
    self.selected, self.deselected = [], []

  def pytest_deselected(self, items):
    self.deselected += [item.nodeid for item in items]

  def pytest_collection_finish(self, session):
    self.selected = [item.nodeid for item in session.items]


@pytest.fixture(scope="module")
def fast_tier() -> _Selection:
  """The fast tier's selection among the files MUST_STAY_FAST and MUST_LEAVE name."""
  wanted = [*MUST_STAY_FAST.values(), *MUST_LEAVE.values()]
  files = sorted({os.path.join(ROOT, n.partition("::")[0]) for n in wanted})
  selection = _Selection()
  code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", f"--rootdir={ROOT}",
                      "-m", FAST_TIER, *files], plugins=[selection])
  assert code == pytest.ExitCode.OK, f"collecting {files} failed: exit {code}"
  return selection


def _matches(prefix: str, node_ids: list[str]) -> list[str]:
  exact = not prefix.endswith(("::", "["))
  return [n for n in node_ids if (n == prefix if exact else n.startswith(prefix))]


@pytest.mark.parametrize("check", sorted(MUST_STAY_FAST))
def test_the_invariant_is_in_the_fast_tier(fast_tier, check):
  prefix = MUST_STAY_FAST[check]
  assert _matches(prefix, fast_tier.selected), (
      f"{check}: {prefix} is not in `make test` (marked slow/quality, or renamed)")


@pytest.mark.parametrize("rule", sorted(MUST_LEAVE))
def test_a_slow_or_quality_test_leaves_the_fast_tier(fast_tier, rule):
  prefix = MUST_LEAVE[rule]
  assert _matches(prefix, fast_tier.deselected), f"{rule}: {prefix} was not collected at all"
  assert not _matches(prefix, fast_tier.selected), f"{rule}: {prefix} is still in `make test`"
