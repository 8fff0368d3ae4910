"""Issue #25 item 7, checkpoint faults injected at the file layer (tests/faults/file_faults.py;
slow tier): ENOSPC / EFBIG while the async table save writes its chunks, a SIGKILL in the middle
of that save, and transient read errors (EIO) while a resume verifies the checkpoints. Each run
stops with a named error or is killed, keeps every earlier checkpoint and metric, and its rerun
ends identical to an uninterrupted run."""

import errno
import os

import pytest

from sfjax.checkpoint import CHECKPOINT_DIR, committed_steps, verify
from sfjax.train import training_result
from tests.faults import file_faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, EVERY = file_faults.STEPS, file_faults.EVERY
EVAL_STEPS = list(range(EVERY, STEPS + 1, EVERY))
_run, _records = file_faults.run_train_ctr, file_faults.read_records



@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return file_faults.reference_results(str(tmp_path_factory.mktemp("ref") / "w"))


def _checkpoints(workdir):
  return committed_steps(os.path.join(workdir, CHECKPOINT_DIR))


def _assert_kept_and_rerun_identical(workdir, reference, fault=""):
  """Every checkpoint up to step 40 and every metric up to the stop are intact; the rerun
  (with `fault`) resumes from step 40 and ends identical to the uninterrupted run."""
  root = os.path.join(workdir, CHECKPOINT_DIR)
  assert _checkpoints(workdir) == [20, 40]
  for step in (20, 40):
    verify(os.path.join(root, f"step_{step:08d}"))
  before = _records(workdir)
  assert [r["step"] for r in before] == EVAL_STEPS[:len(before)] and len(before) >= 2
  assert [training_result(r) for r in before] == reference[:len(before)]
  rerun = _run(fault, workdir)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert f"resuming from {root}/step_00000040" in rerun.stderr
  assert [training_result(r) for r in _records(workdir)] == reference
  assert _checkpoints(workdir) == [STEPS - EVERY, STEPS]
  assert not [n for n in os.listdir(root) if n.startswith(("tmp.", "old.", "corrupt."))]
  return rerun


@pytest.mark.parametrize("code", ["ENOSPC", "EFBIG"])
def test_a_failed_table_save_names_the_last_good_checkpoint_and_resumes_exactly(
    tmp_path, reference, code):
  workdir = str(tmp_path / "w")
  failed = _run(f"table_write:60:{code}", workdir)
  root = os.path.join(workdir, CHECKPOINT_DIR)
  assert failed.returncode == 1 and "Traceback" not in failed.stderr
  assert file_faults.last_line(failed).startswith(f"error: checkpoint {root}/step_00000060 was not saved "
                                       f"(OSError: [Errno {getattr(errno, code)}]")
  assert file_faults.last_line(failed).endswith(f"the last good checkpoint is {root}/step_00000040")
  _assert_kept_and_rerun_identical(workdir, reference)


def test_sigkill_mid_async_table_save_then_transient_read_errors_resume_exactly(
    tmp_path, reference):
  workdir = str(tmp_path / "w")
  killed = _run("table_write:60:kill", workdir)
  assert killed.returncode == -9
  assert any(n.startswith("tmp.step_00000060.") for n in os.listdir(
      os.path.join(workdir, CHECKPOINT_DIR)))  # killed mid-save: the half-written save is left
  # The resume's verification reads every file once through an EIO: retried, never declared
  # corrupt (before: "every checkpoint ... is corrupt", or an older checkpoint set aside).
  rerun = _assert_kept_and_rerun_identical(workdir, reference, fault="read_eio")
  assert "step_00000040/meta.json: read failed ([Errno 5]" in rerun.stderr
  assert "retrying in 0.05 s" in rerun.stderr and "corrupt" not in rerun.stderr
