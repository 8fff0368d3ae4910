"""sfjax/checkpoint/read_retry.py: transient OSErrors are retried, a missing file is not,
a persistent error becomes one CheckpointReadError naming the file."""

import errno

import pytest

from sfjax.checkpoint.read_retry import CheckpointReadError, read_retrying


def _flaky(failures, error=None):
  error = error or OSError(errno.EIO, "Input/output error")
  calls = []

  def read():
    calls.append(1)
    if len(calls) <= failures:
      raise error
    return "data"

  return read, calls


def test_transient_errors_are_retried_with_doubling_pauses():
  read, calls = _flaky(2)
  pauses = []
  assert read_retrying(read, "/ck/f", sleep=pauses.append) == "data"
  assert len(calls) == 3 and pauses == [0.05, 0.1]


def test_a_persistent_error_names_the_file_and_keeps_the_errno():
  read, calls = _flaky(10)
  pauses = []
  with pytest.raises(CheckpointReadError, match=r"^\[Errno 5\] /ck/f: still unreadable after 4 "
                     r"attempts \(Input/output error\); the checkpoint is kept") as err:
    read_retrying(read, "/ck/f", sleep=pauses.append)
  assert err.value.errno == errno.EIO and len(calls) == 4 and pauses == [0.05, 0.1, 0.2]


@pytest.mark.parametrize("error", [FileNotFoundError(2, "gone"), IsADirectoryError(21, "dir")])
def test_a_missing_file_is_not_retried(error):
  read, calls = _flaky(10, error)
  with pytest.raises(type(error)):
    read_retrying(read, "/ck/f", sleep=lambda s: None)
  assert len(calls) == 1


def test_attempts_must_be_positive():
  with pytest.raises(ValueError, match="attempts must be >= 1, got 0"):
    read_retrying(lambda: 1, "/ck/f", attempts=0)
