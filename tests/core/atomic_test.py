"""Atomic writes: whole new file or untouched old file, never a torn one or a stray temp file."""

import os

import numpy as np
import pytest

from sfjax.core import atomic


def test_writes_text_as_utf8(tmp_path):
  path = tmp_path / "a.txt"
  atomic.atomic_write(str(path), "héllo\n")
  assert path.read_bytes() == "héllo\n".encode()


def test_writes_bytes_and_replaces_the_old_file(tmp_path):
  path = tmp_path / "b.bin"
  atomic.atomic_write(str(path), b"old contents")
  atomic.atomic_write(str(path), b"\x00\x01\xff")
  assert path.read_bytes() == b"\x00\x01\xff"
  assert os.listdir(tmp_path) == ["b.bin"]


def test_writer_callable_gets_a_binary_file(tmp_path):
  path = tmp_path / "arrays.npz"
  atomic.atomic_write(str(path), lambda f: np.savez(f, x=np.arange(3)))
  np.testing.assert_array_equal(np.load(path)["x"], [0, 1, 2])


def test_creates_missing_directories(tmp_path):
  path = tmp_path / "new" / "deeper" / "c.txt"
  atomic.atomic_write(str(path), "x")
  assert path.read_text() == "x"


def test_failing_writer_keeps_old_file_and_leaves_no_temp(tmp_path):
  path = tmp_path / "d.txt"
  atomic.atomic_write(str(path), "previous")

  def half_then_fail(f):
    f.write(b"torn")
    raise OSError("disk full")

  with pytest.raises(OSError, match="disk full"):
    atomic.atomic_write(str(path), half_then_fail)
  assert path.read_text() == "previous"
  assert os.listdir(tmp_path) == ["d.txt"]


def test_interrupted_first_write_creates_nothing(tmp_path):
  def interrupted(f):
    f.write(b"partial")
    raise KeyboardInterrupt  # a BaseException: the temp file is removed too

  with pytest.raises(KeyboardInterrupt):
    atomic.atomic_write(str(tmp_path / "e.txt"), interrupted)
  assert os.listdir(tmp_path) == []


def test_fsync_directory(tmp_path):
  atomic.fsync_directory(str(tmp_path))  # no error on a directory
  with pytest.raises(FileNotFoundError):
    atomic.fsync_directory(str(tmp_path / "missing"))
