"""The workdir lock: one owner, a second fails at once naming the holder, freed on release
and when the holder dies (the cross-process race is tests/faults/two_runs_test.py)."""

import json
import os
import socket

import pytest

from sfjax.core import workdir_lock


def test_a_second_holder_fails_naming_pid_host_start_and_command(tmp_path):
  with workdir_lock.hold_workdir(str(tmp_path), "train_ctr") as lock:
    assert lock.held
    record = json.loads(open(lock.path).read())
    assert record["pid"] == os.getpid() and record["what"] == "train_ctr"
    with pytest.raises(workdir_lock.WorkdirLockedError) as info:
      workdir_lock.acquire(str(tmp_path), "search")
  message = str(info.value)
  assert "\n" not in message
  assert f"pid {os.getpid()} on {socket.gethostname()} since {record['started']}" in message
  assert str(tmp_path) in message


def test_released_lock_is_taken_again_and_the_file_stays(tmp_path):
  lock = workdir_lock.acquire(str(tmp_path), "a")
  lock.release()
  lock.release()  # idempotent
  assert not lock.held and os.path.exists(lock.path)
  with workdir_lock.hold_workdir(str(tmp_path), "b") as again:
    assert json.loads(open(again.path).read())["what"] == "b"


def test_hold_releases_when_the_block_raises(tmp_path):
  with pytest.raises(KeyError):
    with workdir_lock.hold_workdir(str(tmp_path), "a"):
      raise KeyError("boom")
  workdir_lock.acquire(str(tmp_path), "b").release()


def test_each_rank_has_its_own_lock(tmp_path):
  with workdir_lock.hold_workdir(str(tmp_path), "rank0", process_index=0):
    with workdir_lock.hold_workdir(str(tmp_path), "rank1", process_index=1) as rank1:
      assert rank1.path.endswith(".sfjax.lock.process_1")
      with pytest.raises(workdir_lock.WorkdirLockedError, match="rank1|pid"):
        workdir_lock.acquire(str(tmp_path), "again", process_index=1)


def test_no_workdir_holds_nothing_and_a_file_is_refused(tmp_path):
  with workdir_lock.hold_workdir(None) as lock:
    assert lock is None
  (tmp_path / "f").write_text("x")
  with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
    workdir_lock.acquire(str(tmp_path / "f"))


def test_a_holder_that_wrote_nothing_yet_is_named_so(tmp_path):
  path = workdir_lock.lock_path(str(tmp_path))
  open(path, "w").close()
  assert workdir_lock.describe_holder(path) == "a process that has not yet written its name"
