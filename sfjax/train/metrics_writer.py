"""The run's files: `config.json`, `metrics.jsonl` (one JSON object per eval) and TensorBoard
event files beside them (every number of each eval record, plus each step's train loss
as `train/loss`; `tensorboard --logdir=WORKDIR`).

`config.json` is written once and never overwritten here (`resume_check.record_config`
records later changes). On resume `metrics.jsonl` is kept and appended to, never
replaced: it is cut in place after the checkpoint's last record (later records are
written again by the resumed steps), and a partial last line left by a crash is cut
off with a log line (issue #25, item 1).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from absl import logging

from sfjax.core.jsonl import read_jsonl
from sfjax.core.tensorboard import EventWriter

_read_records = read_jsonl  # a run's metrics.jsonl records ([] if absent; torn lines skipped)


def cut_after_step(path: str, step: int) -> None:
  """Cuts `metrics.jsonl` in place after its last complete record with `step <= step`.

  The file is truncated, never rewritten (the same file, so nothing written to it is
  lost to a replace). A partial last line (a crash mid-write) and the records after
  `step` (written after the checkpoint) go, each with a log line.
  """
  if not os.path.exists(path):
    return
  with open(path, "rb") as f:
    data = f.read()
  keep, dropped, offset = 0, 0, 0
  for line in data.splitlines(keepends=True):
    offset += len(line)
    if not line.endswith(b"\n"):
      logging.warning("%s: a partial last line (%d bytes, a crash mid-write) is cut off",
                      path, len(line))
      break
    try:
      record = json.loads(line)
    except ValueError:
      record = None
    if isinstance(record, dict) and record.get("step", 0) > step:
      dropped += 1
      continue
    if dropped == 0:
      keep = offset
  if dropped:
    logging.info("%s: %d records after step %d are cut (the resumed steps write them again)",
                 path, dropped, step)
  if keep < len(data):
    with open(path, "r+b") as f:
      f.truncate(keep)
      f.flush()
      os.fsync(f.fileno())


class MetricsWriter:
  """Writes a run's config once and appends one line per eval record.

  With `workdir=None` nothing is written (a notebook run). Use as a context
  manager or call `close()`.
  """

  def __init__(self, workdir: str | None, config=None, resume_step: int | None = None):
    """Creates `workdir`, writes `config.json` (if `config` and none exists yet) and starts
    `metrics.jsonl`.

    With `resume_step` (a run resumed from the checkpoint of that step) the existing
    `metrics.jsonl` keeps its records up to the last with `step <= resume_step` (later
    ones, and a torn last line, were written after the checkpoint and will be written
    again; `cut_after_step`) and new records are appended; otherwise it starts empty.
    """
    self.workdir = workdir
    self._file = None
    self._events: EventWriter | None = None
    if not workdir:
      return
    os.makedirs(workdir, exist_ok=True)
    # A fresh run replaces the old run's curves, as it does its metrics.jsonl.
    self._events = EventWriter(workdir, purge_step=None if resume_step is None else resume_step + 1,
                               fresh=resume_step is None)
    config_path = os.path.join(workdir, "config.json")
    if config is not None and not os.path.exists(config_path):
      with open(config_path, "x", encoding="utf-8") as f:
        f.write(config.to_json_best_effort(indent=2))
    path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is None:
      self._file = open(path, "w", encoding="utf-8")
      return
    cut_after_step(path, resume_step)
    self._file = open(path, "a", encoding="utf-8")

  def write(self, record: Mapping[str, Any]) -> None:
    """Appends `record` as one line, flushed, and its numbers as TensorBoard scalars at
    `record["step"]`."""
    if self._file is not None:
      self._file.write(json.dumps(dict(record)) + "\n")
      self._file.flush()
    if self._events is not None and "step" in record:
      self._events.scalars(int(record["step"]), record, prefix="eval/")
      self._events.flush()

  def write_losses(self, first_step: int, losses) -> None:
    """TensorBoard `train/loss` for steps `first_step, first_step + 1, ...` ([T] floats)."""
    if self._events is not None:
      self._events.series("train/loss", first_step, losses)

  def close(self) -> None:
    """Closes `metrics.jsonl` and the event file."""
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._events is not None:
      self._events.close()
      self._events = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
