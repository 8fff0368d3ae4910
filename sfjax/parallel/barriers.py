"""Timed waits across processes: barriers and value exchanges that end with an error
naming the processes that did not arrive, instead of hanging (issue #24, Deliver 5).

They go through the coordination service of `jax.distributed` (its key-value store
and its barriers, which take a timeout), never through a device collective (whose
wait has no bound). Every process calls the same exchanges in the same order (like a
collective); each is bounded by `distributed.timeout_s` (`set_timeout`).

  exchange(name, value)   every process's string, in process order (also a barrier)
  barrier(name)           waits for every process

A wait that runs out raises `PeerFailureError`, e.g. "process 1 did not reach barrier
'checkpoint step 40: the commit' within 30 s"; once one was raised, the process exits
at once at interpreter exit (`exit_now_after_peer_failure`) instead of waiting in
jax's shutdown barrier for a peer that is gone.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import jax

from sfjax.core.errors import ConfigError

DEFAULT_TIMEOUT_S = 300.0
# Exit status of a process stopped by a peer's failure (EX_TEMPFAIL: relaunch to resume).
PEER_FAILURE_EXIT = 75
_KEY_PREFIX = "sfjax/exchange"

_settings: dict[str, Any] = {"timeout_s": DEFAULT_TIMEOUT_S, "sequence": 0,
                             "previous": ""}  # the previous exchange's key directory
_failures: list[str] = []  # what ended this process's cross-process waits


class PeerFailureError(RuntimeError):
  """Another process did not reach a cross-process wait in time (dead, hung or failed).

  Making one records its message (`peer_failures`): the run cannot go on, even when the
  error is raised on a background thread (the input's), and the exit path reports it.
  """

  def __init__(self, message: str):
    super().__init__(message)
    record_peer_failure(message)


def set_timeout(seconds: float) -> None:
  """Bounds every later wait of this module (`distributed.timeout_s`).

  Raises:
    ConfigError: naming `distributed.timeout_s`, for a value that is not > 0.
  """
  if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
    raise ConfigError(f"config field distributed.timeout_s: must be a number > 0, got {seconds!r}")
  _settings["timeout_s"] = float(seconds)


def timeout_s() -> float:
  """The bound of every cross-process wait, in seconds."""
  return _settings["timeout_s"]


def peer_failed() -> bool:
  """True once a wait of this process ended with `PeerFailureError` (or the watchdog saw a
  peer fail): the run cannot go on and the process should end."""
  return bool(_failures)


def peer_failures() -> list[str]:
  """The recorded failures' messages, oldest first."""
  return [m for m in _failures if m]


def record_peer_failure(message: str = "") -> None:
  """Marks this process as stopped by a peer (`peer_failed`), with what happened."""
  _failures.append(message)


def coordination_client():
  """The coordination service client of `jax.distributed` (started by `initialize`)."""
  from jax._src import distributed as jax_distributed  # no public accessor in jax 0.10

  client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError("jax.distributed is not initialized: no coordination service to wait on")
  return client


def _key_name(name: str) -> str:
  """`name` usable inside a key (the store's directories are '/'-separated)."""
  return name.replace("/", "|")


def describe_missing(missing: list[int], name: str, seconds: float) -> str:
  """'process 1 did not reach barrier NAME within T s' (or 'processes 1, 3 ...')."""
  who = ("process " if len(missing) == 1 else "processes ") + ", ".join(map(str, missing))
  return f"{who} did not reach barrier '{name}' within {seconds:g} s"


def missing_processes(published: list[str], prefix: str, count: int) -> list[int]:
  """The processes in [0, count) without a key `prefix<p>` among `published`."""
  present = set(published)
  return [p for p in range(count) if f"{prefix}{p}" not in present]


def _fail(message: str, err: BaseException | None = None) -> PeerFailureError:
  error = PeerFailureError(message)
  if err is not None:
    error.__cause__ = err
  return error


def exchange(name: str, value: str, seconds: float | None = None) -> list[str]:
  """Every process's `value`, in process order, once all have published theirs.

  Every process calls it with the same `name`, in the same order as its other waits.
  One process: `[value]`.

  Args:
    name: what is waited for, quoted in the error ("checkpoint step 40: the commit").
    value: this process's string.
    seconds: the bound (default `timeout_s()`).

  Raises:
    PeerFailureError: not every process published within the bound (naming those that
      did not), or the coordinator is unreachable.
  """
  count = jax.process_count()
  if count == 1:
    return [value]
  seconds = timeout_s() if seconds is None else seconds
  client, me = coordination_client(), jax.process_index()
  seq = _settings["sequence"] = _settings["sequence"] + 1
  directory = f"{_KEY_PREFIX}/{seq}:{_key_name(name)}/"
  try:
    client.key_value_set(directory + str(me), value)
  except Exception as err:  # pylint: disable=broad-except  (any RPC failure: the service is gone)
    raise _fail(f"process 0 (the coordinator) is unreachable at barrier '{name}': "
                f"{str(err).splitlines()[0]}", err) from err
  try:
    # The id holds the name: processes at different waits never meet (they time out).
    client.wait_at_barrier(directory.rstrip("/"), int(seconds * 1000))
    entries = dict(client.key_value_dir_get(directory))
  except Exception as err:  # pylint: disable=broad-except
    try:
      published = [k for k, _ in client.key_value_dir_get(directory)]
    except Exception:  # pylint: disable=broad-except
      raise _fail(f"process 0 (the coordinator) is unreachable at barrier '{name}': "
                  f"{str(err).splitlines()[0]}", err) from err
    missing = missing_processes(published, directory, count)
    detail = describe_missing(missing, name, seconds) if missing else (
        f"barrier '{name}' failed: {str(err).splitlines()[0]}")
    raise _fail(f"{detail} (this is process {me})", err) from err
  previous, _settings["previous"] = _settings["previous"], directory
  if previous:  # every process has read the previous exchange's values: drop them
    try:
      client.key_value_delete(previous.rstrip("/"))
    except Exception:  # pylint: disable=broad-except  (housekeeping only)
      pass
  return [entries[directory + str(p)] for p in range(count)]


def barrier(name: str, seconds: float | None = None) -> None:
  """Waits until every process reached barrier `name` (`exchange` of nothing).

  Raises:
    PeerFailureError: as `exchange`.
  """
  exchange(name, "", seconds)


def exit_now_after_peer_failure() -> None:
  """At interpreter exit: after a peer failure, ends the process at once with
  `PEER_FAILURE_EXIT` (jax's shutdown would wait for the lost peer at its own barrier)."""
  if peer_failed():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(PEER_FAILURE_EXIT)  # pylint: disable=protected-access
