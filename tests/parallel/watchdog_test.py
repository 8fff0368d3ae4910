"""The peer watchdog: heartbeats, the judgement of peers, phases, and the thread's
check against an in-memory key-value store with the coordination client's methods.

Two real processes, one killed, are in `peer_failure_test.py` (slow).
"""

import pytest

from sfjax.parallel import watchdog
from sfjax.parallel.watchdog import Heartbeat, PeerView


def test_heartbeats_round_trip_and_other_text_is_none():
  beat = Heartbeat(7, "run", "checkpoint step_00000012: a|b")
  assert watchdog.parse_heartbeat(watchdog.format_heartbeat(beat)) == beat
  for text in ("", "x|run|p", "3|sleep|p", "3"):
    assert watchdog.parse_heartbeat(text) is None


def _views(text="", since=0.0):
  return {1: PeerView(text, since)}


def test_a_peer_whose_beat_changes_is_alive_however_long_the_run():
  views = _views("1|run|a", 0.0)
  for t in range(1, 100):
    views, failure = watchdog.judge_peers(views, {1: f"{t + 1}|run|a"}, float(t), 5.0)
    assert failure is None
  assert views[1] == PeerView("100|run|a", 99.0)


def test_a_silent_peer_fails_after_the_timeout_naming_it_and_its_phase():
  views = _views("4|run|training after checkpoint step_00000006", 10.0)
  views, failure = watchdog.judge_peers(views, {1: views[1].text}, 15.0, 5.0)
  assert failure is None  # exactly the timeout: not yet
  _, failure = watchdog.judge_peers(views, {1: views[1].text}, 15.5, 5.0)
  assert failure == ("process 1 stopped responding (no heartbeat for 6 s; its last phase: "
                     "'training after checkpoint step_00000006')")


def test_a_peer_never_heard_of_fails_after_the_timeout():
  _, failure = watchdog.judge_peers(_views("", 0.0), {}, 9.0, 8.0)
  assert failure == "process 1 sent no heartbeat within 8 s"


def test_a_peer_that_exited_fails_a_running_process_but_not_an_exiting_one():
  views = _views("9|exit|training after checkpoint step_00000006", 0.0)
  texts = {1: views[1].text}
  _, failure = watchdog.judge_peers(views, texts, 11.0, 10.0)
  assert failure == "process 1 exited 11 s ago (its last phase: 'training after checkpoint step_00000006')"
  assert watchdog.judge_peers(views, texts, 11.0, 10.0, exiting=True)[1] is None
  views = _views("9|run|p", 0.0)  # still running but silent: a failure even while exiting
  assert "stopped responding" in watchdog.judge_peers(views, {1: "9|run|p"}, 11.0, 10.0,
                                                      exiting=True)[1]


def test_the_first_failed_peer_is_named_and_every_view_is_updated():
  views = {1: PeerView("1|run|a", 0.0), 2: PeerView("1|run|b", 0.0), 3: PeerView("1|run|c", 0.0)}
  new, failure = watchdog.judge_peers(views, {1: "2|run|a", 2: "1|run|b", 3: "1|run|c"}, 20.0, 5.0)
  assert failure.startswith("process 2 stopped responding")
  assert new[1] == PeerView("2|run|a", 20.0) and new[3] == views[3]


def test_phases_nest_and_fall_back_to_the_base_phase():
  watchdog.set_base_phase("training after checkpoint step_00000006")
  assert watchdog.current_phase() == "training after checkpoint step_00000006"
  with watchdog.phase("checkpoint step_00000012"):
    with watchdog.phase("inner"):
      assert watchdog.current_phase() == "inner"
    assert watchdog.current_phase() == "checkpoint step_00000012"
  with pytest.raises(ValueError), watchdog.phase("failing"):
    raise ValueError
  assert watchdog.current_phase() == "training after checkpoint step_00000006"


class _Store:
  """The coordination client's key-value methods, in memory (shared by the 'processes')."""

  def __init__(self):
    self.kv = {}

  def key_value_set(self, key, value, allow_overwrite=False):
    assert allow_overwrite or key not in self.kv
    self.kv[key] = value

  def key_value_dir_get(self, prefix):
    return [(k, v) for k, v in sorted(self.kv.items()) if k.startswith(prefix)]


def test_the_check_publishes_this_process_and_reads_its_peers(monkeypatch):
  store = _Store()
  clock = [100.0]
  monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])
  dogs = [watchdog.Watchdog(store, p, 2, timeout=10.0) for p in (0, 1)]
  with watchdog.phase("checkpoint step_00000012"):
    assert dogs[1].check_once() is None and dogs[0].check_once() is None
  assert store.kv["sfjax/heartbeat/1"] == "1|run|checkpoint step_00000012"
  clock[0] = 105.0
  assert dogs[0].check_once() is None  # process 1's beat is 5 s old: within the bound
  clock[0] = 111.0
  failure = dogs[0].check_once()  # process 1 beat last at 100: 11 s of silence
  assert failure.startswith("process 1 stopped responding (no heartbeat for 11 s; its last "
                            "phase: 'checkpoint step_00000012')")
  assert dogs[1].check_once(exiting=True) is None  # process 0 still beats
  assert store.kv["sfjax/heartbeat/1"].split("|")[1] == "exit"
