"""Tests for the append-only JSON-lines journal (sfjax/automl/study/journal.py)."""

import os
import re
import subprocess
import sys
import warnings

import pytest

from sfjax.automl.study import Journal, JournalError, JournalLockedError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD = b'{"event": "header"}\n{"event": "ask", "n": 1}\n'


def write(path, data: bytes) -> str:
  with open(path, "wb") as f:
    f.write(data)
  return str(path)


def read(path) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def test_append_then_reopen_reads_numbered_records(tmp_path):
  path = str(tmp_path / "new" / "dir" / "journal.jsonl")  # directories are created
  journal, records = Journal.open(path)
  assert records == [] and journal.path == path
  journal.append({"event": "header", "b": 1, "a": [1, 2]})
  journal.append({"event": "tell", "metrics": {"auc": 0.5}})
  # Each append is one complete, key-sorted line, on disk before append returns.
  assert read(path) == (b'{"a": [1, 2], "b": 1, "event": "header"}\n'
                        b'{"event": "tell", "metrics": {"auc": 0.5}}\n')
  journal.close()
  journal.close()  # idempotent
  journal, records = Journal.open(path)
  assert records == [(1, {"event": "header", "b": 1, "a": [1, 2]}),
                     (2, {"event": "tell", "metrics": {"auc": 0.5}})]
  journal.append({"event": "requeue"})  # appends after the existing lines
  journal.close()
  journal, records = Journal.open(path)
  journal.close()
  assert [n for n, _ in records] == [1, 2, 3]


def test_empty_file_has_no_records(tmp_path):
  path = write(tmp_path / "j.jsonl", b"")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    journal, records = Journal.open(path)
  journal.close()
  assert records == [] and read(path) == b""


@pytest.mark.parametrize("tail", [
    b'{"event": "tell", "tri',  # died mid-write
    b'{"event": "tell"}',  # complete JSON but no newline: the write did not finish
    b"\x00\x00\x00\x00",  # zeros a crash can leave at the end of a file
    '{"note": "\u00e9'.encode("utf-8")[:-1],  # cut inside a UTF-8 character
], ids=["partial", "no-newline", "zeros", "utf8"])
def test_torn_last_line_is_dropped_with_a_warning_and_cut(tmp_path, tail):
  path = write(tmp_path / "j.jsonl", GOOD + tail)
  with pytest.warns(RuntimeWarning, match=re.escape(f"{path}:3: ignoring a torn last line "
                                                    f"({len(tail)} bytes")):
    journal, records = Journal.open(path)
  assert records == [(1, {"event": "header"}), (2, {"event": "ask", "n": 1})]
  assert read(path) == GOOD  # cut off the file, so the next append starts a fresh line
  journal.append({"event": "tell", "trial_id": 0})
  journal.close()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    journal, records = Journal.open(path)
  journal.close()
  assert records[-1] == (3, {"event": "tell", "trial_id": 0}) and len(records) == 3


@pytest.mark.parametrize("bad, reason", [
    (b"this is not json", "corrupt journal line: Expecting value"),
    (b'{"event": "tell"', "corrupt journal line: Expecting"),
    (b"[1, 2]", "corrupt journal line: expected a JSON object, got list"),
    (b"", "corrupt journal line"),  # an empty line in the middle
    (b'{"note": "\xff"}', "corrupt journal line: 'utf-8' codec"),
])
def test_corrupt_middle_line_raises_naming_file_and_line(tmp_path, bad, reason):
  data = b'{"event": "header"}\n' + bad + b'\n{"event": "ask"}\n{"event": "tell"}\n'
  path = write(tmp_path / "j.jsonl", data)
  with pytest.raises(JournalError, match=f"^{re.escape(f'{path}:2: {reason}')}") as info:
    Journal.open(path)
  assert (info.value.path, info.value.line) == (path, 2)
  assert isinstance(info.value, ValueError)
  assert read(path) == data  # a corrupt journal is left exactly as it was
  # The failed open released its lock while the exception (and its traceback) is alive:
  # a repaired journal opens at once in the same process.
  write(tmp_path / "j.jsonl", b'{"event": "header"}\n')
  journal, records = Journal.open(path)
  journal.close()
  assert [r for _, r in records] == [{"event": "header"}]


def test_a_second_open_is_locked_until_close(tmp_path):
  path = str(tmp_path / "j.jsonl")
  journal, _ = Journal.open(path)
  journal.append({"event": "header"})
  with pytest.raises(JournalLockedError, match=re.escape(f"{path} is open in another study")):
    Journal.open(path)
  assert read(path) == b'{"event": "header"}\n'  # the refused open changed nothing
  journal.close()
  again, records = Journal.open(path)
  assert records == [(1, {"event": "header"})]
  again.close()


def test_the_lock_holds_across_processes(tmp_path):
  path = str(tmp_path / "j.jsonl")
  probe = ("import sys\nfrom sfjax.automl.study import Journal, JournalLockedError\n"
           "try:\n  Journal.open(sys.argv[1])[0].close()\n  print('opened')\n"
           "except JournalLockedError:\n  print('locked')\n")
  env = {**os.environ, "PYTHONPATH": ROOT}
  def run():
    return subprocess.run([sys.executable, "-c", probe, path], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()
  journal, _ = Journal.open(path)
  try:
    assert run() == "locked"
  finally:
    journal.close()
  assert run() == "opened"
