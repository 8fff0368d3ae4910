"""Timed cross-process waits: their messages, their bound, and one process.

The waits over two real processes (a barrier that names the process that did not
come, a killed process) are in `peer_failure_test.py` (slow).
"""

import pytest

from sfjax.core.errors import ConfigError
from sfjax.parallel import barriers


@pytest.fixture(autouse=True)
def _restore_timeout():
  before = barriers.timeout_s()
  yield
  barriers.set_timeout(before)


def test_the_message_names_the_missing_processes_the_barrier_and_the_bound():
  assert (barriers.describe_missing([1], "checkpoint step_00000040: the commit", 30.0)
          == "process 1 did not reach barrier 'checkpoint step_00000040: the commit' within 30 s")
  assert barriers.describe_missing([1, 3], "x", 2.5) == (
      "processes 1, 3 did not reach barrier 'x' within 2.5 s")


def test_missing_processes_are_those_without_a_published_key():
  published = ["d/0", "d/2"]
  assert barriers.missing_processes(published, "d/", 4) == [1, 3]
  assert barriers.missing_processes(["d/0", "d/1"], "d/", 2) == []
  assert barriers.missing_processes(["e/1"], "d/", 2) == [0, 1]  # another wait's keys


def test_set_timeout_bounds_later_waits_and_refuses_non_positive_values():
  barriers.set_timeout(12)
  assert barriers.timeout_s() == 12.0
  for bad in (0, -1, "30", True, None):
    with pytest.raises(ConfigError, match=r"distributed\.timeout_s"):
      barriers.set_timeout(bad)
  assert barriers.timeout_s() == 12.0  # a refused value changes nothing


def test_one_process_exchanges_with_itself_without_a_coordination_service():
  assert barriers.exchange("alone", "v") == ["v"]
  barriers.barrier("alone")  # returns at once: nothing to wait for
  assert not barriers.peer_failed()
  barriers.exit_now_after_peer_failure()  # no failure recorded: returns


def test_making_a_peer_failure_records_it_for_the_exit_path(monkeypatch):
  monkeypatch.setattr(barriers, "_failures", [])
  assert not barriers.peer_failed()
  barriers.record_peer_failure()  # a failure without words: counted, not quoted
  err = barriers.PeerFailureError("process 1 did not reach barrier 'x' within 3 s")
  assert barriers.peer_failed() and barriers.peer_failures() == [str(err)]
