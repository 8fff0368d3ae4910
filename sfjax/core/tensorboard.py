"""TensorBoard event files beside a run's JSON records (through tensorboardX).

`tensorboard --logdir=WORKDIR` then shows the trainer's and the search's curves live.
tensorboardX is the writer because it needs only protobuf (already required by
orbax), not TensorFlow; clu's writers wrap TensorFlow's summary ops.

Only finite real numbers are written; other values (strings, lists, None, NaN) are
skipped, so a JSON record can be passed as it is.
"""

from __future__ import annotations

import glob
import math
import numbers
import os
import struct
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

EVENT_FILE_PREFIX = "events.out.tfevents."


def _scalar_items(record: Mapping[str, Any], prefix: str = "") -> list[tuple[str, float]]:
  """The finite real-number fields of `record` as (tag, value), nested dicts flattened with '/'.

  Booleans are left out (they are flags, not curves).
  """
  out = []
  for key, value in record.items():
    tag = f"{prefix}{key}"
    if isinstance(value, Mapping):
      out.extend(_scalar_items(value, tag + "/"))
    elif isinstance(value, (numbers.Real, np.floating, np.integer)) and not isinstance(
        value, (bool, np.bool_)) and math.isfinite(float(value)):
      out.append((tag, float(value)))
  return out


class EventWriter:
  """Appends scalars to TensorBoard event files in `logdir`.

  Args:
    logdir: the directory of the event files (created).
    purge_step: when resuming, the first step written again: TensorBoard hides the
      older files' events at and after it, so a resumed curve has no duplicates.
    fresh: remove the event files already in `logdir` first (a run that starts over
      replaces the old curves).
  """

  def __init__(self, logdir: str, purge_step: int | None = None, fresh: bool = False):
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    if fresh and os.path.isdir(logdir):
      for name in os.listdir(logdir):
        if name.startswith(EVENT_FILE_PREFIX):
          os.remove(os.path.join(logdir, name))
    self.logdir = logdir
    # A unique suffix: tensorboardX names files by the second, and a second writer in the
    # same second (a quick resume) would truncate the first one's file.
    self._writer = SummaryWriter(logdir=logdir, purge_step=purge_step, flush_secs=10,
                                 filename_suffix=f".{os.getpid()}.{time.time_ns()}")

  def scalars(self, step: int, record: Mapping[str, Any], prefix: str = "",
              skip: tuple[str, ...] = ("step",)) -> int:
    """Writes every finite number of `record` (but `skip`) at `step`; returns how many."""
    items = [(t, v) for t, v in _scalar_items(record, prefix) if t[len(prefix):] not in skip]
    for tag, value in items:
      self._writer.add_scalar(tag, value, global_step=int(step))
    return len(items)

  def series(self, tag: str, first_step: int, values) -> None:
    """Writes `values[i]` at step `first_step + i` (non-finite values skipped)."""
    for i, value in enumerate(np.asarray(values, np.float64).reshape(-1)):
      if math.isfinite(value):
        self._writer.add_scalar(tag, float(value), global_step=int(first_step) + i)

  def flush(self) -> None:
    """Writes buffered events to disk."""
    self._writer.flush()

  def close(self) -> None:
    """Flushes and closes the event file."""
    self._writer.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """Every scalar in the event files of `logdir`: tag -> [(step, value), ...].

  For tests and notebooks; parses the TFRecord framing with tensorboardX's protobufs
  (no TensorFlow). Files are read oldest first, and a file that starts with a purge
  (`EventWriter(purge_step=s)`) drops the earlier files' values at steps >= s, as
  TensorBoard shows them.
  """
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  files = []
  for path in glob.glob(os.path.join(logdir, EVENT_FILE_PREFIX + "*")):
    with open(path, "rb") as f:
      data = f.read()
    events, pos = [], 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      body = data[pos + 12:pos + 12 + length]
      pos += 12 + length + 4
      if len(body) < length:
        break  # a torn last record
      event = event_pb2.Event()
      event.ParseFromString(body)
      events.append(event)
    files.append((events[0].wall_time if events else 0.0, path, events))
  out: dict[str, list[tuple[int, float]]] = {}
  for _, _, events in sorted(files, key=lambda f: f[:2]):
    for event in events:
      if event.HasField("session_log") and event.session_log.status == event.session_log.START:
        for tag in out:
          out[tag] = [(s, v) for s, v in out[tag] if s < event.step]
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
  return out
