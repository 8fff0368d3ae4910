"""Every process's host rows of one input batch, concatenated in process order.

A batch here is any tuple of numpy arrays (or None: absent) with a leading example
axis, e.g. `sfjax.data.types.Batch` (this layer does not import the data package).

With per-process input (issue #24) each process reads only its rows
`[p*B/P, (p+1)*B/P)` of global batch b; the host stages that follow (VSI, the cache
planner) need the whole batch's ids, the same on every process. `gather_batch` sends
this process's rows to the others and returns the global batch.

The exchange goes through the coordination service's key-value store (`barriers`'s
client), keyed by the batch number, never through a device collective: it runs on the
data thread while the main thread's steps run collectives of their own, and a keyed
store cannot interleave with them. A process publishes batch b, then reads every
other's b; so when it publishes b every process has read b-2 of everyone, and it then
drops its own b-2 (the store holds at most three batches per process). A peer that
does not publish within `distributed.timeout_s` ends the wait with `PeerFailureError`
naming it.
"""

from __future__ import annotations

import io
from typing import TypeVar

import jax
import numpy as np

from sfjax.parallel import barriers

RowsT = TypeVar("RowsT", bound=tuple)

_KEY_PREFIX = "sfjax/input"
_streams = {"count": 0}  # streams begun by this process (the same sequence on every process)


def rows_to_bytes(rows: tuple) -> bytes:
  """A tuple of arrays as bytes (`.npz`, entry i named `a<i>`; None entries left out)."""
  out = io.BytesIO()
  np.savez(out, **{f"a{i}": v for i, v in enumerate(rows) if v is not None})
  return out.getvalue()


def rows_from_bytes(data: bytes, like: RowsT) -> RowsT:
  """`rows_to_bytes`'s inverse, as a tuple of `like`'s type and length."""
  with np.load(io.BytesIO(data)) as arrays:
    values = [arrays[f"a{i}"] if f"a{i}" in arrays.files else None for i in range(len(like))]
  return _like(like, values)


def _like(like: RowsT, values: list) -> RowsT:
  return type(like)(*values) if hasattr(like, "_fields") else type(like)(values)


def _key(stream: int, number: int, process: int) -> str:
  return f"{_KEY_PREFIX}/{stream}/{number}/{process}"


def begin_stream() -> int:
  """A new stream of batches (a training run's input): its id, the same on every process
  (each begins its streams in the same order). The previous stream's keys are dropped:
  every process has read what it needed of them (their last step's collective ran)."""
  _streams["count"] += 1
  stream = _streams["count"]
  if jax.process_count() > 1 and stream > 1:
    try:
      barriers.coordination_client().key_value_delete(f"{_KEY_PREFIX}/{stream - 1}")
    except Exception:  # pylint: disable=broad-except  (housekeeping only)
      pass
  return stream


def gather_batch(number: int, local: RowsT, seconds: float | None = None,
                 stream: int = 0) -> RowsT:
  """Global batch `number`: every process's `local` rows, in process order.

  Every process calls it for the same batch numbers in increasing order. One process:
  `local`.

  Args:
    number: the batch's number in the training stream (a key: never reused in a run).
    local: this process's rows of the batch (a tuple of arrays [n_p, ...] or None).
    seconds: the bound of the wait (default `distributed.timeout_s`).
    stream: the stream's id (`begin_stream`).

  Raises:
    barriers.PeerFailureError: a process did not publish its rows in time.
  """
  count, me = jax.process_count(), jax.process_index()
  if count == 1:
    return local
  seconds = barriers.timeout_s() if seconds is None else seconds
  client = barriers.coordination_client()
  client.key_value_set_bytes(_key(stream, number, me), rows_to_bytes(local))
  parts = []
  for p in range(count):
    if p == me:
      parts.append(local)
      continue
    try:
      parts.append(rows_from_bytes(client.blocking_key_value_get_bytes(
          _key(stream, number, p), int(seconds * 1000)), local))
    except Exception as err:  # pylint: disable=broad-except  (timeout or a lost coordinator)
      barriers.record_peer_failure()
      raise barriers.PeerFailureError(
          f"process {p} did not publish its rows of input batch {number} within {seconds:g} s "
          f"(this is process {me}): {str(err).splitlines()[0]}") from err
  if number >= 2:
    try:
      client.key_value_delete(_key(stream, number - 2, me))
    except Exception:  # pylint: disable=broad-except  (housekeeping only)
      pass
  return _like(local, [None if local[i] is None else np.concatenate([b[i] for b in parts])
                      for i in range(len(local))])
