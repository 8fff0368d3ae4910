"""The run's files: `config.json`, `metrics.jsonl` (one JSON object per eval) and TensorBoard
event files beside them (every number of each eval record, plus each step's train loss
as `train/loss`; `tensorboard --logdir=WORKDIR`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from sfjax.core.atomic import atomic_write
from sfjax.core.jsonl import read_jsonl
from sfjax.core.tensorboard import EventWriter

_read_records = read_jsonl  # a run's metrics.jsonl records ([] if absent; torn lines skipped)


class MetricsWriter:
  """Writes a run's config once and appends one line per eval record.

  With `workdir=None` nothing is written (a notebook run). Use as a context
  manager or call `close()`.
  """

  def __init__(self, workdir: str | None, config=None, resume_step: int | None = None):
    """Creates `workdir`, writes `config.json` (if `config`) and starts `metrics.jsonl`.

    With `resume_step` (a run resumed from the checkpoint of that step) the existing
    `metrics.jsonl` keeps its records with `step <= resume_step` (later ones, and a torn
    last line, were written after the checkpoint and will be written again) and new
    records are appended; otherwise it starts empty.
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
    if config is not None:
      atomic_write(os.path.join(workdir, "config.json"), config.to_json_best_effort(indent=2))
    path = os.path.join(workdir, "metrics.jsonl")
    if resume_step is None:
      self._file = open(path, "w", encoding="utf-8")
      return
    kept = [json.dumps(r) + "\n" for r in _read_records(path) if r.get("step", 0) <= resume_step]
    atomic_write(path, "".join(kept))
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
