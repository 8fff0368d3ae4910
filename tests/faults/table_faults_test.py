"""Issue #25 items 3 and 7, host-table faults at the file layer (slow tier): ENOSPC / EFBIG while
the mmap host table is created (a failed creation removes what it made, so the rerun is not
blocked; EFBIG is the kernel's own, from RLIMIT_FSIZE) and ENOSPC while a write-back marks the
table dirty (tests/faults/file_faults.py). Each stops with a named error, keeps every earlier
checkpoint and metric, and its rerun ends identical to an uninterrupted run."""

import errno
import os
import resource
import signal

import numpy as np
import pytest

from sfjax.checkpoint import CHECKPOINT_DIR, committed_steps, verify
from sfjax.embedding.host_table import HostTable
from sfjax.train import training_result
from tests.faults import file_faults

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS, EVERY = file_faults.STEPS, file_faults.EVERY
_run, _records = file_faults.run_train_ctr, file_faults.read_records


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return file_faults.reference_results(str(tmp_path_factory.mktemp("ref") / "w"))



def test_efbig_creating_an_mmap_table_removes_what_it_made(tmp_path):
  # The kernel's EFBIG: a file-size limit below values.npy's size (SIGXFSZ ignored, so the
  # write fails with EFBIG instead of killing the process).
  path = tmp_path / "new" / "table"
  kwargs = dict(seed=0, init_stddev=0.1, initial_slot_row=np.zeros(1, np.float32))
  limits = resource.getrlimit(resource.RLIMIT_FSIZE)
  handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  try:
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, limits[1]))
    with pytest.raises(OSError, match=f"^\\[Errno {errno.EFBIG}\\] {path}: cannot create the "
                       "memory-mapped host table") as err:
      HostTable.create_mmap(str(path), 1 << 16, 8, 1, **kwargs)
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    signal.signal(signal.SIGXFSZ, handler)
  assert err.value.errno == errno.EFBIG
  assert os.listdir(tmp_path) == []  # before: a half-made table/ blocked every later run
  with HostTable.create_mmap(str(path), 1 << 16, 8, 1, **kwargs) as table:
    table.scatter(np.array([5]), np.ones((1, 8), np.float32), np.ones((1, 1), np.float32))
  assert HostTable.open_mmap(str(path)).written_ids().tolist() == [5]


def test_enospc_creating_the_runs_table_is_named_and_the_rerun_is_not_blocked(
    tmp_path, reference):
  workdir = str(tmp_path / "w")
  failed = _run("create:ENOSPC", workdir)
  table = os.path.join(workdir, "table")
  assert failed.returncode == 1 and "Traceback" not in failed.stderr
  assert file_faults.last_line(failed).startswith(f"error: [Errno {errno.ENOSPC}] {table}: cannot create "
                                       "the memory-mapped host table")
  assert not os.path.exists(table)  # before: the rerun failed with FileExistsError
  rerun = _run("", workdir)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert [training_result(r) for r in _records(workdir)] == reference


def test_enospc_in_a_write_back_stops_named_keeps_checkpoints_and_resumes_exactly(
    tmp_path, reference):
  workdir = str(tmp_path / "w")
  root = os.path.join(workdir, CHECKPOINT_DIR)
  # The third time a write-back marks the table dirty: the first after step 40's checkpoint.
  failed = _run("meta_write:3:ENOSPC", workdir)
  meta = os.path.join(workdir, "table", "meta.json")
  assert failed.returncode == 1 and "Traceback" not in failed.stderr
  assert file_faults.last_line(failed) == (f"error: [Errno {errno.ENOSPC}] No space left on device: "
                                f"'{meta}'")
  assert f"last good checkpoint: {root}/step_00000040" in failed.stderr
  assert committed_steps(root) == [20, 40]
  for step in (20, 40):
    verify(os.path.join(root, f"step_{step:08d}"))
  before = [training_result(r) for r in _records(workdir)]
  assert len(before) >= 2 and before == reference[:len(before)]
  rerun = _run("", workdir)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert f"resuming from {root}/step_00000040" in rerun.stderr
  assert [training_result(r) for r in _records(workdir)] == reference
  assert committed_steps(root) == [STEPS - EVERY, STEPS]
