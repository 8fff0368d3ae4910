"""The peer watchdog: ends this process, naming the peer and the phase, when another
process of the run dies or leaves while this one still runs (issue #24, Deliver 5).

A device collective waiting for a dead peer has no timeout of its own (NCCL waits
forever; gloo on CPU fails at once only when the peer's socket is reset), and neither
does a process stuck anywhere else. So, once `jax.distributed` is up, a daemon thread
of every process publishes a heartbeat in the coordination service's key-value store
every `interval` seconds,

  sfjax/heartbeat/<p> = "<counter>|<run or exit>|<phase>"

and reads every peer's. A peer whose heartbeat has not changed for `timeout_s` (killed,
host lost, or its interpreter stuck), or that exited more than `timeout_s` ago while
this process still runs, ends this process with `barriers.PEER_FAILURE_EXIT` and one
line such as

  process 1 stopped responding (no heartbeat for 31 s; its last phase: 'checkpoint
  step 12'); this process (0) was in phase 'checkpoint step 12'

The run then resumes from its last checkpoint when every process is relaunched. The
phase is what `phase(name)` (a context) or `set_base_phase` last named: the
checkpointer names its saves, the loop's steps run in the phase after the newest
checkpoint. (A live peer hung in a collective keeps its heartbeat: the timed barriers
of `sfjax.parallel.barriers` bound the waits we control.)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import jax
from absl import logging

from sfjax.parallel import barriers

_KEY_PREFIX = "sfjax/heartbeat/"
_RUNNING, _EXITED = "run", "exit"


class Heartbeat(NamedTuple):
  """One process's published heartbeat.

  Attributes:
    counter: increases by one every beat (a change = the process is alive).
    state: 'run', or 'exit' once the process is leaving.
    phase: what the process was doing.
  """

  counter: int
  state: str
  phase: str


class PeerView(NamedTuple):
  """What this process last saw of a peer.

  Attributes:
    text: the peer's heartbeat text ('' = none seen yet).
    since: local time (monotonic seconds) that text was first seen.
  """

  text: str
  since: float


def format_heartbeat(beat: Heartbeat) -> str:
  """The stored text of `beat`."""
  return f"{beat.counter}|{beat.state}|{beat.phase}"


def parse_heartbeat(text: str) -> Heartbeat | None:
  """The heartbeat stored as `text` (None for '' or text of another format)."""
  counter, state, phase = (text.split("|", 2) + ["", ""])[:3]
  if not counter.isdigit() or state not in (_RUNNING, _EXITED):
    return None
  return Heartbeat(int(counter), state, phase)


def judge_peers(views: dict[int, PeerView], texts: dict[int, str], now: float,
                timeout: float, exiting: bool = False) -> tuple[dict[int, PeerView], str | None]:
  """Updates what was seen of each peer with the heartbeats read `now`; names the first
  failed one.

  Args:
    views: per peer (every process but this one), what was seen before.
    texts: the heartbeat texts read now, by process ('' or absent: none).
    now: local monotonic time in seconds.
    timeout: seconds without a change (or since an exit) that count as a failure.
    exiting: this process is leaving too: a peer that exited is no failure.

  Returns:
    (the new views, a description of the first failed peer or None).
  """
  new, failure = {}, None
  for p, seen in sorted(views.items()):
    text = texts.get(p, "")
    new[p] = seen if text == seen.text else PeerView(text, now)
    age = now - new[p].since
    beat = parse_heartbeat(text)
    if failure is not None or age <= timeout or (exiting and beat is not None
                                                 and beat.state == _EXITED):
      continue
    if beat is None:
      failure = f"process {p} sent no heartbeat within {timeout:g} s"
    elif beat.state == _EXITED:
      failure = f"process {p} exited {age:.0f} s ago (its last phase: '{beat.phase}')"
    else:
      failure = (f"process {p} stopped responding (no heartbeat for {age:.0f} s; its last "
                 f"phase: '{beat.phase}')")
  return new, failure


# ---- this process's phase -------------------------------------------------------------

_phases: list[str] = []
_base_phase = ["start-up"]


def current_phase() -> str:
  """What this process is doing: the innermost `phase`, else the base phase."""
  return _phases[-1] if _phases else _base_phase[0]


def set_base_phase(name: str) -> None:
  """The phase named outside any `phase` context (e.g. 'training after checkpoint step 6')."""
  _base_phase[0] = name
  _beat_now()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
  """Names what this process does inside the context (heartbeats and errors quote it)."""
  _phases.append(name)
  _beat_now()
  try:
    yield
  finally:
    _phases.pop()


def _beat_now() -> None:
  """Publishes a changed phase at once (the peers then quote the phase this process was
  really in if it dies before its next regular beat)."""
  for dog in _running:
    dog.beat_now()


# ---- the thread -------------------------------------------------------------------------


class Watchdog:
  """The heartbeat thread of this process (see the module docstring).

  Args:
    client: the coordination service client (`jax.distributed`).
    process_index, process_count: this process and P.
    timeout: seconds (`distributed.timeout_s`).
  """

  def __init__(self, client, process_index: int, process_count: int, timeout: float):
    self.client, self.me, self.timeout = client, process_index, timeout
    self.interval = max(0.1, min(2.0, timeout / 10))
    self.counter = 0
    self.views = {p: PeerView("", time.monotonic()) for p in range(process_count)
                  if p != process_index}
    self._stop = threading.Event()
    self._lock = threading.Lock()  # one check at a time (the thread's, or the exit's)
    self._thread = threading.Thread(target=self._run, name="sfjax-peer-watchdog", daemon=True)

  def start(self) -> None:
    """Starts beating and watching."""
    self._beat(_RUNNING)
    self._thread.start()

  def beat_now(self) -> None:
    """One heartbeat now, from any thread (a failure is left to the next check)."""
    with self._lock:
      if self._stop.is_set():
        return
      try:
        self._beat(_RUNNING)
      except Exception:  # pylint: disable=broad-except  (the thread's next check reports it)
        pass

  def _beat(self, state: str) -> None:
    self.counter += 1
    self.client.key_value_set(
        f"{_KEY_PREFIX}{self.me}",
        format_heartbeat(Heartbeat(self.counter, state, current_phase())), allow_overwrite=True)

  def check_once(self, exiting: bool = False) -> str | None:
    """One beat and one look at the peers; a description of a failed peer, or None.

    Args:
      exiting: this process is leaving (its beat says so; exited peers are no failure).
    """
    self._beat(_EXITED if exiting else _RUNNING)
    texts = self._read()
    self.views, failure = judge_peers(self.views, texts, time.monotonic(), self.timeout,
                                      exiting)
    return failure

  def _read(self) -> dict[int, str]:
    return {int(k[len(_KEY_PREFIX):]): v for k, v in self.client.key_value_dir_get(_KEY_PREFIX)
            if k[len(_KEY_PREFIX):].isdigit()}

  def _check_or_stop(self, exiting: bool) -> None:
    """`check_once`; ends the process (naming the peer and the phase) on a failure."""
    try:
      failure = self.check_once(exiting)
    except Exception as err:  # pylint: disable=broad-except  (any RPC failure)
      failure = ("process 0 (the coordinator) is unreachable: "
                 f"{str(err).splitlines()[0] if str(err) else type(err).__name__}")
    if failure is not None:
      _stop_process(failure)

  def _run(self) -> None:
    while not self._stop.wait(self.interval):
      with self._lock:
        if self._stop.is_set():
          return
        self._check_or_stop(exiting=False)

  def wait_for_peers_to_leave(self) -> None:
    """At exit: stops the thread, says this process is leaving, and waits until every
    peer has said so too (jax's shutdown barrier then passes at once) or one failed (then
    ends the process naming it, instead of waiting in that barrier for a dead peer). At
    most `timeout` seconds: a peer still running then is left to jax's shutdown barrier
    (which fails it after `distributed.timeout_s`)."""
    with self._lock:
      self._stop.set()
    deadline = time.monotonic() + self.timeout
    while time.monotonic() < deadline:
      self._check_or_stop(exiting=True)
      try:
        beats = [parse_heartbeat(t) for t in self._read().values()]
      except Exception:  # pylint: disable=broad-except  (the coordinator left first)
        return
      if sum(b is not None and b.state == _EXITED for b in beats) >= len(self.views) + 1:
        return
      time.sleep(self.interval)


def _stop_process(failure: str) -> None:
  """Logs `failure` with this process's phase as its error and ends it
  (`barriers.PEER_FAILURE_EXIT`)."""
  barriers.record_peer_failure(failure)
  message = f"{failure}; this process ({jax.process_index()}) was in phase '{current_phase()}'"
  try:
    logging.error("%s", message)
  except Exception:  # pylint: disable=broad-except  (logging may be shut down at exit)
    pass
  sys.stdout.flush()
  sys.stderr.flush()
  # Straight to the file descriptor: at interpreter exit Python's streams may be closed.
  os.write(2, (f"error: {message}; stopping (relaunch every process to resume from the last "
               "checkpoint)\n").encode())
  barriers.exit_now_after_peer_failure()


_running: list[Watchdog] = []


def start_watchdog(timeout: float) -> None:
  """Starts this process's watchdog once `jax.distributed` is up with P > 1 processes (a
  second call does nothing); at interpreter exit it says so to the peers and, after a
  peer failure, ends the process without jax's shutdown wait."""
  if _running or jax.process_count() == 1:
    return
  dog = Watchdog(barriers.coordination_client(), jax.process_index(), jax.process_count(), timeout)
  dog.start()
  _running.append(dog)
  atexit.register(_at_exit)


def _at_exit() -> None:
  if barriers.peer_failed():  # nothing to wait for: say what happened (perhaps on another
    failures = barriers.peer_failures()  # thread, unseen) and end
    _stop_process(failures[0] if failures else "a wait on another process failed")
  for dog in _running:
    dog.wait_for_peers_to_leave()
  barriers.exit_now_after_peer_failure()
